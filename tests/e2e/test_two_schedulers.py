"""Two `strata scheduler` replicas at once against one PostgreSQL and one Redis (docs/operations/production.md,
Replicas and leadership): every job runs exactly once, one scheduler holds the leader lease at a time, and when
the leader is killed the other takes over: it reaps a node lost meanwhile, and later jobs still run.

Needs PostgreSQL (the ``postgres`` marker: STRATA_DATABASE_URL, a fresh database is created next to it and
dropped afterwards) and Redis (STRATA_BROKER_URL, or redis://127.0.0.1:6379/0; a unique key prefix). Under
STRATA_REQUIRE_SERVICES=1 a missing service fails the test instead of skipping it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests
from e2e_support import TERMINAL, e2e_env, strata_command
from support import free_port, group_processes, reaper, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(600)]

JOBS = 20
LEASE_S = 5  # STRATA_LEADER_LEASE_SECONDS here (ticks every second): a dead leader is replaced within it
JOB_MODULE = '''
import time


def main(ctx):
    """A job that needs no torch: half a second of "work"."""
    time.sleep(0.5)
'''
SEED = '''
import json, django
django.setup()
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)
from strata.accounts import services
from strata.accounts.models import ApiToken, Membership
admin = services.user_create("admin", "admin-password-1", admin=True)
team = services.team_create("demo", "Demo team")
services.membership_set(admin, team, Membership.Role.TEAM_ADMIN)
_, user_token = services.token_create(admin, team=team, name="e2e", ttl_days=1)
_, node_token = services.token_create(admin, kind=ApiToken.Kind.NODE, name="e2e nodes", ttl_days=1)
print(json.dumps({"token": user_token, "node_token": node_token}))
'''


def _require(reason: str):
    if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
        pytest.fail(f"STRATA_REQUIRE_SERVICES=1: {reason}")
    pytest.skip(reason)


@pytest.fixture
def database():
    """A fresh PostgreSQL database on STRATA_DATABASE_URL's server: its URL; dropped afterwards."""
    import psycopg

    url = os.environ.get("STRATA_DATABASE_URL", "")
    name = f"strata_two_schedulers_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as error:
        _require(f"no PostgreSQL at {url}: {error}")
    try:
        yield urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def broker():
    url = os.environ.get("STRATA_BROKER_URL", "")
    if not url.startswith(("redis://", "rediss://")):
        url = "redis://127.0.0.1:6379/0"
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 6379), timeout=3).close()
    except OSError as error:
        _require(f"no Redis at {url}: {error}")
    return url


class Replicas:
    """The processes of one test, their environment and the database to read the lease and nodes from."""

    def __init__(self, home: Path, database_url: str, broker_url: str, start):
        self.home, self.database_url, self.start = home, database_url, start
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (home / "jobs").mkdir(parents=True)
        (home / "jobs" / "twoschedulers_job.py").write_text(JOB_MODULE)
        self.env = e2e_env(
            STRATA_DATABASE_URL=database_url, STRATA_BROKER_URL=broker_url,
            STRATA_BROKER_PREFIX=f"strata-two-schedulers-{secrets.token_hex(4)}:",
            STRATA_SECRET_KEY=secrets.token_urlsafe(64), STRATA_PUBLIC_URL=self.url,
            STRATA_LEADER_LEASE_SECONDS=str(LEASE_S), STRATA_SCHEDULER_METRICS_PORT="0",
            STRATA_NODE_SERVICES_DISABLE="gpushare,datacache,straggler")
        self.session = requests.Session()
        self.credentials: dict = {}
        self.schedulers: dict[str, subprocess.Popen] = {}
        self.nodes: dict[str, subprocess.Popen] = {}

    def _popen(self, name: str, args: list[str], **extra: str) -> subprocess.Popen:
        home = self.home / name
        home.mkdir(exist_ok=True)
        log = (self.home / f"{name}.out").open("ab")
        return self.start([*strata_command(), *args], env={**self.env, "STRATA_HOME": str(home), **extra},
                          stdout=log, stderr=subprocess.STDOUT, cwd=home)

    def seed(self) -> None:
        result = subprocess.run([sys.executable, "-c", SEED], env={**self.env, "STRATA_HOME": str(self.home)},
                                capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stdout + result.stderr
        self.credentials = json.loads(result.stdout.strip().splitlines()[-1])
        self.session.headers["Authorization"] = f"Bearer {self.credentials['token']}"

    def start_server(self) -> None:
        server = self._popen("server", ["server", "--port", str(self.port)])

        def healthy():
            assert server.poll() is None, f"strata server exited:\n{self.output()}"
            try:
                return requests.get(f"{self.url}/healthz", timeout=2).ok
            except requests.RequestException:
                return False

        wait_for(healthy, 120, message="strata server to answer /healthz")

    def start_scheduler(self, name: str) -> subprocess.Popen:
        self.schedulers[name] = self._popen(name, ["scheduler", "--loglevel", "INFO"])
        return self.schedulers[name]

    def start_node(self, name: str, gpus: int) -> subprocess.Popen:
        self.nodes[name] = self._popen(
            name, ["node", "--server", self.url, "--name", name, "--virtual-gpus", str(gpus),
                   "--state-dir", str(self.home / name / "state")],
            STRATA_NODE_TOKEN=self.credentials["node_token"], PYTHONPATH=str(self.home / "jobs"))
        return self.nodes[name]

    # -- reading the state -------------------------------------------------------------------------------
    def query(self, sql: str, *params):
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as connection:
            return connection.execute(sql, params).fetchall()

    def lease(self) -> dict | None:
        """The scheduler lease, with whether it is valid now by the database's clock."""
        rows = self.query("SELECT holder, epoch, expires_at > clock_timestamp() FROM scheduling_lease "
                          "WHERE name = 'scheduler'")
        return {"holder": rows[0][0], "epoch": rows[0][1], "valid": rows[0][2]} if rows else None

    def leader(self) -> str | None:
        """Which of the schedulers holds a valid lease (by the pid in ``host:pid:random``)."""
        lease = self.lease()
        if not lease or not lease["valid"] or not lease["holder"]:
            return None
        pid = int(lease["holder"].split(":")[-2])
        owners = [name for name, process in self.schedulers.items() if process.pid == pid]
        assert len(owners) == 1, f"the lease is held by {lease['holder']}, not one of our schedulers"
        return owners[0]

    def node_state(self, name: str) -> str:
        return self.query("SELECT state FROM cluster_node WHERE name = %s", name)[0][0]

    def submit(self, name: str) -> str:
        body = {"name": name, "kind": "train", "resources": {"gpus": 1}, "max_attempts": 3,
                "spec": {"entrypoint": "twoschedulers_job:main"}}
        response = self.session.post(f"{self.url}/api/v1/jobs/", json=body, timeout=30)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def job(self, job_id: str) -> dict:
        response = self.session.get(f"{self.url}/api/v1/jobs/{job_id}/", timeout=30)
        response.raise_for_status()
        return response.json()

    def wait_done(self, job_ids: list[str], timeout: float, watch=None) -> list[dict]:
        done: dict[str, dict] = {}

        def finished():
            if watch:
                watch()
            for job_id in job_ids:
                if job_id not in done and (job := self.job(job_id))["state"] in TERMINAL:
                    done[job_id] = job
            return len(done) == len(job_ids)

        self.wait(finished, timeout, f"{len(job_ids)} jobs to end")
        return [done[job_id] for job_id in job_ids]

    def wait(self, predicate, timeout: float, what: str):
        """:func:`wait_for`, with the processes' output in the failure."""
        try:
            return wait_for(predicate, timeout, message=what, interval=0.5)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.output()}") from None

    def output(self) -> str:
        return "\n".join(f"--- {path.name} ---\n" + path.read_text(errors="replace")[-3000:]
                         for path in sorted(self.home.glob("*.out")))


def assert_ran_once(jobs: list[dict]) -> None:
    for job in jobs:
        assert job["state"] == "SUCCEEDED", job
        assert [attempt["number"] for attempt in job["attempts"]] == [1], job["attempts"]
        assert job["attempts"][0]["outcome"] == "succeeded", job["attempts"]


def test_two_schedulers_share_the_work_and_hand_over_leadership(tmp_path, database, broker):
    with reaper(grace=1.0) as start:
        cluster = Replicas(tmp_path, database, broker, start)
        cluster.seed()
        cluster.start_server()
        first, second = cluster.start_scheduler("scheduler-a"), cluster.start_scheduler("scheduler-b")
        cluster.start_node("n1", gpus=2)
        cluster.start_node("n2", gpus=1)
        cluster.wait(lambda: cluster.leader() is not None, 120, "a leader")
        cluster.wait(lambda: all(cluster.query("SELECT state FROM cluster_node WHERE name = %s", name) == [("up",)]
                                 for name in ("n1", "n2")), 120, "both nodes up")

        # Twenty jobs with both schedulers running passes: each runs exactly once. Meanwhile the lease is read
        # over and over: one row, so at most one holder, and always one of the two schedulers.
        holders: set[str] = set()

        def watch():
            assert first.poll() is None and second.poll() is None, cluster.output()
            if (name := cluster.leader()) is not None:
                holders.add(name)

        jobs = cluster.wait_done([cluster.submit(f"before-{i}") for i in range(JOBS)], 300, watch)
        assert_ran_once(jobs)
        assert holders and holders <= {"scheduler-a", "scheduler-b"}

        # Kill the leader's whole process group (worker and embedded beat), and a node with it.
        leader = cluster.wait(cluster.leader, 60, "a valid lease")
        epoch = cluster.lease()["epoch"]
        killed = cluster.schedulers[leader]
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        wait_for(lambda: not group_processes(killed.pid), 30, message="the killed scheduler's processes to die")
        node = cluster.nodes["n2"]
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=30)

        # The other scheduler takes the lease once it runs out (a new epoch), and, as the leader, reaps n2.
        survivor = next(name for name in cluster.schedulers if name != leader)
        cluster.wait(lambda: cluster.leader() == survivor, 120, f"{survivor} to take the lease over")
        assert cluster.lease()["epoch"] > epoch
        cluster.wait(lambda: cluster.node_state("n2") == "down", 120, "the lost node n2 to be reaped")
        assert cluster.node_state("n1") == "up"

        # Jobs submitted now still run, once each, on the one scheduler left.
        jobs = cluster.wait_done([cluster.submit(f"after-{i}") for i in range(4)], 300)
        assert_ran_once(jobs)
        assert cluster.leader() == survivor
