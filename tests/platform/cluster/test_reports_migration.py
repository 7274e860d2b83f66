"""The migrations that move gpushare's old fields (Device.sharing, Attempt.sharing, telemetry.ShareSlice) into
the generic report channel (Device.reports, Attempt.reports and measured_memory, telemetry.ReportSeries), run
with Django's migration executor: back to the old schema, old rows written, forward again."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from strata.jobs.models import Allocation, Attempt

OLD = [("cluster", "0003_reports"), ("jobs", "0005_job_parent"), ("telemetry", "0003_share_slices")]
# The migrations that moved the data are 0004-0005 (cluster), 0006-0007 (jobs) and 0004-0005 (telemetry); the
# test migrates forward to the latest of every app, as a real upgrade does, so later migrations run too.
MIB = 2**20


def _latest():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_the_migrations_move_the_old_sharing_data(make_team, make_user, make_node, submit, run_pass):
    from strata.cluster.models import Device
    from strata.telemetry.models import ReportSeries

    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("n1", gpus=1)
    running, ended = submit(user, team, gpus=0.5, name="running"), submit(user, team, gpus=0.25, name="ended")
    run_pass()
    now = time.time()
    live, gone = Attempt.objects.get(job=running), Attempt.objects.get(job=ended)
    device_id = Allocation.objects.get(attempt=live).device_id
    try:
        old = _migrate(OLD)
        OldDevice, OldAttempt = old.get_model("cluster", "Device"), old.get_model("jobs", "Attempt")
        ShareSlice = old.get_model("telemetry", "ShareSlice")
        OldDevice.objects.filter(pk=device_id).update(sharing={
            "policy": "srtf", "switches": 7, "switch_latency_ms": {"p50": 0.1, "p99": 0.5}, "utilization": 0.5,
            "budget": 4 * 2**30, "lanes": [{"id": 0, "size": 2**30, "attempts": [str(live.pk), str(gone.pk)]}],
            "jobs": [{"attempt": str(live.pk), "job": str(running.pk), "state": "running", "persistent": 100 * MIB,
                      "ephemeral": 20 * MIB, "lane": 0, "steps": 5}],
            "reported_at": now, "slices_until": now - 1})
        OldAttempt.objects.filter(pk=live.pk).update(sharing={
            "policy": "srtf", "state": "running", "lane": 0, "persistent": 100 * MIB, "ephemeral": 20 * MIB,
            "steps": 5})
        OldAttempt.objects.filter(pk=gone.pk).update(sharing={
            "policy": "srtf", "state": "finished", "lane": 0, "persistent": 30 * MIB, "ephemeral": None, "steps": 9})
        for start in (now - 3, now - 2):
            ShareSlice.objects.create(device_id=device_id, attempt_id=live.pk, job_id=running.pk,
                                      start=datetime.fromtimestamp(start, tz=UTC),
                                      end=datetime.fromtimestamp(start + 0.5, tz=UTC))
    finally:
        _migrate(_latest())

    device = Device.objects.get(pk=device_id)
    assert device.reports == {"gpushare": {
        "time": now, "series_until": now - 1,
        "payload": {"policy": "srtf", "switches": 7, "switch_latency_ms": {"p50": 0.1, "p99": 0.5},
                    "utilization": 0.5, "budget": 4 * 2**30, "lanes": [{"id": 0, "size": 2**30, "jobs": 2}]}}}
    live, gone = Attempt.objects.get(pk=live.pk), Attempt.objects.get(pk=gone.pk)
    assert live.reports["gpushare"] == {
        "time": now, "node": str(live.node_id), "device": device_id,
        "payload": {"policy": "srtf", "state": "running", "lane": 0, "persistent": 100 * MIB,
                    "ephemeral": 20 * MIB, "steps": 5}}
    assert live.measured_memory == 120 * MIB
    assert gone.reports["gpushare"]["payload"]["state"] == "finished" and gone.measured_memory == 30 * MIB
    assert gone.reports["gpushare"]["device"] == Allocation.objects.get(attempt=gone).device_id
    rows = list(ReportSeries.objects.order_by("start").values_list("plugin", "device_id", "attempt_id", "job_id"))
    assert rows == [("gpushare", device_id, live.pk, running.pk)] * 2

    # What was moved reads back through the generic channel as the panels read it.
    from components.gpushare.report import read, sharing_view
    from dashboard.panels import DatabasePanelData

    view = sharing_view(read(DatabasePanelData([team.pk])))
    assert [job["job_name"] for job in view["devices"][0]["jobs"]] == ["running"]  # what the device listed
    assert len(view["slices"]) == 2 and view["devices"][0]["policy"] == "srtf"
