"""The quota editor grants data roots (one directory per line), through the same service as the API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from strata.quotas.models import Quota


def logged_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password="pw-" + user.username)
    return client


def form(html: str, slug: str) -> str:
    return re.search(rf'<form [^>]*data-team="{slug}"[^>]*>(.*?)</form>', html, re.S).group(1)


FIELDS = {"max_gpus": "", "max_gpu_memory": "", "max_cpus": "", "max_memory": "", "max_concurrent_jobs": "",
          "gpu_hours": "", "window_hours": "168", "priority": "0", "weight": "1"}


@pytest.fixture
def admin(make_team, make_user):
    make_team("demo", data_roots=["/srv/demo"])
    make_team("other")
    return logged_in(make_user("root", admin=True))


def test_the_editor_shows_and_grants_each_teams_roots(admin):
    html = admin.get("/manage/quotas/").content.decode()
    assert re.search(r'<textarea [^>]*name="data_roots"[^>]*>/srv/demo</textarea>', form(html, "demo"))
    assert re.search(r'<textarea [^>]*name="data_roots"[^>]*></textarea>', form(html, "other"))
    response = admin.post("/manage/quotas/", {"team": "demo", **FIELDS, "data_roots": "/srv/a\r\n/srv/b/\n\n"})
    assert response.status_code == 302, response.content[:500]
    assert Quota.objects.get(team__slug="demo").data_roots == ["/srv/a", "/srv/b"]
    # A form without the field (an older page) leaves the roots alone; an empty field revokes them.
    admin.post("/manage/quotas/", {"team": "demo", **FIELDS, "max_gpus": "2"})
    assert Quota.objects.get(team__slug="demo").data_roots == ["/srv/a", "/srv/b"]
    admin.post("/manage/quotas/", {"team": "demo", **FIELDS, "data_roots": ""})
    assert Quota.objects.get(team__slug="demo").data_roots == []


@pytest.mark.parametrize("value", ["relative/path", "/srv/../etc", "STATE"])
def test_bad_roots_are_named_and_change_nothing(admin, value):
    value = str(Path(settings.HOME) / "data") if value == "STATE" else value
    response = admin.post("/manage/quotas/", {"team": "demo", **FIELDS, "max_gpus": "3", "data_roots": value})
    assert response.status_code == 400
    demo = form(response.content.decode(), "demo")
    assert 'class="field-error" data-field="data_roots"' in demo
    assert f">{value}</textarea>" in demo  # what the admin typed is kept for correction
    quota = Quota.objects.get(team__slug="demo")
    assert quota.data_roots == ["/srv/demo"] and quota.max_gpus is None


def test_members_cannot_grant_roots(make_team, make_user):
    team = make_team("demo")
    member = logged_in(make_user("alice", team, role="team-admin"))
    assert member.post("/manage/quotas/", {"team": "demo", **FIELDS, "data_roots": "/"}).status_code == 403
    assert Quota.objects.get(team=team).data_roots == []


def test_members_see_their_teams_roots_on_the_usage_page(make_team, make_user):
    team = make_team("demo", data_roots=["/srv/demo", "/srv/shared"])
    html = logged_in(make_user("alice", team)).get("/usage/?team=demo").content.decode()
    shown = re.search(r"<dd data-roots>(.*?)</dd>", html, re.S).group(1)
    assert "<code>/srv/demo</code>" in shown and "<code>/srv/shared</code>" in shown
    other = make_team("other")
    html = logged_in(make_user("bob", other)).get("/usage/?team=other").content.decode()
    assert "none: no data may be registered by path" in html and "/srv/demo" not in html
