"""GPU sharing on the control plane: gpushare's heartbeat reports through the generic report channel (stored
per device, per attempt and as series rows), device pools and their policy, each job's share in the API, and
pruning of the series rows."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from node_protocol import NodeProtocol

from strata.cluster.models import Device, DevicePool
from strata.jobs.models import Allocation, Attempt
from strata.telemetry.models import ReportSeries
from strata.telemetry.services import telemetry_prune


@pytest.fixture
def world(make_team, make_user, make_token, make_node, node_token, api, submit, run_pass):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    admin = make_user("root", admin=True)
    node = make_node("n1", gpus=1, labels={"pool": "training"})
    other_node = make_node("n2", gpus=1)
    shared = submit(alice, alpha, gpus=0.5, name="half")
    whole = submit(alice, alpha, gpus=1.0, name="whole")
    run_pass()
    return {"alpha": alpha, "alice": alice, "bob": bob, "node": node, "other_node": other_node,
            "shared": shared, "whole": whole, "agent": api(node_token),
            "alice_api": api(make_token(alice, alpha)), "bob_api": api(make_token(bob, beta)),
            "admin_api": api(make_token(admin, alpha)), "admin": admin}


def _attempt(job) -> Attempt:
    return Attempt.objects.get(job=job)


def _report(attempt_ids, index=0, slices=None, **overrides) -> dict:
    now = time.time()
    entry = {
        "index": index, "policy": "fair", "switches": 12, "switch_latency_ms": {"p50": 0.07, "p99": 0.4},
        "utilization": 0.8, "budget": 4 * 2**30,
        "lanes": [{"id": 0, "size": 2**30, "attempts": list(attempt_ids)}],
        "jobs": [{"attempt": a, "state": "running", "persistent": 100 * 2**20, "ephemeral": 50 * 2**20, "lane": 0,
                  "steps": 40} for a in attempt_ids],
        "slices": slices if slices is not None else [
            {"attempt": a, "start": now - 2 + i * 0.5, "end": now - 1.8 + i * 0.5} for i, a in enumerate(attempt_ids)],
    }
    entry.update(overrides)
    return entry


def _beat(world, node, sharing, attempts=()):
    return NodeProtocol(world["agent"], node=node).heartbeat(attempts=[str(a) for a in attempts],
                                                            reports={"gpushare": {"devices": sharing}})


def _slices():
    return ReportSeries.objects.filter(plugin="gpushare")


def _node_of(world, job):
    attempt = _attempt(job)
    return world["node"] if attempt.node_id == world["node"].pk else world["other_node"]


def test_heartbeat_stores_devices_attempts_and_slices(world):
    attempt = _attempt(world["shared"])
    node = _node_of(world, world["shared"])
    device = Allocation.objects.get(attempt=attempt).device
    response = _beat(world, node, [_report([str(attempt.pk)], index=device.index)])
    assert response.status_code == 200, response.content
    device.refresh_from_db()
    stored = device.reports["gpushare"]["payload"]
    assert stored["policy"] == "fair" and stored["switches"] == 12
    assert stored["switch_latency_ms"] == {"p50": 0.07, "p99": 0.4}
    assert stored["lanes"] == [{"id": 0, "size": 2**30, "jobs": 1}]  # attempt ids stay on the attempts
    assert "slices" not in stored and "jobs" not in stored
    attempt.refresh_from_db()
    assert attempt.reports["gpushare"]["payload"] == {"policy": "fair", "state": "running", "lane": 0,
                                                      "persistent": 100 * 2**20, "ephemeral": 50 * 2**20, "steps": 40}
    assert attempt.reports["gpushare"]["device"] == device.pk and attempt.measured_memory == 150 * 2**20
    node.refresh_from_db()
    assert node.reports["gpushare"]["payload"] == {"devices": [device.index]}
    rows = list(_slices())
    assert len(rows) == 1 and rows[0].attempt_id == attempt.pk and rows[0].job_id == world["shared"].pk
    assert rows[0].device_id == device.pk and rows[0].end > rows[0].start
    # A retried heartbeat with the same slices does not store them twice.
    assert _beat(world, node, [_report([str(attempt.pk)], index=device.index,
                                       slices=[{"attempt": str(attempt.pk), "start": rows[0].start.timestamp(),
                                                "end": rows[0].end.timestamp()}])]).status_code == 200
    assert _slices().count() == 1
    # A device no longer reported shares nothing; the attempt keeps what was last measured.
    assert _beat(world, node, []).status_code == 200
    device.refresh_from_db()
    assert device.reports == {}
    assert Attempt.objects.get(pk=attempt.pk).reports["gpushare"]["payload"]["lane"] == 0
    # Nor does a heartbeat in which the plugin reports nothing.
    _beat(world, node, [_report([str(attempt.pk)], index=device.index, slices=[])])
    assert Device.objects.get(pk=device.pk).reports
    NodeProtocol(world["agent"], node=node).heartbeat()
    assert Device.objects.get(pk=device.pk).reports == {}


def test_heartbeat_drops_unknown_and_foreign_attempts(world):
    attempt = _attempt(world["shared"])
    node = _node_of(world, world["shared"])
    foreign = _attempt(world["whole"])  # the whole GPU cannot be on the half-held one-GPU node
    assert foreign.node_id != node.pk
    unknown = str(uuid.uuid4())
    ids = [str(attempt.pk), unknown, str(foreign.pk)]
    response = _beat(world, node, [_report(ids)])
    assert response.status_code == 200, response.content
    assert Attempt.objects.get(pk=attempt.pk).reports["gpushare"]["payload"]["lane"] == 0
    assert Attempt.objects.get(pk=foreign.pk).reports is None  # not on this node: dropped
    assert list(_slices().values_list("attempt_id", flat=True)) == [attempt.pk]


@pytest.mark.parametrize(("entry", "field"), [
    ({"utilization": 1.5}, "utilization"),
    ({"switches": -1}, "switches"),
    ({"switch_latency_ms": {"p50": "fast"}}, "switch_latency_ms"),
    ({"jobs": [{"attempt": "not-a-uuid", "state": "running", "persistent": 0, "ephemeral": 0, "steps": 0}]}, "jobs"),
    ({"slices": [{"attempt": str(uuid.uuid4()), "start": 10.0, "end": 5.0}]}, "slices"),
    ({"slices": [{"attempt": str(uuid.uuid4()), "start": 1.0, "end": 2.0}] * 2001}, "slices"),
    ({"lanes": "many"}, "lanes"),
])
def test_malformed_sharing_is_400_naming_the_field(world, entry, field):
    node = world["node"]
    response = _beat(world, node, [_report([], **entry)])
    assert response.status_code == 400
    refused = response.json()["reports"]["gpushare"]
    assert any(name.startswith(f"devices.0.{field}") for name in refused), refused
    assert not _slices().exists()


def test_more_than_64_devices_is_400(world):
    response = _beat(world, world["node"], [_report([], index=i) for i in range(65)])
    assert response.status_code == 400 and "devices" in response.json()["reports"]["gpushare"]


def test_heartbeat_returns_the_policy_of_the_nodes_pool(world):
    node, plain = world["node"], world["other_node"]
    assert _beat(world, node, []).json()["sharing_policy"] == "fair"
    DevicePool.objects.create(name="training", sharing_policy="srtf")
    assert _beat(world, node, []).json()["sharing_policy"] == "srtf"
    assert _beat(world, plain, []).json()["sharing_policy"] == "fair"  # pool "default", no row
    DevicePool.objects.create(name="default", sharing_policy="pack")
    assert _beat(world, plain, []).json()["sharing_policy"] == "pack"


def test_pools_api_lists_and_admins_change_policies(world):
    pools = world["alice_api"].get("/api/v1/pools/").json()
    assert {(p["name"], p["sharing_policy"], p["nodes"], p["devices"]) for p in pools} == {
        ("default", "fair", 1, 1), ("training", "fair", 1, 1)}
    response = world["admin_api"].patch("/api/v1/pools/training/", {"sharing_policy": "priority"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["sharing_policy"] == "priority" and response.json()["nodes"] == 1
    assert DevicePool.objects.get(name="training").sharing_policy == "priority"
    assert _beat(world, world["node"], []).json()["sharing_policy"] == "priority"
    # A pool that has no node yet may be given a policy ahead of time.
    assert world["admin_api"].patch("/api/v1/pools/spare/", {"sharing_policy": "pack"}, format="json").status_code == 200
    assert ("spare", "pack") in {(p["name"], p["sharing_policy"]) for p in world["bob_api"].get("/api/v1/pools/").json()}


def test_pools_api_refuses_non_admins_and_bad_values(world):
    response = world["alice_api"].patch("/api/v1/pools/training/", {"sharing_policy": "pack"}, format="json")
    assert response.status_code == 403
    assert not DevicePool.objects.exists()
    bad = world["admin_api"].patch("/api/v1/pools/training/", {"sharing_policy": "fastest"}, format="json")
    assert bad.status_code == 400 and "sharing_policy" in bad.json()
    bad_name = world["admin_api"].patch("/api/v1/pools/no.dots/", {"sharing_policy": "pack"}, format="json")
    assert bad_name.status_code == 400 and "name" in bad_name.json()
    assert world["agent"].get("/api/v1/pools/").status_code == 403  # node tokens are not users


def test_job_share_field(world):
    attempt = _attempt(world["shared"])
    node = _node_of(world, world["shared"])
    allocation = Allocation.objects.select_related("device__node").get(attempt=attempt)
    client = world["alice_api"]
    share = client.get(f"/api/v1/jobs/{world['shared'].pk}/").json()["share"]
    assert share == {"gpus": 0.5, "gpu_memory": allocation.memory,
                     "device": f"{allocation.device.node.name}:gpu{allocation.device.index}", "shared": True,
                     "policy": "fair", "measured_memory": None}
    _beat(world, node, [_report([str(attempt.pk)], index=allocation.device.index, policy="srtf")])
    body = client.get(f"/api/v1/jobs/{world['shared'].pk}/").json()
    assert body["share"]["policy"] == "fair"  # the pool's; what the service runs is in its report
    assert body["share"]["measured_memory"] == 150 * 2**20
    report = body["attempts"][-1]["reports"]["gpushare"]
    assert report["payload"]["lane"] == 0 and report["payload"]["policy"] == "srtf"
    assert report["device"] == allocation.device.pk and body["attempts"][-1]["measured_memory"] == 150 * 2**20
    assert client.get(f"/api/v1/jobs/{world['whole'].pk}/").json()["share"] is None
    listed = {job["name"]: job for job in client.get("/api/v1/jobs/").json()["results"]}
    assert listed["whole"]["share"] is None and listed["half"]["share"]["measured_memory"] == 150 * 2**20

    # Once the service stops listing the attempt (it ended), the job keeps what was last measured.
    _beat(world, node, [_report([], index=allocation.device.index, policy="srtf")])
    body = client.get(f"/api/v1/jobs/{world['shared'].pk}/").json()
    assert body["attempts"][-1]["reports"]["gpushare"]["payload"]["persistent"] == 100 * 2**20
    assert body["share"]["measured_memory"] == 150 * 2**20


def test_job_list_share_does_not_query_per_job(world, submit, run_pass, make_node):
    client = world["alice_api"]
    with CaptureQueriesContext(connection) as few:
        client.get("/api/v1/jobs/")
    make_node("n3", gpus=2)
    for i in range(6):
        submit(world["alice"], world["alpha"], gpus=0.25, name=f"quarter-{i}")
    run_pass()
    with CaptureQueriesContext(connection) as many:
        response = client.get("/api/v1/jobs/")
    assert len(response.json()["results"]) == 8
    assert sum(1 for job in response.json()["results"] if job["share"]) >= 6
    assert len(many.captured_queries) <= len(few.captured_queries) + 1


def test_pruning_removes_old_slices(world, settings):
    attempt = _attempt(world["shared"])
    device = Allocation.objects.get(attempt=attempt).device
    now = timezone.now()
    old = now - timedelta(days=settings.STRATA_TELEMETRY_RAW_DAYS, hours=1)
    ReportSeries.objects.create(plugin="gpushare", device=device, attempt=attempt, job=world["shared"], start=old,
                                end=old + timedelta(seconds=1))
    ReportSeries.objects.create(plugin="gpushare", device=device, attempt=attempt, job=world["shared"],
                                start=now - timedelta(minutes=1), end=now)
    assert telemetry_prune(now=now)["report_series"] == 1
    assert ReportSeries.objects.count() == 1
    assert Device.objects.filter(pk=device.pk).exists()
