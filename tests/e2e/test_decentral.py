"""End-to-end: a decentralized-train job's swarm on a node of ``strata up``, a volunteer that joins it with
``strata peer join JOB --token T`` and is stopped when the job is cancelled, and one without a valid token that
cannot join."""

from __future__ import annotations

import subprocess
import time

import pytest
from e2e_support import TERMINAL, e2e_env, strata_command, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]


def swarm_report(cluster, job_id: str) -> dict:
    job = cluster.job(job_id)
    for attempt in job.get("attempts") or []:
        payload = ((attempt.get("reports") or {}).get("decentral") or {}).get("payload")
        if payload:
            return payload
    return {}


def test_a_swarm_takes_a_volunteer_with_a_job_token_and_stops_it_on_cancel(bare_cluster):
    cluster = bare_cluster
    cluster.start_node("n1", virtual_gpus=1)
    wait_for(lambda: any(n["state"] == "up" for n in cluster.get("nodes/")["results"]), 60,
             message="the node to register")
    job = cluster.submit({"name": "e2e-swarm", "kind": "decentralized-train", "max_attempts": 1,
                          "resources": {"gpus": 0.25, "workers": 2},
                          "spec": {"model": "tiny", "steps": 1_000_000, "batch_size": 8, "eval_every": 50,
                                   "peers": {"min": 2, "max": 4}, "averaging": {"period_s": 2.0}}})
    job_id = job["id"]
    cluster.wait_state(job_id, {"RUNNING"}, 120)
    wait_for(lambda: len(swarm_report(cluster, job_id).get("peers") or []) >= 2, 180, interval=1.0,
             message=f"the two cluster peers in the swarm report\n{cluster.output()}")
    events = cluster.get(f"jobs/{job_id}/events/")
    assert any(event["kind"] == "rendezvous" and "/p2p/" in event["message"] for event in events), events

    token = cluster.api("POST", f"jobs/{job_id}/tokens/", json={"name": "volunteer"})["token"]
    volunteer = subprocess.Popen([*strata_command(), "peer", "join", job_id, "--token", token, "--server", cluster.url,
                                  "--name", "ann"], env=e2e_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, start_new_session=True)
    try:
        # While the volunteer starts: a peer without a valid token is refused (and is no participant below).
        refused = subprocess.run([*strata_command(), "peer", "join", job_id, "--token", "sj_not_a_token",
                                  "--server", cluster.url], env=e2e_env(), capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode != 0
        assert "Traceback" not in refused.stderr and refused.stderr.strip().count("\n") == 0, refused.stderr

        def joined() -> bool:
            peers = swarm_report(cluster, job_id).get("peers") or []
            return any(peer.get("volunteer") and (peer.get("rounds_ok") or 0) >= 1 for peer in peers)

        wait_for(joined, 240, interval=1.0, message="the volunteer to average with the swarm")
        participants = cluster.get(f"jobs/{job_id}/participants/")
        assert [p["state"] for p in participants] == ["active"] and participants[0]["name"] == "ann", participants

        cluster.api("POST", f"jobs/{job_id}/cancel/")
        final = cluster.wait_state(job_id, TERMINAL, 120)
        assert final["state"] == "CANCELLED"
        # The volunteer's next heartbeat answers stop: it leaves by itself.
        output, _ = volunteer.communicate(timeout=120)
        assert volunteer.returncode == 0, output[-3000:]
        assert "peer volunteer-ann:" in output, output[-3000:]
        deadline = time.time() + 60
        while time.time() < deadline:
            states = {p["state"] for p in cluster.get(f"jobs/{job_id}/participants/")}
            if states <= {"stopped", "left"}:
                break
            time.sleep(1)
        assert states <= {"stopped", "left"}, states
    finally:
        if volunteer.poll() is None:
            volunteer.kill()
            volunteer.wait(10)
