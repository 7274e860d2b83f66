"""End-to-end: a 2-replica deployment on two nodes survives killing one replica. The client fails over to the
other, and the scheduler replaces the killed one (its attempt is requeued and placed again)."""

from __future__ import annotations

import os
import signal

import numpy as np
import psutil
import pytest
from e2e_support import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def listener(port: int) -> psutil.Process:
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
            return psutil.Process(connection.pid)
    raise AssertionError(f"nothing listens on port {port}")


def test_a_two_replica_deployment_survives_losing_a_replica(bare_cluster):
    from components.runtime.client.client import ControlPlaneClient
    from components.serving.client import Balancer

    cluster = bare_cluster
    for name in ("node-a", "node-b"):
        cluster.start_node(name, virtual_gpus=1)
    wait_for(lambda: len(cluster.get("nodes/")["results"]) == 2, 90, message="two nodes")
    trained = cluster.submit({"name": "digits", "kind": "train", "resources": {"gpus": 0.5}, "max_attempts": 1,
                              "spec": {"workload": "mlp-digits", "epochs": 2, "batch_size": 32}})["id"]
    assert cluster.wait_state(trained, TERMINAL, 150)["state"] == "SUCCEEDED", cluster.output()

    # Two replicas, each on a whole (virtual) GPU: one on each node.
    deployment = cluster.submit({"name": "digits-2", "kind": "serve", "resources": {"gpus": 1}, "max_attempts": 5,
                                 "spec": {"model": {"job": trained}, "replicas": 2, "slo_ms": 5000}})["id"]
    replicas = wait_for(lambda: (r := cluster.get(f"jobs/{deployment}/replicas/")) and len(r["endpoints"]) == 2 and r,
                        150, message="two running replicas")
    assert replicas["wanted"] == 2 and [row["primary"] for row in replicas["replicas"]] == [True, False]
    child = replicas["replicas"][1]
    assert cluster.job(child["job"])["parent"] == deployment

    # One deployment token works on every replica (children answer their parent's tokens).
    token = cluster.api("POST", f"jobs/{deployment}/tokens/", json={"name": "app"})["token"]
    api = ControlPlaneClient(cluster.url, cluster.credentials["token"])
    balancer = Balancer.for_job(api, deployment, token=token, refresh_s=1.0, retry_after_s=2.0)

    def all_answer():
        try:
            return all(balancer.predict(np.zeros((1, 64), np.float32), timeout=10).shape == (1, 10)
                       for _ in range(4))
        except Exception:
            return False

    wait_for(all_answer, 60, message="both replicas to learn the token")
    rows = np.random.default_rng(0).random((1, 64), dtype=np.float32)

    # Kill the child replica's serving process: calls go on, on the other replica.
    port = int(child["endpoint"].rsplit(":", 1)[1])
    victim = listener(port)
    os.kill(victim.pid, signal.SIGKILL)
    answered = [balancer.predict(rows, timeout=10) for _ in range(20)]
    assert all(answer.shape == (1, 10) for answer in answered)
    assert balancer.failovers >= 1 or port not in [int(e.rsplit(":", 1)[1]) for e in balancer.endpoints()]

    # The scheduler replaces it: the child's attempt is requeued and placed again, with a new endpoint.
    def replaced():
        current = cluster.get(f"jobs/{deployment}/replicas/")
        return len(current["endpoints"]) == 2 and child["endpoint"] not in current["endpoints"] and current

    current = wait_for(replaced, 150, message="the killed replica to be replaced")
    attempts = cluster.job(child["job"])["attempts"]
    assert len(attempts) >= 2 and attempts[0]["ended_at"] is not None, attempts
    wait_for(all_answer, 60, message="the replacement to answer")
    assert len(current["replicas"]) == 2

    # Cancelling the deployment takes its replicas with it.
    cluster.api("POST", f"jobs/{deployment}/cancel/")
    assert cluster.wait_state(deployment, TERMINAL, 60)["state"] == "CANCELLED"
    wait_for(lambda: cluster.job(child["job"])["state"] in TERMINAL, 60, message="the child replica to end")
