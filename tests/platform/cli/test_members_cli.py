"""``strata members list|add|set-role|remove|limit``: over the real API views (a test client stands in for HTTP);
a refusal is one line naming the role needed."""

from __future__ import annotations

import pytest

from components.runtime.client.client import ApiError
from strata.accounts.models import Membership
from strata.cli.main import main


class Adapter:
    """The CLI's REST client's calls, answered by the Django test client (errors as the real client words them)."""

    def __init__(self, api):
        self.api = api

    def request(self, method, path, *, json=None, params=None, **_kwargs):
        from components.runtime.client.client import _describe

        url = f"/api/v1/{path}"
        if method in ("POST", "PATCH"):
            response = getattr(self.api, method.lower())(url, json, format="json")
        elif method == "DELETE":
            response = self.api.delete(url)
        else:
            response = self.api.get(url, params or {})
        if response.status_code >= 400:
            response.text = response.content.decode()
            message, payload = _describe(response)
            raise ApiError(response.status_code, message, payload)
        return None if response.status_code == 204 else response.json()

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, json=None, **kwargs):
        return self.request("POST", path, json=json, **kwargs)

    def delete(self, path, **kwargs):
        return self.request("DELETE", path, **kwargs)


@pytest.fixture
def cli(make_team, make_user, make_token, api, monkeypatch):
    team = make_team("alpha", max_gpus=4.0)
    make_user("newbie")
    clients = {"ada": Adapter(api(make_token(make_user("ada", team, "team-admin"), team))),
               "vera": Adapter(api(make_token(make_user("vera", team, "viewer"), team)))}
    current = {"as": "ada"}
    monkeypatch.setattr("strata.cli.client_commands.connect", lambda args: clients[current["as"]])

    def run(*argv, user: str = "ada"):
        current["as"] = user
        return main(list(argv))

    return run


def test_list_add_set_role_limit_remove(cli, capsys):
    assert cli("members", "add", "newbie", "--role", "viewer") == 0
    assert "added newbie to alpha as viewer" in capsys.readouterr().out
    assert cli("members", "set-role", "newbie", "member") == 0
    assert Membership.objects.get(user__username="newbie").role == "member"
    assert cli("members", "limit", "newbie", "--max-gpus", "2", "--max-concurrent-jobs", "3") == 0
    membership = Membership.objects.get(user__username="newbie")
    assert (membership.max_gpus, membership.max_concurrent_jobs) == (2.0, 3)
    capsys.readouterr()
    assert cli("members", "list", user="vera") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["USER", "ROLE", "MAX", "JOBS", "MAX", "GPUS"]
    assert lines[2].split() == ["newbie", "member", "3", "2"]
    assert cli("members", "limit", "newbie", "--max-gpus", "none") == 0
    assert Membership.objects.get(user__username="newbie").max_gpus is None
    assert cli("members", "remove", "newbie") == 0
    assert not Membership.objects.filter(user__username="newbie").exists()


def test_refusals_are_one_line(cli, capsys):
    assert cli("members", "add", "newbie", user="vera") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "team-admin role in team alpha is needed" in err
    assert cli("members", "limit", "vera", "--max-gpus", "9") == 1
    assert "team's quota" in capsys.readouterr().err
    assert cli("members", "limit", "vera", "--max-gpus", "lots") == 2
    assert cli("members", "limit", "vera") == 2  # nothing to set
