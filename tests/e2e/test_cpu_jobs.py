"""End-to-end: a job that needs no GPU (``resources.gpus: 0``) runs on a real ``strata up`` node's CPUs.

The node reports its CPUs and memory at registration; the job reserves one CPU on the node's CPU device, is
dispatched to the node's queue, claimed, and its child starts with no device (torch's "cpu"); it is accounted in
CPU-seconds, not GPU-seconds.
"""

from __future__ import annotations

import pytest
from e2e_support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CPU_JOB = {"name": "e2e-cpu", "kind": "train", "max_attempts": 1, "resources": {"gpus": 0, "cpus": 1},
           "spec": {"workload": "mlp-digits", "epochs": 1}}


def test_a_train_job_with_no_gpu_succeeds_on_the_nodes_cpus(cluster):
    node = wait_for(lambda: next(iter(cluster.get("nodes/")["results"]), None), 90, message="the node to register")
    assert node["cpus"] and node["cpus"] >= 1 and node["memory"], node
    assert all(device["kind"] != "cpu" for device in node["devices"]), node["devices"]

    job_id = cluster.submit(CPU_JOB)["id"]
    job = cluster.wait_state(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, 240)
    assert job["state"] == "SUCCEEDED", f"{job}\n{cluster.logs(job_id)}\n{cluster.output()}"
    assert job["resources"] == {"gpus": 0.0, "gpu_memory": None, "workers": 1, "cpus": 1.0, "memory": None}

    attempt = job["attempts"][0]
    assert attempt["outcome"] == "succeeded" and attempt["gpu_share"] == 0
    assert [(a["device_kind"], a["share"], a["active"]) for a in attempt["allocations"]] == [("cpu", 1.0, False)]
    assert any("starting on cpu" in line for line in cluster.logs(job_id)), cluster.logs(job_id)
    assert {"loss", "accuracy"} <= {point["name"] for point in cluster.metrics(job_id)}

    usage = cluster.get(f"quotas/{job['team']}/usage/")["usage"]
    assert usage["cpu_hours_total"] > 0 and usage["gpu_hours_total"] == 0
    assert usage["cpus"] == 0  # nothing held any more
