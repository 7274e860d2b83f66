"""End-to-end: fractional-GPU train jobs run interleaved in the node's GPU-sharing service; whole-GPU jobs still
run in child processes."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time

import pytest
from e2e_support import training_children, wait_for

from components.gpushare.service import call, read_authkey, socket_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def job(name: str, gpus: float, epochs: int) -> dict:
    return {"name": name, "kind": "train", "resources": {"gpus": gpus}, "max_attempts": 1,
            "spec": {"workload": "mlp-digits", "epochs": epochs, "batch_size": 32, "log_every": 20}}


def service_call(cluster, message: dict) -> dict:
    config = json.loads((cluster.home / "node" / "worker.json").read_text())["services"]["gpushare"]["config"]
    return call(socket_path(config["socket_dir"], 0), read_authkey(config["authkey_file"]), message, 10)


def final(points: list[dict], name: str) -> float:
    return max((p for p in points if p["name"] == name), key=lambda p: (p["step"], p["id"]))["value"]


def test_fractional_jobs_share_one_service_and_whole_gpu_jobs_use_a_child(cluster):
    pgid = cluster.process.pid
    shared = [cluster.submit(job(f"e2e-shared-{n}", 0.5, epochs=6))["id"] for n in range(2)]
    children_seen = set()

    def both_running():
        children_seen.update(p.pid for p in training_children(pgid))
        return all(cluster.job(job_id)["state"] in {"RUNNING", "SUCCEEDED"} for job_id in shared)

    wait_for(both_running, 60, message="both shared jobs to run")
    deadline = time.monotonic() + 90
    while not all(cluster.job(job_id)["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"} for job_id in shared):
        children_seen.update(p.pid for p in training_children(pgid))
        assert time.monotonic() < deadline, f"the shared jobs did not end:\n{cluster.output()}"
        time.sleep(0.2)
    assert not children_seen, "a fractional job ran in a child process"

    pids = set()
    for job_id in shared:
        record = cluster.job(job_id)
        assert record["state"] == "SUCCEEDED", (record, cluster.logs(job_id), cluster.output())
        logs = "\n".join(cluster.logs(job_id))
        match = re.search(r"shared: running in the GPU-sharing service \(pid (\d+), policy (\w+)", logs)
        assert match, logs
        pids.add(int(match.group(1)))
        points = cluster.metrics(job_id)
        assert final(points, "test_accuracy") > 0.8
        assert math.isfinite(final(points, "loss")) and final(points, "loss") < 1.0
        assert {"loss", "accuracy", "samples_per_s", "test_loss", "test_accuracy"} <= {p["name"] for p in points}
        assert "model.pt" in {a["name"] for a in cluster.get(f"jobs/{job_id}/artifacts/")}
    assert len(pids) == 1, f"the two jobs ran in different services: {pids}"

    status = service_call(cluster, {"op": "status"})["status"]
    attempts = {cluster.job(job_id)["attempts"][0]["id"] for job_id in shared}
    assert attempts <= set(status["jobs"])
    assert all(status["jobs"][a]["state"] == "succeeded" for a in attempts)
    # Interleaved: the executor switched between them many times.
    assert status["counters"]["switches"] > 20, status["counters"]
    print(f"\nshared: {status['counters']['switches']} switches, switch latency "
          f"p50 {1000 * status['counters']['switch_latency']['p50_s']:.3f} ms "
          f"p99 {1000 * status['counters']['switch_latency']['p99_s']:.3f} ms")

    # A whole-GPU job still runs in its own child process.
    whole = cluster.submit(job("e2e-whole", 1, epochs=20))["id"]
    wait_for(lambda: training_children(pgid) or cluster.job(whole)["state"] == "SUCCEEDED", 60,
             message="the whole-GPU job's child process")
    record = cluster.wait_state(whole, {"SUCCEEDED", "FAILED", "CANCELLED"}, 90)
    assert record["state"] == "SUCCEEDED", (record, cluster.output())
    logs = "\n".join(cluster.logs(whole))
    assert "attempt 1 rank 0 starting" in logs and "GPU-sharing service" not in logs
    assert record["attempts"][0]["id"] not in service_call(cluster, {"op": "status"})["status"]["jobs"]


def test_service_death_requeues_the_attempt_without_a_failure_and_the_service_restarts(cluster):
    """Killing the service is a lost node for its attempts: requeued (no failure counted, even with
    max_attempts 1), resumed from the checkpoint in the restarted service."""
    job_id = cluster.submit({**job("e2e-shared-long", 0.5, epochs=30), "max_attempts": 1})["id"]
    cluster.wait_state(job_id, {"RUNNING"}, 60)
    wait_for(lambda: any(p["name"] == "loss" for p in cluster.metrics(job_id)), 60, message="the first metrics")
    old = service_call(cluster, {"op": "ping"})["pid"]
    os.kill(old, signal.SIGKILL)

    def restarted():
        try:
            return service_call(cluster, {"op": "ping"})["pid"] != old
        except (OSError, EOFError):  # not listening yet, or the dead one's socket
            return False

    wait_for(restarted, 30, message="the node agent to restart the service")
    record = cluster.wait_state(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, 120)
    logs = "\n".join(cluster.logs(job_id))
    assert record["state"] == "SUCCEEDED", (record, logs, cluster.output())
    assert record["failures"] == 0, record
    attempts = sorted(record["attempts"], key=lambda a: a["number"])
    assert [a["number"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["outcome"] == "service_lost", attempts
    assert attempts[0]["exit_reason"].startswith("GPU-sharing service died; requeued"), attempts
    assert attempts[1]["outcome"] == "succeeded", attempts
    pids = re.findall(r"shared: running in the GPU-sharing service \(pid (\d+)", logs)
    assert len(pids) == 2 and int(pids[0]) == old and int(pids[1]) != old, (pids, old)
