"""A broker (Redis) restart does not cost the jobs running on the nodes, and a broker wipe loses no queued job.

A real control plane (``strata up --virtual-gpus 0``: ``strata server`` and ``strata scheduler``) and a real
``strata node`` use a redis-server this test starts itself (append-only file, its own port and directory).

- Dropped connections (Redis stays up: kombu may put the running attempt's message back, and a second delivery
  ends at its refused claim), then a restart (SIGTERM, ~2 s down, started again on its append-only file), while
  one job runs: the attempt's child process lives on, and so does the node's Celery worker (same process: it
  neither crashed nor hung, so the agent's restart of a stalled worker is not what saves it); the job ends
  SUCCEEDED with exactly one attempt and every progress step reported once, and a job submitted after the
  restart runs too.
- Wipe (restarted without its data) while a dispatch waits in Redis: the reconciler republishes it
  (``STRATA_DISPATCH_REPUBLISH_SECONDS``) and the job runs, still with one attempt.

Before the fix (components/runtime/shared/broker.py) the worker died of ``AttributeError: 'NoneType' object has no
attribute 'hostname'`` on the restart (the agent restarted it), and cancelled the running attempt.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import psutil
import pytest
import redis
from e2e_support import Cluster, training_children
from support import free_port, reaper, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

REPUBLISH_S = 3  # STRATA_DISPATCH_REPUBLISH_SECONDS: the reconciler republishes unclaimed dispatches this old
LONG_S = 18  # the job that runs through both
# Torch-free jobs (no CPU spent training on a loaded machine): "work" for ``options.seconds``, a progress metric
# every half second.
JOB_MODULE = '''
import time


def main(ctx):
    steps = int(float(ctx.spec["options"]["seconds"]) * 2)
    for step in range(steps):
        ctx.metric("progress", float(step), step)
        time.sleep(0.5)
'''


def sleeper(name: str, seconds: float) -> dict:
    return {"name": name, "kind": "train", "max_attempts": 1, "resources": {"gpus": 1},
            "spec": {"entrypoint": "brokerrestart_job:main", "options": {"seconds": seconds}}}


class Broker:
    """A redis-server on a free loopback port, keeping its append-only file in ``directory``."""

    def __init__(self, directory, start):
        self.directory, self.start_process = directory, start
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.process = self.start_process(
            [shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=(self.directory / "redis.out").open("ab"), stderr=subprocess.STDOUT)
        wait_for(lambda: self._ping(), 30, message="redis-server to answer")

    def stop(self, wipe: bool = False) -> None:
        self.process.send_signal(signal.SIGTERM)  # redis-server writes its append-only file and exits
        self.process.wait(timeout=30)
        if wipe:
            for path in self.directory.glob("appendonly*"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def _ping(self) -> bool:
        try:
            with self.client() as client:
                return client.ping()
        except redis.RedisError:
            return False


class BrokerCluster(Cluster):
    """:class:`Cluster` on a given broker: ``strata up`` and the node get ``STRATA_BROKER_URL``."""

    def __init__(self, home, broker_url: str):
        super().__init__(home, virtual_gpus=0)
        self.env = dict(STRATA_BROKER_URL=broker_url, STRATA_DISPATCH_REPUBLISH_SECONDS=str(REPUBLISH_S),
                           # far beyond this test: the agent's restart of a stalled worker must not be needed
                           STRATA_CLAIM_TIMEOUT_SECONDS="3600", STRATA_SCHEDULER_METRICS_PORT="0",
                           STRATA_NODE_SERVICES_DISABLE="gpushare,datacache,straggler")

    def start(self, timeout: float = 120.0) -> BrokerCluster:
        (self.home / "jobs").mkdir(parents=True, exist_ok=True)
        (self.home / "jobs" / "brokerrestart_job.py").write_text(JOB_MODULE)
        super().start(timeout)
        return self

    def start_node(self, name: str, virtual_gpus: int = 1, env: dict | None = None) -> subprocess.Popen:
        return super().start_node(name, virtual_gpus, env={**self.env, "PYTHONPATH": str(self.home / "jobs"),
                                                          **(env or {})})

    def wait(self, predicate, timeout: float, what: str):
        try:
            return wait_for(predicate, timeout, message=what, interval=0.3)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.output()}") from None

    def ended(self, job_id: str, timeout: float) -> dict:
        return self.wait(lambda: (job := self.job(job_id))["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"} and job,
                         timeout, f"job {job_id} to end")


def celery_worker(agent: subprocess.Popen) -> psutil.Process:
    """The node's Celery worker: the agent's child running ``celery ... worker``."""
    workers = []
    for child in psutil.Process(agent.pid).children():
        try:
            if "celery" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                workers.append(child)
        except psutil.Error:
            continue
    assert len(workers) == 1, workers
    return workers[0]


def ran_once(job: dict) -> None:
    assert job["state"] == "SUCCEEDED", job
    assert [(a["number"], a["outcome"]) for a in job["attempts"]] == [(1, "succeeded")], job["attempts"]


def test_running_and_queued_jobs_survive_a_broker_restart_and_a_wipe(tmp_path):
    if shutil.which("redis-server") is None:
        if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
            pytest.fail("STRATA_REQUIRE_SERVICES=1: redis-server is not installed")
        pytest.skip("redis-server is not installed")
    with reaper(grace=1.0) as start:
        broker = Broker(tmp_path / "redis", start)
        broker.start()
        cluster = BrokerCluster(tmp_path / "home", broker.url).start()
        agent = cluster.start_node("n1", virtual_gpus=2)
        try:
            # -- dropped connections, then a restart with its data, while a job runs --------------------------
            long_id = cluster.submit(sleeper("through-restart", LONG_S))["id"]
            children = cluster.wait(lambda: training_children(agent.pid), 120, "the job's child process")
            worker = celery_worker(agent)
            cluster.wait(lambda: cluster.job(long_id)["state"] == "RUNNING", 60, "the job to run")
            with broker.client() as client:  # every client's connection dropped, the broker itself stays up
                assert client.client_kill_filter(_type="normal", skipme=True) >= 1
            time.sleep(2)
            assert children[0].is_running(), cluster.output()
            broker.stop()
            time.sleep(2)  # down for a while: the worker notices and retries
            broker.start()
            # Not cancelled on the connection loss: the attempt's child still runs.
            assert children[0].is_running() and cluster.job(long_id)["state"] == "RUNNING", cluster.output()
            after_id = cluster.submit(sleeper("after-restart", 1))["id"]

            long = cluster.ended(long_id, 180)
            ran_once(long)
            assert sorted(point["step"] for point in cluster.metrics(long_id)) == list(range(LONG_S * 2))
            ran_once(cluster.ended(after_id, 120))
            assert worker.is_running() and celery_worker(agent).pid == worker.pid, cluster.output()

            # -- wipe, while a dispatch waits in Redis ---------------------------------------------------------
            worker.suspend()  # takes nothing from its queue ...
            try:
                time.sleep(1.5)  # ... once the BRPOP it may have sent runs out (kombu's brpop_timeout: 1 s)
                wiped_id = cluster.submit(sleeper("wiped-dispatch", 1))["id"]

                def dispatch_queued() -> bool:
                    with broker.client() as client:
                        return any(client.llen(key) for key in client.keys("node.*"))

                cluster.wait(dispatch_queued, 60, "the dispatch to wait in the node's Redis queue")
                broker.stop(wipe=True)
                broker.start()
                with broker.client() as client:
                    assert not client.keys("node.*")  # the dispatch is gone with the broker's data
            finally:
                worker.resume()
            ran_once(cluster.ended(wiped_id, 180))
            assert celery_worker(agent).pid == worker.pid
        finally:
            cluster.stop()
