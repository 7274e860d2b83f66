"""The generic report channel: heartbeats and attempt reports carry ``reports: {plugin: payload}``, each payload
checked by its plugin's light ReportSchema, stored, and read by panels through ``PanelData.reports``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from components.runtime.plugins import Plugin, ReportError, ReportSchema
from strata.cluster.models import Node
from strata.jobs.models import Attempt, JobState

NODE = "/api/v1/node/attempts"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "plugins" / "strata-primes"
DISK = {"disk_free": 2**30, "disk_total": 2**32, "load1": 0.25}


@pytest.fixture
def primes(install_plugins, monkeypatch):
    """The example plugin registered (its ScratchDiskReport schema checks node reports)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    install_plugins("strata_primes.plugin:PLUGIN")
    yield
    sys.modules.pop("strata_primes", None)


@pytest.fixture
def cluster(make_team, make_user, make_token, make_node, node_token, api):
    team, other = make_team("alpha"), make_team("beta")
    user = make_user("alice", team)
    make_user("bob", other)
    node = make_node("n1", gpus=1)
    return {"team": team, "other": other, "user": user, "node": node, "agent": api(node_token)}


def beat(cluster, **body):
    node = cluster["node"]
    return cluster["agent"].post("/api/v1/node/heartbeat/", {"node": str(node.pk), "session": str(node.session),
                                                             **body}, format="json")


def test_a_node_report_is_checked_and_stored_per_plugin(cluster, primes):
    answer = beat(cluster, reports={"primes": DISK})
    assert answer.status_code == 200, answer.content
    stored = Node.objects.get(pk=cluster["node"].pk).reports
    assert stored["primes"]["payload"] == DISK and stored["primes"]["time"] > 0
    first = stored["primes"]["time"]
    assert beat(cluster, reports={"primes": {**DISK, "load1": 2.0}}).status_code == 200
    beat(cluster)  # a heartbeat without reports keeps the last ones
    stored = Node.objects.get(pk=cluster["node"].pk).reports
    assert stored["primes"]["payload"]["load1"] == 2.0 and stored["primes"]["time"] >= first


def test_a_refused_payload_and_an_unknown_plugin_are_400s_naming_the_fields(cluster, primes):
    answer = beat(cluster, reports={"primes": {"disk_free": -1, "disk_total": 10, "load1": 0.1, "extra": 1},
                                    "nobody": {"x": 1}})
    assert answer.status_code == 400
    errors = answer.json()["reports"]
    assert set(errors["primes"]) == {"disk_free", "extra"}
    assert "no registered plugin 'nobody' takes reports" in errors["nobody"]["non_field_errors"][0]
    assert Node.objects.get(pk=cluster["node"].pk).reports == {}  # nothing of a refused heartbeat is stored
    assert beat(cluster, reports=["not", "an", "object"]).status_code == 400


def test_a_schema_that_raises_is_a_400_not_a_500(cluster, primes, monkeypatch):
    from components.runtime import registry

    schema = registry.report_schema("primes")
    monkeypatch.setattr(type(schema), "node", lambda self, payload: 1 / 0)
    answer = beat(cluster, reports={"primes": DISK})
    assert answer.status_code == 400
    assert "ZeroDivisionError" in answer.json()["reports"]["primes"]["non_field_errors"][0]


def test_gpushare_reports_its_devices_through_the_channel(cluster):
    entry = {"index": 0, "policy": "pack", "switches": 3, "switch_latency_ms": {"p50": 0.1, "p99": 0.2},
             "utilization": 0.5, "budget": 2**30, "lanes": [], "jobs": [], "slices": []}
    assert beat(cluster, reports={"gpushare": {"devices": [entry]}}).status_code == 200
    assert Node.objects.get(pk=cluster["node"].pk).reports["gpushare"]["payload"] == {"devices": [0]}
    device = cluster["node"].devices.get(index=0)
    assert device.reports["gpushare"]["payload"]["switches"] == 3  # its part, split by the plugin's schema
    refused = beat(cluster, reports={"gpushare": {"devices": [{**entry, "utilization": 3, "index": -1}]}})
    assert refused.status_code == 400
    assert set(refused.json()["reports"]["gpushare"]) == {"devices.0.utilization", "devices.0.index"}


def test_attempt_reports_are_stored_and_read_only_by_the_jobs_team(cluster, submit, run_pass, install_plugins):
    from dashboard.panels import DatabasePanelData

    job = submit(cluster["user"], cluster["team"])
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    agent, node = cluster["agent"], str(cluster["node"].pk)
    install_plugins(f"{__name__}:STEPS")
    assert agent.post(f"{NODE}/{attempt.pk}/claim/", {"node": node, "token": attempt.fencing_token},
                      format="json").status_code == 200
    answer = agent.post(f"{NODE}/{attempt.pk}/report/", {"node": node, "token": attempt.fencing_token,
                                                          "reports": {"steps": {"seen": 5}}}, format="json")
    assert answer.status_code == 200, answer.content
    assert Attempt.objects.get(pk=attempt.pk).reports["steps"]["payload"] == {"seen": 5}
    bad = agent.post(f"{NODE}/{attempt.pk}/report/", {"node": node, "token": attempt.fencing_token,
                                                       "reports": {"steps": {"seen": "many"}}}, format="json")
    assert bad.status_code == 400 and bad.json()["reports"]["steps"] == {"seen": ["must be a whole number"]}
    job.refresh_from_db()
    assert job.state == JobState.RUNNING

    own = DatabasePanelData([cluster["team"].pk]).reports("steps", job_id=str(job.pk))
    assert [(entry["attempt"], entry["payload"]) for entry in own["attempts"]] == [(str(attempt.pk), {"seen": 5})]
    foreign = DatabasePanelData([cluster["other"].pk]).reports("steps", job_id=str(job.pk))
    assert foreign["attempts"] == []  # another team's job gives nothing
    assert DatabasePanelData([cluster["team"].pk]).reports("steps", job_id=str(job.pk), since=4e9)["attempts"] == []
    with pytest.raises(ReportError):
        StepsSchema().node({"seen": 1})  # a schema takes only the reports it declares


class StepsSchema(ReportSchema):
    """A test plugin's schema: attempt reports ``{"seen": whole number}``."""

    def attempt(self, payload):
        if not isinstance(payload, dict) or not isinstance(payload.get("seen"), int):
            raise ReportError({"seen": "must be a whole number"})
        return {"seen": payload["seen"]}


STEPS = Plugin(name="steps", reports=f"{__name__}:StepsSchema")


def test_node_reports_reach_panels_through_the_static_twin_and_the_database(cluster, primes):
    from components.runtime.panels import StaticPanelData
    from dashboard.panels import DatabasePanelData

    assert beat(cluster, reports={"primes": DISK}).status_code == 200
    read = DatabasePanelData([cluster["other"].pk]).reports("primes")  # machines: every viewer sees them
    assert [(entry["node"], entry["payload"]) for entry in read["nodes"]] == [("n1", DISK)]
    empty = {"nodes": [], "devices": [], "attempts": [], "series": []}
    assert DatabasePanelData([]).reports("gpushare") == empty
    twin = StaticPanelData(reports={"primes": read})
    assert twin.reports("primes") == read and twin.reports("other") == empty
    from strata_primes.panels import ScratchDiskPanel

    table = ScratchDiskPanel().render(DatabasePanelData([cluster["team"].pk]))["table"]
    assert table["rows"] == [["n1", "1.0 GiB", "4.0 GiB", "25%", "0.25"]]


def test_gpushare_takes_a_full_heartbeat_of_slices(cluster):
    attempt = "0" * 8 + "-0000-4000-8000-" + "0" * 12  # unknown: checked, then dropped
    slices = [{"attempt": attempt, "start": float(i), "end": float(i) + 0.5} for i in range(2000)]
    entry = {"index": 0, "policy": "pack", "switches": 3, "lanes": [], "jobs": [], "slices": slices}
    assert beat(cluster, reports={"gpushare": {"devices": [entry]}}).status_code == 200  # the service's limit
    refused = beat(cluster, reports={"gpushare": {"devices": [{**entry, "slices": slices + slices[:1]}]}})
    assert refused.json()["reports"]["gpushare"] == {"devices.0.slices": ["must be a list of at most 2000 objects"]}
