"""Team usage against quotas, the queue with reasons, and the admins' quota editor."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from strata.jobs.models import Attempt, Job, JobState, Participant
from strata.quotas.models import Quota

GIB = 2**30


def logged_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password="pw-" + user.username)
    return client


def embedded(html: str, script_id: str) -> dict:
    match = re.search(rf'<script type="application/json" id="{script_id}">(.*?)</script>', html, re.S)
    assert match, f"no embedded JSON {script_id}"
    return json.loads(match.group(1))


def meter(html: str, field: str) -> dict:
    match = re.search(rf'data-meter="{field}" data-used="([^"]*)" data-limit="([^"]*)"', html)
    assert match, f"no meter {field}"
    return {"used": match.group(1), "limit": match.group(2)}


def queue_row(html: str, job) -> str:
    match = re.search(rf'<tr data-job-id="{job.pk}"[^>]*>(.*?)</tr>', html, re.S)
    assert match, f"job {job.name} is not in the queue"
    return match.group(1)


def state(job) -> str:
    return Job.objects.get(pk=job.pk).state


@pytest.fixture
def demo(make_team, make_user, submit):
    team = make_team("demo", max_gpus=1.0, max_concurrent_jobs=5)
    other = make_team("other")
    alice = make_user("alice", team)
    first = submit(alice, team, gpus=1.0, name="holds-the-gpu")
    blocked = submit(alice, team, gpus=1.0, name="blocked-by-quota")
    return {"team": team, "other": other, "alice": alice, "first": first, "blocked": blocked}


# --- usage page ---------------------------------------------------------------------------------------------

def test_usage_requires_login(client):
    assert client.get("/usage/")["Location"].startswith("/login/")


def test_foreign_team_is_404(demo, make_user):
    client = logged_in(demo["alice"])
    assert client.get("/usage/", {"team": "other"}).status_code == 404
    assert client.get("/usage/", {"team": "no-such-team"}).status_code == 404
    assert client.get("/usage/", {"team": "demo"}).status_code == 200
    # Staff see every team.
    root = logged_in(make_user("root", admin=True))
    assert root.get("/usage/", {"team": "other"}).status_code == 200


def test_meters_reflect_team_usage(demo):
    Quota.objects.filter(team=demo["team"]).update(max_gpu_memory=32 * GIB, gpu_hours=10)
    job = demo["first"]
    Attempt.objects.create(job=job, number=1, fencing_token="t", gpu_share=1.0,
                           dispatched_at=timezone.now() - timedelta(hours=2), ended_at=timezone.now() - timedelta(hours=1))
    response = logged_in(demo["alice"]).get("/usage/")  # the default: the viewer's first team
    assert response.status_code == 200
    html = response.content.decode()
    assert '<span id="team-name">demo</span>' in html
    assert meter(html, "max_gpus") == {"used": "1.0", "limit": "1.0"}
    assert meter(html, "max_concurrent_jobs") == {"used": "1", "limit": "5"}
    assert meter(html, "max_gpu_memory")["limit"] == str(32 * GIB)
    assert float(meter(html, "gpu_hours")["used"]) == pytest.approx(1.0, abs=1e-3)
    assert 'data-meter="max_gpus" data-used="1.0" data-limit="1.0"' in html and "usage-meter full" in html
    # A null limit is unlimited.
    Quota.objects.filter(team=demo["team"]).update(max_gpus=None)
    html = logged_in(demo["alice"]).get("/usage/").content.decode()
    assert meter(html, "max_gpus")["limit"] == "unlimited"


def test_queue_shows_why_jobs_wait(demo, make_node, run_pass, submit):
    html = logged_in(demo["alice"]).get("/usage/").content.decode()
    assert 'id="queue"' in html
    blocked = queue_row(html, demo["blocked"])
    assert "PENDING" in blocked
    reason = re.search(r'<td class="reason">(.*?)</td>', blocked, re.S).group(1)
    assert reason.startswith("waiting: team at max_gpus")
    queued = queue_row(html, demo["first"])
    assert "QUEUED" in queued and "waiting for free devices" in queued
    # Positions: the queued job is served before the pending one.
    positions = re.findall(r'<td class="position">(\d+)</td>', html)
    assert positions == ["1", "2"]
    # Once placed, it shows as scheduled with no position; finished jobs leave the queue.
    make_node("n1", gpus=1)
    run_pass()
    html = logged_in(demo["alice"]).get("/usage/").content.decode()
    assert "SCHEDULED" in queue_row(html, demo["first"])
    Job.objects.filter(pk=demo["first"].pk).update(state=JobState.SUCCEEDED)
    html = logged_in(demo["alice"]).get("/usage/").content.decode()
    assert f'data-job-id="{demo["first"].pk}"' not in html


def test_usage_chart_steps_with_attempts(demo):
    now = timezone.now()
    job = demo["first"]
    Attempt.objects.create(job=job, number=1, fencing_token="a", gpu_share=0.5,
                           dispatched_at=now - timedelta(hours=5), ended_at=now - timedelta(hours=3))
    Attempt.objects.create(job=job, number=2, fencing_token="b", gpu_share=1.0, dispatched_at=now - timedelta(hours=2))
    client = logged_in(demo["alice"])
    html = client.get("/usage/", {"range": "24h"}).content.decode()
    figure = embedded(html, "fig-usage")
    peak, mean, limit = figure["data"]
    assert len(peak["y"]) <= 240 and "x0" in peak and peak["dx"] > 0
    assert max(peak["y"]) == 1.0 and 0.5 in peak["y"] and peak["y"][0] == 0.0
    assert limit["line"]["dash"] == "dash" and limit["y"] == [1.0, 1.0]
    bars = embedded(html, "fig-gpu-hours")["data"][0]["y"]
    assert sum(bars) == pytest.approx(0.5 * 2 + 1.0 * 2, abs=0.05)
    assert client.get("/usage/", {"range": "forever"}).status_code == 400


def test_gpu_hours_chart_and_meter_agree_with_participants(demo):
    """The GPU-hours chart counts what the meter beside it (and the quota) counts: the team's attempts and the GPUs
    its participants brought (quotas.selectors.gpu_spans)."""
    Quota.objects.filter(team=demo["team"]).update(gpu_hours=100, window_hours=24)
    now = timezone.now()
    job = demo["first"]
    Attempt.objects.create(job=job, number=1, fencing_token="a", gpu_share=1.0,
                           dispatched_at=now - timedelta(hours=3), ended_at=now - timedelta(hours=1))
    Participant.objects.create(job=job, name="volunteer", gpus=2.0, secret_digest="a" * 64, state="left",
                               joined_at=now - timedelta(hours=3), last_seen=now - timedelta(hours=1),
                               ended_at=now - timedelta(hours=1))
    html = logged_in(demo["alice"]).get("/usage/", {"range": "24h"}).content.decode()
    used = float(meter(html, "gpu_hours")["used"])
    assert used == pytest.approx(1.0 * 2 + 2.0 * 2, abs=1e-3)
    bars = embedded(html, "fig-gpu-hours")["data"][0]["y"]
    assert sum(bars) == pytest.approx(used, abs=0.05)
    peak = embedded(html, "fig-usage")["data"][0]["y"]
    assert max(peak) == 3.0  # the attempt's GPU and the participant's two, held together


def test_no_team_is_an_empty_state(make_user):
    html = logged_in(make_user("loner")).get("/usage/").content.decode()
    assert "not a member of any team" in html


# --- quota editor -------------------------------------------------------------------------------------------

def form_data(**overrides) -> dict:
    data = {"team": "demo", "max_gpus": "1", "max_gpu_memory": "", "max_concurrent_jobs": "5", "gpu_hours": "",
            "window_hours": "168", "priority": "0", "weight": "1"}
    data.update(overrides)
    return data


def test_editor_is_for_cluster_admins_only(demo, make_user, client):
    anonymous = client.get("/manage/quotas/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    assert client.post("/manage/quotas/", form_data(max_gpus="8"))["Location"].startswith("/login/")
    team_admin = make_user("boss", demo["team"], role="team-admin")
    for user in (demo["alice"], team_admin):
        member = logged_in(user)
        assert member.get("/manage/quotas/").status_code == 403
        assert member.post("/manage/quotas/", form_data(max_gpus="8")).status_code == 403
    assert Quota.objects.get(team=demo["team"]).max_gpus == 1.0
    assert "Quotas</a>" not in logged_in(demo["alice"]).get("/usage/").content.decode()


def test_editor_lists_every_team_with_a_form(demo, make_user):
    html = logged_in(make_user("root", admin=True)).get("/manage/quotas/").content.decode()
    for slug in ("demo", "other"):
        form = re.search(rf'<form [^>]*data-team="{slug}"[^>]*>(.*?)</form>', html, re.S).group(1)
        for name in ("max_gpus", "max_gpu_memory", "max_concurrent_jobs", "gpu_hours", "window_hours", "priority",
                     "weight"):
            assert f'name="{name}"' in form
        assert f'data-save="{slug}"' in form
    demo_form = re.search(r'<form [^>]*data-team="demo"[^>]*>(.*?)</form>', html, re.S).group(1)
    assert 'name="max_gpus" value="1"' in demo_form
    assert re.search(r'data-count="pending"><b>1</b>', demo_form)
    assert re.search(r'data-count="queued"><b>1</b>', demo_form)


def test_raising_max_gpus_admits_the_pending_job(demo, make_user, make_node, run_pass,
                                                 django_capture_on_commit_callbacks):
    make_node("n1", gpus=2)
    run_pass()
    assert state(demo["first"]) == JobState.SCHEDULED
    assert state(demo["blocked"]) == JobState.PENDING
    admin = logged_in(make_user("root", admin=True))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = admin.post("/manage/quotas/", form_data(max_gpus="2", max_gpu_memory="16GiB"), follow=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Quota of demo saved: 1 pending job admitted" in html
    quota = Quota.objects.get(team=demo["team"])
    assert (quota.max_gpus, quota.max_gpu_memory) == (2.0, 16 * GIB)
    # The page shows the effect on the queue: admitted (queued) at once, nothing pending any more.
    demo_form = re.search(r'<form [^>]*data-team="demo"[^>]*>(.*?)</form>', html, re.S).group(1)
    assert re.search(r'data-count="pending"><b>0</b>', demo_form)
    assert re.search(r'data-count="queued"><b>1</b>', demo_form)
    assert 'name="max_gpu_memory" value="16GiB"' in demo_form
    # ...and the scheduling pass requested on commit (inline in tests) places it.
    assert callbacks, "a scheduling pass is requested on commit"
    assert state(demo["blocked"]) == JobState.SCHEDULED


def test_admission_without_a_pass(demo, make_user):
    admin = logged_in(make_user("root", admin=True))
    response = admin.post("/manage/quotas/", form_data(max_gpus="2"))
    assert response.status_code == 302 and response["Location"].endswith("#team-demo")
    assert state(demo["blocked"]) == JobState.QUEUED
    assert Job.objects.get(pk=demo["blocked"].pk).reason == "admitted under quota"


@pytest.mark.parametrize("field,value", [("max_gpus", "-1"), ("max_gpus", "abc"), ("max_gpu_memory", "lots"),
                                         ("max_concurrent_jobs", "2.5"), ("weight", "0"), ("window_hours", "")])
def test_invalid_values_show_field_errors_and_change_nothing(demo, make_user, field, value):
    admin = logged_in(make_user("root", admin=True))
    before = Quota.objects.filter(team=demo["team"]).values().get()
    response = admin.post("/manage/quotas/", form_data(**{field: value, "priority": "7"}))
    assert response.status_code == 400
    html = response.content.decode()
    demo_form = re.search(r'<form [^>]*data-team="demo"[^>]*>(.*?)</form>', html, re.S).group(1)
    assert f'class="field-error" data-field="{field}"' in demo_form
    assert f'name="{field}" value="{value}"' in demo_form  # what the admin typed is kept for correction
    assert "not saved" in html
    assert Quota.objects.filter(team=demo["team"]).values().get() == before
    assert state(demo["blocked"]) == JobState.PENDING


def test_blank_means_unlimited(demo, make_user):
    admin = logged_in(make_user("root", admin=True))
    admin.post("/manage/quotas/", form_data(max_gpus="", max_concurrent_jobs=""))
    quota = Quota.objects.get(team=demo["team"])
    assert quota.max_gpus is None and quota.max_concurrent_jobs is None
    assert state(demo["blocked"]) == JobState.QUEUED


def test_api_and_editor_share_the_service(demo, make_user, make_token, api):
    root = make_user("root", admin=True)
    client = api(make_token(root, demo["team"]))
    response = client.patch("/api/v1/quotas/demo/", {"max_gpus": 2}, format="json")
    assert response.status_code == 200 and response.json()["max_gpus"] == 2.0
    # The API admits at once too, like the editor.
    assert state(demo["blocked"]) == JobState.QUEUED
    bad = client.patch("/api/v1/quotas/demo/", {"max_gpu_memory": -5, "priority": 101}, format="json")
    assert bad.status_code == 400 and {"max_gpu_memory", "priority"} <= set(bad.json())
