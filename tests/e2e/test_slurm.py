"""End-to-end: Strata nodes as Slurm jobs (deploy/slurm/strata-node.sbatch) on a real single-node Slurm.

The test starts munged, slurmctld and slurmd itself (tests/e2e/slurm_support.py: Debian's ``slurm-wlm`` 22.05 and
``munge``, installed by ``make slurm``), as root on 127.0.0.1, and submits the node script with ``sbatch``. A job
submitted to Strata runs on the Slurm-launched node; ``scancel`` of that Slurm job makes the node leave, so its
attempt is requeued without counting a failure and finishes on another node. ``scancel --signal=USR1 --batch``
(what ``--signal=B:USR1@<s>`` sends before the time limit) drains it: new work goes elsewhere, its own attempt
finishes there, then it leaves by itself and its Slurm job ends. A short allocation drains before its time limit
(the script reads the end time from squeue) and ends early.

Like the other services the suite needs, Slurm is never silently skipped where it is required: with
STRATA_REQUIRE_SERVICES=1 (CI) a Slurm that is missing or does not start fails the test, with the daemons' logs.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest
from e2e_support import TERMINAL, e2e_env, strata_command, wait_for
from slurm_support import SlurmCluster, SlurmUnavailable

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "strata-node.sbatch"
REQUIRED = os.environ.get("STRATA_REQUIRE_SERVICES") == "1"


def long_job(name: str, epochs: int) -> dict:
    # max_attempts 1: an attempt counted as a failure would fail the job, so SUCCEEDED after a requeue proves it
    # was not counted.
    return {"name": name, "kind": "train", "resources": {"gpus": 1}, "max_attempts": 1,
            "spec": {"workload": "mlp-digits", "epochs": epochs, "batch_size": 16, "log_every": 100,
                     "checkpoint_every": 250}}


SHORT_JOB = {"name": "slurm-short", "kind": "train", "resources": {"gpus": 1}, "max_attempts": 1,
             "spec": {"workload": "mlp-digits", "epochs": 1, "batch_size": 64}}


@pytest.fixture
def slurm(tmp_path):
    cluster = SlurmCluster(tmp_path / "slurm")
    try:
        cluster.start()
    except SlurmUnavailable as error:
        left = cluster.stop()
        if REQUIRED:
            pytest.fail(f"Slurm is required (STRATA_REQUIRE_SERVICES=1) but did not start: {error}\n"
                        f"left running: {left}", pytrace=False)
        pytest.skip(f"no Slurm here ({str(error).splitlines()[0]}); make slurm installs it, and the test runs as "
                    "root")
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"processes left after the Slurm teardown: {left}"


def start_slurm_node(cluster, slurm: SlurmCluster, virtual_gpus: int = 2, time_limit: str = "30",
                     extra: dict | None = None) -> str:
    """sbatch the node script pointed at ``cluster``; the Slurm job's id. The default 30 minutes: the drain
    before the time limit (300 s by default) never starts during the test."""
    env = e2e_env(STRATA_SERVER=cluster.url, STRATA_NODE_TOKEN=cluster.credentials["node_token"],
                  STRATA=shlex.join(strata_command()), STRATA_VIRTUAL_GPUS=str(virtual_gpus),
                  STRATA_NODE_ADDRESS="127.0.0.1", STRATA_NODE_STATE_DIR=str(cluster.home / "node-slurm"),
                  **(extra or {}))
    return slurm.sbatch(SCRIPT, f"--time={time_limit}", env=env)


def node(cluster, name: str) -> dict | None:
    nodes = cluster.get("nodes/")
    if isinstance(nodes, dict):
        nodes = nodes.get("results", [])
    return next((item for item in nodes if item["name"] == name), None)


def wait_node(cluster, slurm: SlurmCluster, name: str, state: str, timeout: float = 120.0) -> dict:
    def ready():
        found = node(cluster, name)
        return found if found is not None and found["state"] == state else None

    try:
        return wait_for(ready, timeout, message=f"node {name} to be {state}")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{cluster.output()}\n{slurm.logs()}") from None


def wait_running_on(cluster, slurm, job_id: str, name: str) -> dict:
    try:
        job = cluster.wait_state(job_id, {"RUNNING"}, 180)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{cluster.job(job_id)}\n{cluster.output()}\n{slurm.logs()}") from None
    assert job["attempts"][-1]["node"] == name, job["attempts"]
    # Past the start-up: the child trains (a metric is in).
    wait_for(lambda: cluster.metrics(job_id), 120, interval=0.3, message="the first metrics")
    return job


def test_a_slurm_node_runs_a_job_and_scancel_requeues_it_elsewhere(bare_cluster, slurm):
    cluster = bare_cluster
    slurm_job = start_slurm_node(cluster, slurm)
    name = f"slurm-{slurm_job}"
    registered = wait_node(cluster, slurm, name, "up")
    assert registered["labels"] == {"slurm_job": slurm_job, "partition": "debug"}
    assert len(registered["devices"]) == 2 and all(d["kind"] == "virtual" for d in registered["devices"])
    assert slurm.job_state(slurm_job) == "RUNNING"

    job_id = cluster.submit(long_job("slurm-requeue", epochs=30))["id"]
    wait_running_on(cluster, slurm, job_id, name)

    slurm.run("scancel", slurm_job)
    # The node left: its attempt ended node_lost, the job waits again (no other node yet), no failure counted.
    job = wait_for(lambda: (j := cluster.job(job_id))["attempts"][0]["outcome"] and j, 90,
                   message="the Slurm node's attempt to end")
    assert job["attempts"][0]["outcome"] == "node_lost", job["attempts"]
    assert job["failures"] == 0 and job["state"] in {"QUEUED", "PENDING", "SCHEDULED"}, job
    wait_node(cluster, slurm, name, "down", timeout=60)
    wait_for(lambda: slurm.job_state(slurm_job) is None, 90, message=f"Slurm job {slurm_job} to leave squeue")
    log = (slurm.root / "jobs" / f"slurm-{slurm_job}.out").read_text(errors="replace")
    assert "left the cluster; 1 attempt(s) requeued" in log, log[-3000:]
    assert "ends 20" in log, log[-3000:]  # the script read the allocation's end from squeue

    cluster.start_node("other")
    job = cluster.wait_state(job_id, TERMINAL, 300)
    assert job["state"] == "SUCCEEDED", f"{job}\n{cluster.output()}"
    assert [a["outcome"] for a in job["attempts"]] == ["node_lost", "succeeded"]
    assert [a["node"] for a in job["attempts"]] == [name, "other"]
    assert job["failures"] == 0
    assert node(cluster, name)["state"] == "down"


def test_usr1_drains_the_slurm_node_which_leaves_when_its_work_is_done(bare_cluster, slurm):
    cluster = bare_cluster
    slurm_job = start_slurm_node(cluster, slurm, virtual_gpus=2)
    name = f"slurm-{slurm_job}"
    wait_node(cluster, slurm, name, "up")
    # Long enough (about 13,500 steps) to be still running on the draining node when the second job comes.
    first = cluster.submit(long_job("slurm-drained", epochs=150))["id"]
    wait_running_on(cluster, slurm, first, name)

    # What --signal=B:USR1@<s> sends before the time limit: the batch shell (the agent, after exec) only.
    slurm.run("scancel", "--signal=USR1", "--batch", slurm_job)
    wait_node(cluster, slurm, name, "draining", timeout=60)
    # The node has a free device, but takes no new work while it drains.
    second = cluster.submit({**SHORT_JOB, "name": "slurm-after-drain"})["id"]
    time.sleep(4)  # a few scheduler ticks (1 s each here)
    assert cluster.job(first)["state"] == "RUNNING"
    waiting = cluster.job(second)
    assert waiting["state"] in {"QUEUED", "PENDING"} and not waiting["attempts"], waiting

    cluster.start_node("other")
    done = cluster.wait_state(second, TERMINAL, 240)
    assert done["state"] == "SUCCEEDED" and [a["node"] for a in done["attempts"]] == ["other"], done

    # The drained node's own attempt finishes there, then the node leaves and its Slurm job ends.
    finished = cluster.wait_state(first, TERMINAL, 300)
    assert finished["state"] == "SUCCEEDED", f"{finished}\n{cluster.output()}"
    assert [(a["node"], a["outcome"]) for a in finished["attempts"]] == [(name, "succeeded")]
    wait_node(cluster, slurm, name, "down", timeout=90)
    wait_for(lambda: slurm.job_state(slurm_job) is None, 90, message=f"Slurm job {slurm_job} to end")
    log = (slurm.root / "jobs" / f"slurm-{slurm_job}.out").read_text(errors="replace")
    assert "drained: no attempt left; leaving" in log, log[-3000:]


def test_the_node_drains_before_the_time_limit_and_ends_its_slurm_job_early(bare_cluster, slurm):
    cluster = bare_cluster
    # A 3-minute allocation drained 170 s before its end: at once, as the script read the end time from squeue.
    slurm_job = start_slurm_node(cluster, slurm, time_limit="3", extra={"STRATA_DRAIN_BEFORE": "170"})
    name = f"slurm-{slurm_job}"
    wait_for(lambda: node(cluster, name), 120, message=f"node {name} to register")
    # Nothing to finish: drained at once, it leaves, and its Slurm job ends long before the time limit.
    wait_node(cluster, slurm, name, "down", timeout=120)
    wait_for(lambda: slurm.job_state(slurm_job) is None, 90, message=f"Slurm job {slurm_job} to end")
    log = (slurm.root / "jobs" / f"slurm-{slurm_job}.out").read_text(errors="replace")
    assert ": draining" in log and "drained: no attempt left; leaving" in log, log[-3000:]
    assert "ends ?" not in log, log[-3000:]
