"""What-if replays (strata.scheduling.whatif): a doubled quota shortens the team's waits and leaves another team's
guaranteed share alone; the API and the page give the same numbers; bad input gets a 400 naming every field."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from strata.quotas.models import Quota
from strata.scheduling.foresight import SimNode
from strata.scheduling.whatif import Past, compare, replay


def _nodes(count: int, gpus: int) -> list[SimNode]:
    return [SimNode(id=n, name=f"n{n}", labels={}, devices=[(n * 100 + i, i, 2**34) for i in range(gpus)])
            for n in range(count)]


def _history() -> list[Past]:
    history = []
    for i in range(24):  # team 1: a burst of 24 one-GPU jobs of 10 min
        history.append(Past(id=f"a{i}", team_id=1, kind="train", resources={"gpus": 1.0, "workers": 1}, priority=0,
                            submit=float(i), runtime=600.0, wait=0.0))
    for i in range(40):  # team 2: a steady trickle, its demand rising and falling
        history.append(Past(id=f"b{i}", team_id=2, kind="train", resources={"gpus": 1.0, "workers": 1}, priority=0,
                            submit=100.0 * i, runtime=300.0 + 50 * (i % 5), wait=0.0))
    return history


def test_doubling_a_quota_cuts_its_waits_and_keeps_the_other_teams_guarantee():
    nodes, history = _nodes(3, 4), _history()
    quotas = {1: Quota(team_id=1, max_gpus=4), 2: Quota(team_id=2, max_gpus=4)}
    cleaned = {"days": 1.0, "changes": {1: {"max_gpus": 8.0}}, "add": [], "remove": []}
    result = compare(nodes, history, quotas, cleaned)
    a, b = result["teams"][1], result["teams"][2]
    assert a["proposed"]["wait_p50"] < a["current"]["wait_p50"]
    assert a["proposed"]["wait_p90"] < a["current"]["wait_p90"]
    assert a["proposed"]["jct_p50"] < a["current"]["jct_p50"]
    assert a["current"]["never_placed"] == a["proposed"]["never_placed"] == 0
    # Team 2's guarantee (its 4 GPUs): at every pass of the proposed replay it holds all it asks for up to 4.
    doubled = {1: Quota(team_id=1, max_gpus=8), 2: Quota(team_id=2, max_gpus=4)}
    run = replay(nodes, history, doubled, timeline=True)
    checked = 0
    for _, teams in run.timeline:
        held, demand = teams.get(2, (0.0, 0.0))
        assert held >= min(4.0, demand) - 1e-9
        checked += demand > 0
    assert checked > 10
    # Team 1 held up to 8 GPUs at once in the proposed run (4 before).
    assert max(teams.get(1, (0, 0))[0] for _, teams in run.timeline) == 8.0
    assert b["proposed"]["wait_p90"] <= b["current"]["wait_p90"] + 30.0
    assert result["cluster"]["proposed"]["utilization"] > 0


def test_added_nodes_shorten_waits():
    nodes, history = _nodes(1, 4), _history()
    cleaned = {"days": 1.0, "changes": {}, "add": [{"count": 2, "gpus": 4, "gpu_memory": 2**34, "labels": {}}],
               "remove": []}
    result = compare(nodes, history, {}, cleaned)
    assert result["cluster"]["proposed"]["gpus"] == 12.0
    assert result["teams"][1]["proposed"]["wait_p50"] < result["teams"][1]["current"]["wait_p50"]


@pytest.fixture
def recorded(make_team, make_user, submit, make_node):
    """Two teams' jobs of the last day, recorded as started and finished (team alpha waited)."""
    from strata.jobs.models import Job, JobState

    alpha, beta = make_team("alpha", max_gpus=1.0), make_team("beta", max_gpus=1.0)
    user = make_user("ann", alpha)
    make_user("bob", beta)
    make_node("node-1", gpus=2)
    now = timezone.now()
    base = now - timedelta(hours=5)
    for team, count in ((alpha, 6), (beta, 2)):
        for i in range(count):
            job = submit(user, team, gpus=1.0, name=f"{team.slug}-{i}")
            created = base + timedelta(seconds=i)
            started = created + timedelta(seconds=600 * i)
            Job.objects.filter(pk=job.pk).update(created_at=created, started_at=started, state=JobState.SUCCEEDED,
                                                 finished_at=started + timedelta(seconds=600))
    return alpha, beta


def _admin(make_user, make_token, api, team):
    admin = make_user("root", team, admin=True)
    return admin, api(make_token(admin, team))


BODY = {"days": 1, "changes": {"alpha": {"max_gpus": 2}}}


def test_api_replays_and_names_bad_fields(recorded, make_user, make_token, api):
    admin, client = _admin(make_user, make_token, api, recorded[0])
    answer = client.post("/api/v1/quotas/what-if/", BODY, format="json")
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert data["jobs"] == 8
    teams = {row["team"]: row for row in data["teams"]}
    assert teams["alpha"]["current"]["wait_p50"] > teams["alpha"]["proposed"]["wait_p50"]
    assert teams["alpha"]["actual"]["wait_p50"] == pytest.approx(1500.0, abs=1)  # 0, 600 ... 3000 s
    assert teams["beta"]["proposed"]["jobs"] == 2
    bad = client.post("/api/v1/quotas/what-if/", {
        "days": -1, "changes": {"alpha": {"max_gpus": "lots", "colour": 1}, "nobody": {"weight": 2}},
        "nodes": {"add": [{"count": 0, "gpus": "x"}], "shrink": 1}, "extra": True}, format="json")
    assert bad.status_code == 400
    text = bad.content.decode()
    for name in ("days", "changes.alpha.max_gpus", "changes.alpha.colour", "changes.nobody", "nodes.add.0.count",
                 "nodes.add.0.gpus", "nodes.shrink", "extra"):
        assert name in text, name
    member = make_user("carl", recorded[0])
    assert api(make_token(member, recorded[0])).post("/api/v1/quotas/what-if/", BODY, format="json").status_code == 403


def test_page_matches_api_and_apply_is_audited(recorded, make_user, make_token, api, client):
    from strata.audit.models import AuditEntry

    admin, api_client = _admin(make_user, make_token, api, recorded[0])
    data = api_client.post("/api/v1/quotas/what-if/", {**BODY, "changes": {"alpha": {"max_gpus": 2, "weight": 2}}},
                           format="json").json()
    client.force_login(admin)
    empty = client.get("/manage/quotas/what-if/")
    assert empty.status_code == 200 and 'id="what-if-form"' in empty.content.decode()
    assert 'id="what-if-table"' not in empty.content.decode()
    page = client.post("/manage/quotas/what-if/", {"team": "alpha", "max_gpus": "2", "weight": "2", "days": "1",
                                                   "action": "simulate"})
    assert page.status_code == 200
    html = page.content.decode()
    compared = 0
    for row in data["teams"]:
        for run in ("current", "proposed", "actual"):
            for key in ("wait_p50", "wait_p90", "jct_p50", "utilization", "preemptions"):
                if key not in row[run]:
                    continue
                cell = re.search(rf'id="wi-{row["team"]}-{run}-{key}">([^<]*)<', html)
                assert cell is not None, (row["team"], run, key)
                value = row[run][key]
                assert cell.group(1) == ("–" if value is None else str(value)), (row["team"], run, key)
                compared += 1
    assert compared >= 26
    assert f'id="wi-util-proposed">{data["cluster"]["proposed"]["utilization"]}<' in html
    assert 'id="what-if-apply"' in html
    bad = client.post("/manage/quotas/what-if/", {"team": "alpha", "max_gpus": "x", "days": "0", "action": "simulate"})
    assert bad.status_code == 400 and "changes.alpha.max_gpus" in bad.content.decode()
    applied = client.post("/manage/quotas/what-if/", {"team": "alpha", "max_gpus": "2", "weight": "2", "days": "1",
                                                      "action": "apply"})
    assert applied.status_code == 302
    quota = Quota.objects.get(team=recorded[0])
    assert (quota.max_gpus, quota.weight) == (2.0, 2.0)
    entry = AuditEntry.objects.filter(action="quota.change").latest("pk")
    assert entry.after == {"max_gpus": 2.0, "weight": 2.0}


def test_cli_what_if_prints_the_table_and_json(recorded, make_user, make_token, api, monkeypatch, capsys):
    import json

    from strata.cli.main import main

    admin, client = _admin(make_user, make_token, api, recorded[0])

    class Adapter:  # the CLI's REST client, answered by the API views through the test client
        def post(self, path, json=None, **_):
            response = client.post(f"/api/v1/{path}", json, format="json")
            assert response.status_code == 200, response.content
            return response.json()

    monkeypatch.setattr("strata.cli.client_commands.connect", lambda args: Adapter())
    assert main(["quota", "what-if", "--team", "alpha", "--max-gpus", "2", "--days", "1", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["changes"] == {"alpha": {"max_gpus": 2.0}}
    assert main(["quota", "what-if", "--team", "alpha", "--max-gpus", "2", "--days", "1"]) == 0
    out = capsys.readouterr().out
    alpha = {row["team"]: row for row in answer["teams"]}["alpha"]
    line = next(line for line in out.splitlines() if line.startswith("alpha") and "wait p50" in line)
    assert line.split()[-3:] == [f"{alpha['current']['wait_p50']:g}", f"{alpha['proposed']['wait_p50']:g}",
                                 f"{alpha['actual']['wait_p50']:g}"]
