"""The generic report channel: heartbeats and attempt reports carry ``reports: {plugin: payload}``, each payload
checked by its plugin's light ReportSchema, stored, and read by panels through ``PanelData.reports``."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest
from node_protocol import NodeProtocol

from components.runtime.contract.plugins import Plugin, ReportError, ReportSchema
from strata.cluster.models import Node
from strata.jobs.models import Attempt, JobState

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
    return NodeProtocol(cluster["agent"], node=cluster["node"]).heartbeat(**body)


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
    from components.runtime.contract import registry

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
    protocol = NodeProtocol(cluster["agent"], attempt, cluster["node"])
    install_plugins(f"{__name__}:STEPS")
    assert protocol.claim().status_code == 200
    answer = protocol.report(reports={"steps": {"seen": 5}})
    assert answer.status_code == 200, answer.content
    assert Attempt.objects.get(pk=attempt.pk).reports["steps"]["payload"] == {"seen": 5}
    bad = protocol.report(reports={"steps": {"seen": "many"}})
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
    from components.runtime.contract.panels import StaticPanelData
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


class LedgerSchema(ReportSchema):
    """A test plugin that splits its node report into every part: ``{"devices": {index: n}, "attempts":
    [{"attempt", "device", "memory"}], "rows": [{"device", "attempt", "start", "end"}]}``."""

    def node(self, payload):
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        return payload

    def parts(self, payload):
        from components.runtime.contract.plugins import ReportParts

        return ReportParts(node={"beat": True}, devices={int(k): {"n": v} for k, v in payload.get("devices", {}).items()},
                           attempts=[{"attempt": a["attempt"], "device": a.get("device"), "memory": a.get("memory"),
                                      "payload": {"seen": True}} for a in payload.get("attempts", [])],
                           series=[{**row, "data": {"k": 1}} for row in payload.get("rows", [])])


LEDGER = Plugin(name="ledger", reports=f"{__name__}:LedgerSchema")


def test_parts_are_stored_per_device_attempt_and_series_and_read_scoped(cluster, submit, run_pass, install_plugins,
                                                                        make_node, make_user):
    from dashboard.panels import DatabasePanelData
    from strata.telemetry.models import ReportSeries

    install_plugins(f"{__name__}:LEDGER")
    job = submit(cluster["user"], cluster["team"], gpus=0.5, name="mine")
    run_pass()
    attempt = Attempt.objects.get(job=job)
    assert attempt.node_id == cluster["node"].pk
    stranger = str(uuid.uuid4())
    now = time.time()
    rows = [{"device": 0, "attempt": str(attempt.pk), "start": now - 2, "end": now - 1},
            {"device": 0, "attempt": stranger, "start": now - 2, "end": now - 1},  # not on this node: dropped
            {"device": 9, "attempt": None, "start": now - 2, "end": now - 1},  # no such device: dropped
            {"device": None, "attempt": None, "start": now - 2, "end": now - 1}]  # the node's own row
    payload = {"devices": {"0": 3, "9": 1}, "rows": rows,
               "attempts": [{"attempt": str(attempt.pk), "device": 0, "memory": 5 * 2**20},
                            {"attempt": stranger, "device": 0, "memory": 1}]}
    assert beat(cluster, reports={"ledger": payload}).status_code == 200
    device = cluster["node"].devices.get(index=0)
    assert device.reports["ledger"]["payload"] == {"n": 3}
    attempt.refresh_from_db()
    assert attempt.reports["ledger"]["payload"] == {"seen": True} and attempt.reports["ledger"]["device"] == device.pk
    assert attempt.measured_memory == 5 * 2**20
    assert {(r.device_id, r.attempt_id, r.job_id) for r in ReportSeries.objects.all()} == {
        (device.pk, attempt.pk, job.pk), (None, None, None)}
    # A retried heartbeat stores no row twice.
    assert beat(cluster, reports={"ledger": payload}).status_code == 200
    assert ReportSeries.objects.count() == 2

    own = DatabasePanelData([cluster["team"].pk]).reports("ledger")
    assert [entry["payload"] for entry in own["devices"]] == [{"n": 3}]
    assert [(a["attempt"], a["job_id"], a["job_name"], a["foreign"], a["current"]) for a in own["attempts"]] == [
        (str(attempt.pk), str(job.pk), "mine", False, True)]
    assert {(row["job_name"], row["foreign"]) for row in own["series"]} == {("mine", False), (None, False)}
    theirs = DatabasePanelData([cluster["other"].pk]).reports("ledger")
    assert [(a["attempt"], a["job_id"], a["number"], a["foreign"], a["payload"]) for a in theirs["attempts"]] == [
        (None, None, None, True, {"seen": True})]  # another team's attempt: only as foreign
    assert {(row["attempt"], row["job_id"], row["foreign"]) for row in theirs["series"]} == {
        (None, None, True), (None, None, False)}
    assert DatabasePanelData([cluster["other"].pk]).reports("ledger", job_id=str(job.pk))["attempts"] == []
    scoped = DatabasePanelData([cluster["team"].pk]).reports("ledger", device_ids=[device.pk + 1000])
    assert scoped["devices"] == [] and scoped["attempts"] == [] and scoped["series"] == []
    assert DatabasePanelData([cluster["team"].pk]).reports("ledger", since=now + 3600)["series"] == []
    # The plugin said nothing this time: its devices have nothing to show; the attempt keeps its report.
    assert beat(cluster).status_code == 200
    assert cluster["node"].devices.get(index=0).reports == {}
    assert Attempt.objects.get(pk=attempt.pk).reports["ledger"]["payload"] == {"seen": True}


def test_the_static_twin_filters_as_the_database_does():
    from components.runtime.contract.panels import StaticPanelData

    reports = {"ledger": {
        "nodes": [{"node": "n1", "node_id": "x", "time": 10.0, "payload": {}}],
        "devices": [{"id": 1, "node": "n1", "index": 0, "kind": "virtual", "time": 10.0, "payload": {"n": 1}},
                    {"id": 2, "node": "n1", "index": 1, "kind": "virtual", "time": 5.0, "payload": {"n": 2}}],
        "attempts": [{"attempt": "a", "number": 1, "job_id": "j", "job_name": "mine", "foreign": False, "device": 1,
                      "time": 10.0, "current": True, "payload": {}},
                     {"attempt": None, "number": None, "job_id": None, "job_name": None, "foreign": True,
                      "device": 2, "time": 10.0, "current": True, "payload": {}},
                     {"attempt": "old", "number": 0, "job_id": "j", "job_name": "mine", "foreign": False,
                      "device": 1, "time": 1.0, "current": False, "payload": {}}],
        "series": [{"device": 1, "attempt": "a", "job_id": "j", "job_name": "mine", "foreign": False, "start": 1.0,
                    "end": 2.0, "data": {}},
                   {"device": 2, "attempt": None, "job_id": None, "job_name": None, "foreign": True, "start": 8.0,
                    "end": 9.0, "data": {}}]}}
    twin = StaticPanelData(job={"id": "j"}, metrics={"loss": [(1, 0.5, 1.0)], "acc": []},
                           events=[{"kind": "note"}, {"kind": "other"}], devices=[{"id": 1}], reports=reports)
    assert twin.metrics(["loss"]) == {"loss": [(1, 0.5, 1.0)]} and twin.events("note") == [{"kind": "note"}]
    assert twin.devices() == [{"id": 1}] and twin.job == {"id": "j"}
    everything = twin.reports("ledger")
    assert len(everything["attempts"]) == 2  # without a job: the current ones
    assert [a["attempt"] for a in twin.reports("ledger", job_id="j")["attempts"]] == ["a", "old"]
    recent = twin.reports("ledger", since=6.0)
    assert [d["id"] for d in recent["devices"]] == [1] and [s["device"] for s in recent["series"]] == [2]
    on_two = twin.reports("ledger", device_ids=[2])
    assert [d["id"] for d in on_two["devices"]] == [2] and [a["foreign"] for a in on_two["attempts"]] == [True]
    assert twin.reports("ledger", job_id="j")["series"] == [reports["ledger"]["series"][0]]
    assert twin.reports("nobody") == {"nodes": [], "devices": [], "attempts": [], "series": []}
