"""End-to-end: a 2-worker data-parallel train job across two nodes of ``strata up``. The ranks find each other
through the control plane (rank 0 publishes its store's port; the address is the one its node registered),
train one model with DDP on gloo, report rank-tagged metrics; killing one worker mid-job ends the attempt, and
the retry resumes from the checkpoint."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from e2e_support import TERMINAL, login, training_children, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def gang_job(name: str, epochs: int, strategy: str = "ddp", max_attempts: int = 1, **extra) -> dict:
    return {"name": name, "kind": "train", "resources": {"gpus": 1, "workers": 2}, "max_attempts": max_attempts,
            "spec": {"workload": "mlp-digits", "epochs": epochs, "batch_size": 32, "log_every": 10,
                     "checkpoint_every": 40, "distributed": {"strategy": strategy, **extra}}}


def names(cluster, job_id: str) -> set[str]:
    return {point["name"] for point in cluster.metrics(job_id)}


def last(cluster, job_id: str, name: str) -> float:
    return [point["value"] for point in cluster.metrics(job_id) if point["name"] == name][-1]


def test_a_gang_trains_one_model_across_two_nodes_and_survives_a_lost_worker(bare_cluster):
    cluster = bare_cluster
    nodes = {name: cluster.start_node(name) for name in ("n1", "n2")}
    wait_for(lambda: len([n for n in cluster.get("nodes/")["results"] if n["state"] == "up"]) == 2, 60,
             message="two nodes to register")

    done = cluster.submit(gang_job("e2e-ddp", epochs=4))
    job = cluster.wait_state(done["id"], TERMINAL, 240)
    assert job["state"] == "SUCCEEDED", f"{job}\n{cluster.output()}"
    placed = {allocation["node"] for allocation in job["attempts"][0]["allocations"]}
    assert placed == {"n1", "n2"}, job["attempts"][0]["allocations"]
    logs = "\n".join(cluster.logs(done["id"]))
    assert "[rank 1] rank 1/2 joined the gloo group at 127.0.0.1:" in logs, logs[-3000:]
    assert "on 2 workers (ddp, gloo" in logs, logs[-3000:]
    assert {"rank0.step_ms", "rank1.step_ms", "rank0.loss", "rank1.loss"} <= names(cluster, done["id"])
    assert last(cluster, done["id"], "test_accuracy") >= 0.9
    events = cluster.get(f"jobs/{done['id']}/events/")
    rendezvous = [event for event in events if event["kind"] == "rendezvous"]
    assert len(rendezvous) == 1 and "127.0.0.1:" in rendezvous[0]["message"], events

    # SMS with worker 1 slowed 2x, both workers on half of one GPU (a gang on a shared device, one node): its
    # report (stragglers, samples dropped, bytes) reaches the API and the page.
    body = gang_job("e2e-sms", epochs=3, strategy="sms", slow={"ranks": [1], "factor": 2.0})
    body["resources"]["gpus"] = 0.5
    sms = cluster.submit(body)
    job = cluster.wait_state(sms["id"], TERMINAL, 240)
    assert job["state"] == "SUCCEEDED", f"{job}\n{cluster.output()}"
    report = job["attempts"][0]["reports"]["straggler"]["payload"]
    assert report["strategy"] == "sms" and report["world_size"] == 2 and report["step"] > 0
    shared = job["attempts"][0]["allocations"]
    assert len(shared) == 2 and {a["share"] for a in shared} == {0.5} and len({a["node"] for a in shared}) == 1
    assert [rank["node"] for rank in report["ranks"]] == [shared[0]["node"]] * 2
    assert report["bytes_full"] > 0 and report["heatmap"]["steps"]
    assert last(cluster, sms["id"], "test_accuracy") >= 0.8
    browser = login(cluster)
    panels = {panel["slug"] for panel in
              browser.get(f"{cluster.url}/jobs/{sms['id']}/live/?panels=1", timeout=30).json()["panels"]}
    assert {"straggler-heatmap", "straggler-predictions", "straggler-savings"} <= panels, panels

    # A worker dies mid-job: the attempt ends (the other rank is stopped, not left waiting), the job is
    # retried, and the retry resumes from the checkpoint.
    # 40 epochs (880 gang steps): room enough past step 100 for the kill to land mid-job, no more (the retry
    # trains the rest of them).
    job_id = cluster.submit(gang_job("e2e-ddp-lost", epochs=40, max_attempts=2))["id"]
    cluster.wait_state(job_id, {"RUNNING"}, 90)
    wait_for(lambda: last_step(cluster, job_id) >= 100, 120, interval=0.3, message="training progress")
    victims = training_children(nodes["n2"].pid)
    assert victims, "no training child on n2"
    os.kill(victims[0].pid, signal.SIGKILL)
    job = cluster.wait_state(job_id, TERMINAL, 300)
    assert job["state"] == "SUCCEEDED", f"{job}\n{cluster.output()}"
    first, second = job["attempts"]
    assert first["outcome"] == "failed" and "killed by signal 9" in first["exit_reason"], first
    assert second["outcome"] == "succeeded"
    logs = "\n".join(cluster.logs(job_id))
    assert "from the checkpoint at step" in logs, logs[-3000:]
    resumed = int(logs.split("from the checkpoint at step ")[1].split("/")[0])
    assert resumed >= 40 and resumed % 40 == 0, resumed
    assert all(not process.is_running() or process.status() == psutil.STATUS_ZOMBIE for process in victims)


def last_step(cluster, job_id: str) -> int:
    return max((point["step"] for point in cluster.metrics(job_id)), default=0)
