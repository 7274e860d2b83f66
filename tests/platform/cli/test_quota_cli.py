"""``strata quota``: data roots shown and granted (``--set data_roots=...``) through the real API views, and the
roots ``strata up`` grants its team."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from components.runtime.client.client import ApiError
from strata.cli import client_commands
from strata.cli.server_commands import grant_local_data_roots
from strata.quotas.models import Quota


class ApiClientAdapter:
    """The CLI's REST client's calls, answered by the Django test client."""

    def __init__(self, api):
        self.api = api

    def request(self, method, path, *, json=None, params=None, **_kwargs):
        url = f"/api/v1/{path}"
        if method == "PATCH":
            response = self.api.patch(url, json, format="json")
        else:
            response = self.api.get(url, params or {})
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.content.decode()[:300])
        return response.json()

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)


@pytest.fixture
def cli(make_team, make_user, make_token, api, monkeypatch):
    team = make_team("alpha")
    admin = ApiClientAdapter(api(make_token(make_user("root", team, admin=True), team)))
    member = ApiClientAdapter(api(make_token(make_user("alice", team), team)))
    callers = {"admin": admin, "member": member}

    def run(caller: str, *sets: str) -> None:
        monkeypatch.setattr(client_commands, "connect", lambda args: callers[caller])
        client_commands.quota(argparse.Namespace(team="alpha", set=list(sets) or None))

    return run, team


@pytest.mark.parametrize("value,roots", [("/srv/a,/srv/b/", ["/srv/a", "/srv/b"]), ("[/srv/a, /data]", ["/srv/a", "/data"]),
                                         ("/srv/a", ["/srv/a"]), ("none", []), ("", [])])
def test_admins_grant_data_roots_and_everyone_sees_them(cli, capsys, value, roots):
    run, team = cli
    Quota.objects.filter(team=team).update(data_roots=["/old"])
    run("admin", f"data_roots={value}")
    assert Quota.objects.get(team=team).data_roots == roots
    run("member")
    shown = capsys.readouterr().out
    assert (", ".join(roots) if roots else "none (no data may be registered by path)") in shown


def test_bad_roots_and_members_are_refused(cli):
    run, team = cli
    with pytest.raises(ApiError) as bad:
        run("admin", "data_roots=relative/path")
    assert bad.value.status == 400 and "data_roots" in str(bad.value)
    with pytest.raises(ApiError) as member:
        run("member", "data_roots=/srv")
    assert member.value.status == 403
    assert Quota.objects.get(team=team).data_roots == []


def test_strata_up_grants_its_team_defaults_once_and_data_root_replaces_them(make_team, tmp_path):
    team = make_team("demo")
    defaults = [str(Path.home()), tempfile.gettempdir()]
    assert grant_local_data_roots("demo", None) == defaults
    Quota.objects.filter(team=team).update(data_roots=["/srv/chosen"])
    assert grant_local_data_roots("demo", None) == ["/srv/chosen"]  # an admin's choice stays
    assert grant_local_data_roots("demo", [str(tmp_path), str(tmp_path)]) == [str(tmp_path)]
    assert Quota.objects.get(team=team).data_roots == [str(tmp_path)]
    with pytest.raises(RuntimeError, match="--data-root"):
        grant_local_data_roots("demo", [str(Path(settings.HOME) / "inside")])
    assert grant_local_data_roots("nobody", None) == []
