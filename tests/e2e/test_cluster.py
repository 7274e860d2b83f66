"""End-to-end: ``strata up`` as real processes, jobs through the CLI and the REST API."""

from __future__ import annotations

import io
import os
import signal
import time

import psutil
import pytest
import yaml
from e2e_support import TERMINAL, group_processes, training_children, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SHORT_JOB = {"name": "e2e-digits", "kind": "train", "resources": {"gpus": 1}, "max_attempts": 1,
             "spec": {"workload": "mlp-digits", "epochs": 2, "batch_size": 64}}


def long_job(name: str, epochs: int = 60, max_attempts: int = 1) -> dict:
    # About 90 steps per epoch at batch size 16; a few hundred steps a second on one CPU thread.
    return {"name": name, "kind": "train", "resources": {"gpus": 1}, "max_attempts": max_attempts,
            "spec": {"workload": "mlp-digits", "epochs": epochs, "batch_size": 16, "log_every": 100,
                     "checkpoint_every": 250}}


def write_job(directory, name: str, body: dict):
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def latest_step(cluster, job_id: str) -> int:
    return max((point["step"] for point in cluster.metrics(job_id)), default=0)


def test_submit_wait_succeeds_and_failure_fails(cluster, tmp_path):
    result = cluster.cli("submit", str(write_job(tmp_path, "ok", SHORT_JOB)), "--wait", "--timeout", "120")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job_id = result.stdout.split()[2]
    assert "SUCCEEDED" in result.stdout

    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED"
    assert [a["outcome"] for a in job["attempts"]] == ["succeeded"]
    names = {point["name"] for point in cluster.metrics(job_id)}
    assert {"loss", "accuracy", "samples_per_s"} <= names

    artifacts = {a["name"]: a for a in cluster.get(f"jobs/{job_id}/artifacts/")}
    assert "model.pt" in artifacts
    response = cluster.session.get(
        f"{cluster.url}/api/v1/jobs/{job_id}/artifacts/{artifacts['model.pt']['id']}/download/", timeout=30)
    response.raise_for_status()
    assert len(response.content) == artifacts["model.pt"]["size"] > 0
    import torch

    state = torch.load(io.BytesIO(response.content), map_location="cpu", weights_only=True)
    assert state["workload"] == "mlp-digits"
    tensors = state["state_dict"]
    assert tensors and all(isinstance(v, torch.Tensor) for v in tensors.values())

    failing = {"name": "e2e-broken", "kind": "train", "resources": {"gpus": 1}, "max_attempts": 1,
               "spec": {"entrypoint": "components.train.no_such_module:main"}}
    result = cluster.cli("submit", str(write_job(tmp_path, "broken", failing)), "--wait", "--timeout", "120")
    assert result.returncode != 0, result.stdout
    job_id = result.stdout.split()[2]
    job = cluster.job(job_id)
    assert job["state"] == "FAILED", job
    # An entrypoint that cannot be imported is the job's own error: it fails at once (user_error), not retried.
    assert job["failures"] == 1 and [a["outcome"] for a in job["attempts"]] == ["user_error"]
    assert "no_such_module" in job["attempts"][0]["exit_reason"] + job["reason"] + "\n".join(cluster.logs(job_id))


def test_cancel_running_job_stops_child_and_frees_device(cluster):
    job_id = cluster.submit(long_job("e2e-cancel", epochs=200))["id"]
    cluster.wait_state(job_id, {"RUNNING"}, 60)
    pgid = cluster.process.pid
    wait_for(lambda: latest_step(cluster, job_id) > 0, 60, message="the first metrics")
    assert training_children(pgid), "no training child process found"

    cancelled_at = time.monotonic()
    assert cluster.api("POST", f"jobs/{job_id}/cancel/")["state"] == "CANCELLED"
    assert cluster.job(job_id)["state"] == "CANCELLED"

    def settled():
        attempt = cluster.job(job_id)["attempts"][-1]
        return (not training_children(pgid) and attempt["ended_at"]
                and all(not a["active"] for a in attempt["allocations"]) and attempt)

    attempt = wait_for(settled, 15, message="the child to exit and the devices to be released")
    print(f"cancel settled in {time.monotonic() - cancelled_at:.1f} s")
    assert time.monotonic() - cancelled_at <= 15
    assert attempt["outcome"] == "cancelled", attempt
    assert cluster.job(job_id)["state"] == "CANCELLED"

    # The freed device takes the next job.
    follow_up = cluster.submit({**SHORT_JOB, "name": "e2e-after-cancel"})["id"]
    job = cluster.wait_state(follow_up, TERMINAL, 90)
    assert job["state"] == "SUCCEEDED", job
    print(f"follow-up job: created {job['created_at']} started {job['started_at']} finished {job['finished_at']}")


def test_cli_errors_and_listings(cluster, tmp_path):
    bad = write_job(tmp_path, "bad", {"name": "bad", "kind": "train", "spec": {"workload": "nope", "epochs": 0}})
    result = cluster.cli("submit", str(bad))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("strata: error:"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "workload" in lines[0] and "epochs" in lines[0]

    broken_yaml = tmp_path / "broken.yaml"
    broken_yaml.write_text('{"kind": "train", "spec": {"workload": "mlp-digits"}\n')
    for path in (tmp_path / "missing.yaml", write_job(tmp_path, "list", [1]), broken_yaml, tmp_path):
        result = cluster.cli("submit", str(path))
        assert result.returncode != 0
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("strata: error:"), result.stderr

    job_id = cluster.submit({**SHORT_JOB, "name": "e2e-listing"})["id"]
    cluster.wait_state(job_id, TERMINAL, 90)

    result = cluster.cli("jobs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split()[:5] == ["ID", "NAME", "KIND", "TEAM", "STATE"]
    assert job_id in result.stdout and "e2e-listing" in result.stdout

    result = cluster.cli("logs", job_id)
    assert result.returncode == 0, result.stderr
    assert "attempt 1 rank 0 starting" in result.stdout

    result = cluster.cli("quota", "demo")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("team demo")
    for field in ("max_concurrent_jobs", "max_gpus", "gpu_hours", "priority"):
        assert field in result.stdout


def test_node_killed_mid_job_is_requeued_and_resumes(bare_cluster):
    cluster = bare_cluster
    node = cluster.start_node("n1")
    # 25 epochs (2250 steps): room enough past step 600 for the kill to land mid-job, no more (the retry trains
    # the rest of them).
    job_id = cluster.submit(long_job("e2e-node-lost", epochs=25, max_attempts=2))["id"]
    cluster.wait_state(job_id, {"RUNNING"}, 60)
    # Two checkpoints (every 250 steps) are in by step 500.
    wait_for(lambda: latest_step(cluster, job_id) >= 600, 60, interval=0.2, message="training progress")

    tree = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
    children = training_children(node.pid)
    assert children, f"no training child in the node's process tree: {[p.cmdline() for p in tree]}"
    os.killpg(node.pid, signal.SIGKILL)
    node.wait(timeout=10)
    wait_for(lambda: not group_processes(node.pid), 10, message="the node's processes to die")
    assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)
    killed_at_step = latest_step(cluster, job_id)

    # The lease runs out: the attempt ends as node_lost and the job leaves RUNNING without a live node.
    job = wait_for(lambda: (j := cluster.job(job_id))["state"] != "RUNNING" and j, 30,
                   message="the job to leave RUNNING after its node died")
    assert job["state"] in {"QUEUED", "PENDING", "SCHEDULED"}, job
    assert job["attempts"][0]["outcome"] == "node_lost", job["attempts"]
    assert job["failures"] == 0

    cluster.start_node("n1")
    job = cluster.wait_state(job_id, TERMINAL, 120)
    assert job["state"] == "SUCCEEDED", f"{job}\n{cluster.output()}"
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    assert [a["outcome"] for a in job["attempts"]] == ["node_lost", "succeeded"]
    assert job["failures"] == 0
    assert job["attempts"][1]["node"] == "n1"
    logs = "\n".join(cluster.logs(job_id))
    assert "resumed" in logs, logs[-2000:]
    resumed_step, total_steps = map(int, logs.split("from the checkpoint at step ")[1].split()[0].split("/"))
    # Metrics are sent in batches, so the last checkpoint may be a little ahead of the last metric seen.
    assert 250 <= resumed_step < total_steps and resumed_step % 250 == 0, (resumed_step, killed_at_step)
