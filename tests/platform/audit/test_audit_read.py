"""Reading the audit log: GET /api/v1/audit/ (filters, pages, who reads what), the CSV export, the dashboard's
Audit log page and ``strata audit``."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from strata.audit.models import AuditEntry
from strata.audit.retention import entries_delete
from strata.audit.services import record


@pytest.fixture
def world(make_team, make_user, make_token):
    """Two teams with entries of each, one entry of none (a login), and one caller of every kind."""
    alpha, beta = make_team("alpha"), make_team("beta")
    users = {
        "root": make_user("root", admin=True),
        "tia": make_user("tia", alpha, role="team-admin"),
        "mia": make_user("mia", alpha, role="member"),
        "vic": make_user("vic", alpha, role="viewer"),
        "bea": make_user("bea", beta, role="team-admin"),
    }
    tokens = {name: make_token(user, beta if name == "bea" else alpha) for name, user in users.items() if name != "root"}
    entries_delete(AuditEntry.objects.all())  # the users' tokens made their entries: start from nothing
    now = timezone.now()
    old = now - timedelta(days=3)
    entries = {
        "quota": record("quota.change", actor=users["root"], team=alpha, target="quota alpha",
                        before={"max_gpus": 1}, after={"max_gpus": "=2+3"}),
        "token": record("token.create", actor=users["mia"], team=alpha, target="token ab12cd34", after={"name": "ci"}),
        "secret": record("secret.delete", actor=users["bea"], team=beta, target="secret K"),
        "login": record("login.failure", actor="mallory", target="user mallory"),
    }
    AuditEntry.objects.create(action="token.revoke", actor=users["tia"], actor_name="tia", team=alpha,
                              team_slug="alpha", target="token ab12cd34", time=old)
    return {"teams": (alpha, beta), "users": users, "entries": entries, "tokens": tokens, "old": old}


def session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listed(answer) -> list[tuple[str, str]]:
    assert answer.status_code == 200, answer.content
    return [(entry["action"], entry["target"]) for entry in answer.json()["results"]]


def test_a_cluster_admin_reads_every_entry_newest_first(world):
    client = session(world["users"]["root"])
    answer = client.get("/api/v1/audit/")
    body = answer.json()
    assert body["count"] == 5
    actions = [entry["action"] for entry in body["results"]]
    assert actions[-1] == "token.revoke"  # the oldest
    quota = next(entry for entry in body["results"] if entry["action"] == "quota.change")
    assert quota["actor"] == "root" and quota["team"] == "alpha" and quota["before"] == {"max_gpus": 1}
    assert set(quota) == {"id", "time", "actor", "actor_id", "team", "action", "target", "before", "after",
                          "address", "user_agent"}


def test_filters(world):
    client = session(world["users"]["root"])
    assert listed(client.get("/api/v1/audit/", {"action": "login"})) == [("login.failure", "user mallory")]
    assert listed(client.get("/api/v1/audit/", {"action": "token", "team": "alpha", "actor": "mia"})) == [
        ("token.create", "token ab12cd34")]
    assert listed(client.get("/api/v1/audit/", {"target": "token ab12", "team": "alpha"})) == [
        ("token.create", "token ab12cd34"), ("token.revoke", "token ab12cd34")]
    assert listed(client.get("/api/v1/audit/", {"target": "token ab12", "until": "2d"})) == [
        ("token.revoke", "token ab12cd34")]
    assert ("token.revoke", "token ab12cd34") not in listed(client.get("/api/v1/audit/", {"since": "1d"}))
    since = (world["old"] - timedelta(minutes=1)).isoformat()
    assert ("token.revoke", "token ab12cd34") in listed(client.get("/api/v1/audit/", {"since": since}))
    assert listed(client.get("/api/v1/audit/", {"team": "nosuch"})) == []


def test_bad_filters_are_a_400_naming_each(world):
    answer = session(world["users"]["root"]).get("/api/v1/audit/", {"since": "yesterday", "until": "soon"})
    assert answer.status_code == 400
    assert set(answer.json()) >= {"since", "until"}
    answer = session(world["users"]["root"]).get("/api/v1/audit/export.csv", {"since": "x"})
    assert answer.status_code == 400 and answer["Content-Type"].startswith("application/json")
    assert "since" in answer.json()


def test_pages(world):
    client = session(world["users"]["root"])
    first = client.get("/api/v1/audit/", {"page_size": 2}).json()
    second = client.get("/api/v1/audit/", {"page_size": 2, "page": 2}).json()
    assert first["count"] == 5 and len(first["results"]) == 2 and first["next"]
    assert not {entry["id"] for entry in first["results"]} & {entry["id"] for entry in second["results"]}


def test_a_team_admin_reads_only_their_teams_entries(world, api):
    for client in (session(world["users"]["tia"]), api(world["tokens"]["tia"])):
        answer = client.get("/api/v1/audit/", {"page_size": 100})
        assert answer.status_code == 200
        assert {entry["team"] for entry in answer.json()["results"]} == {"alpha"}
        assert ("secret.delete", "secret K") not in listed(answer)  # beta's
        assert ("login.failure", "user mallory") not in listed(answer)  # no team: cluster admins only
        assert listed(client.get("/api/v1/audit/", {"team": "beta"})) == []  # another team's filter: nothing
    assert {entry["team"] for entry in api(world["tokens"]["bea"]).get("/api/v1/audit/").json()["results"]} == {"beta"}


@pytest.mark.parametrize("name", ["mia", "vic"])
def test_members_and_viewers_get_a_403(world, api, name):
    for client in (session(world["users"][name]), api(world["tokens"][name])):
        for path in ("/api/v1/audit/", "/api/v1/audit/export.csv", "/api/v1/audit/?format=csv"):
            answer = client.get(path)
            assert answer.status_code == 403, (path, answer.status_code)
            assert "team-admin" in answer.json()["detail"]
    assert session(world["users"][name]).get("/audit/").status_code == 403


def test_anonymous_and_node_callers_are_refused(world, node_token, api):
    assert Client().get("/api/v1/audit/").status_code in (401, 403)
    assert api(node_token).get("/api/v1/audit/").status_code == 403


def rows(answer) -> list[dict]:
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/csv")
    assert "attachment" in answer["Content-Disposition"]
    text = b"".join(answer.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


def test_csv_export(world):
    client = session(world["users"]["root"])
    exported = rows(client.get("/api/v1/audit/export.csv", {"team": "alpha"}))
    assert [row["action"] for row in exported] == ["token.create", "quota.change", "token.revoke"]
    assert {row["team"] for row in exported} == {"alpha"}
    quota = next(row for row in exported if row["action"] == "quota.change")
    assert quota["actor"] == "root" and quota["target"] == "quota alpha"
    assert json.loads(quota["before"]) == {"max_gpus": 1}
    assert quota["after"] == '{"max_gpus": "=2+3"}'  # JSON cells start with "{": never a formula
    assert list(exported[0]) == ["time", "actor", "team", "action", "target", "before", "after", "address",
                                 "user_agent"]
    same = rows(client.get("/api/v1/audit/", {"team": "alpha", "format": "csv"}))
    assert same == exported
    assert len(rows(client.get("/api/v1/audit/export.csv"))) == 5  # every entry, no pages


def test_csv_cells_never_start_a_formula(make_user):
    record("login.failure", actor="=HYPERLINK(\"http://evil\")", target="user =cmd")
    client = session(make_user("root", admin=True))
    (row,) = [row for row in rows(client.get("/api/v1/audit/export.csv", {"action": "login"}))]
    assert row["actor"] == "'=HYPERLINK(\"http://evil\")" and row["target"] == "user =cmd"


def test_a_team_admins_csv_holds_only_their_team(world, api):
    exported = rows(api(world["tokens"]["bea"]).get("/api/v1/audit/export.csv"))
    assert {row["team"] for row in exported} == {"beta"}
    assert any(row["target"] == "secret K" for row in exported)


def test_the_dashboard_page(world):
    client = session(world["users"]["root"])
    page = client.get("/audit/", {"action": "quota"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-action="quota.change"' in html and 'data-action="token.create"' not in html
    assert '/api/v1/audit/export.csv?action=quota' in html
    assert 'data-nav="audit"' in html
    page = session(world["users"]["tia"]).get("/audit/")
    html = page.content.decode()
    assert page.status_code == 200 and "secret K" not in html and "token ab12cd34" in html
    assert 'data-nav="audit"' in html  # a team-admin gets the link too
    assert 'data-nav="audit"' not in session(world["users"]["mia"]).get("/jobs/").content.decode()
    assert session(world["users"]["root"]).get("/audit/", {"since": "never"}).status_code == 400


def test_strata_audit(world, api, monkeypatch, capsys, tmp_path):
    from strata.cli.main import main

    client = api(world["tokens"]["tia"])

    class Adapter:
        def request(self, method, path, *, params=None, raw=False, **_):
            response = client.get(f"/api/v1/{path}", params or {})
            assert response.status_code == 200, response.content
            if raw:
                response.iter_content = lambda chunk_size: iter(response.streaming_content)
                return response
            return response.json()

        def get(self, path, **kwargs):
            return self.request("GET", path, **kwargs)

    monkeypatch.setattr("strata.cli.client_commands.connect", lambda args: Adapter())
    assert main(["audit", "--action", "token", "--since", "7d"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["TIME", "ACTOR", "TEAM", "ACTION", "TARGET", "ADDRESS", "CHANGE"]
    assert any("token.create" in line and "token ab12cd34" in line and "mia" in line for line in out)
    assert not any("secret K" in line for line in out)
    assert main(["audit", "--json", "--limit", "1"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
    target = tmp_path / "audit.csv"
    assert main(["audit", "--csv", "--team", "alpha", "-o", str(target)]) == 0
    exported = list(csv.DictReader(io.StringIO(target.read_text())))
    assert exported and {row["team"] for row in exported} == {"alpha"}
