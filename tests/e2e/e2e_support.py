"""Helpers and fixtures for the multi-process end-to-end tests: a real ``strata up`` (and, where needed, a separate
``strata node``) in their own process groups, on the embedded defaults (SQLite and the filesystem broker),
in a temporary home. Every process group started here is killed in teardown.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests
from support import free_port, group_processes, kill_group, kill_groups, wait_for  # noqa: F401 - re-exported

from benchmarks.stack import Stack

# Variables the in-process tests (tests/conftest.py) or a CI job may set that must not reach the e2e processes.
SCRUBBED = ("STRATA_DATABASE_URL", "STRATA_BROKER_URL", "STRATA_BROKER_PREFIX", "STRATA_SCHEDULE_INLINE",
            "STRATA_HOME", "STRATA_CONFIG", "STRATA_URL", "STRATA_TOKEN", "STRATA_NODE_TOKEN", "STRATA_PUBLIC_URL")
# A volunteer participant heartbeats every third of its lease (10 s by default): 9 s lets it hear "stop" soon.
FAST = {"STRATA_NODE_LEASE_SECONDS": "6", "STRATA_HEARTBEAT_SECONDS": "1", "STRATA_SCHEDULER_TICK_SECONDS": "1",
        "STRATA_PARTICIPANT_LEASE_S": "9", "STRATA_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1",
        # a device service warms up on its first session, not at start: most e2e nodes host no session
        "STRATA_GPUSHARE_WARM_UP": "0"}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
STOP_GRACE_S = 0.5  # teardown: SIGTERM, then SIGKILL what is left of every process group after this long


def strata_command() -> list[str]:
    script = Path(sys.executable).with_name("strata")
    return [str(script)] if script.exists() else [sys.executable, "-m", "strata.cli.main"]


def e2e_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(FAST)
    env.update(extra)
    return env


class Cluster:
    """A running ``strata up`` in ``home``, with REST and CLI helpers."""

    def __init__(self, home: Path, virtual_gpus: int = 1, env: dict[str, str] | None = None):
        self.home = home
        self.env = dict(env or {})  # more environment for `strata up` (e.g. STRATA_S3_*: its storage on S3)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.virtual_gpus = virtual_gpus
        self.process: subprocess.Popen | None = None
        self.stack: Stack | None = None
        self.nodes: list[subprocess.Popen] = []
        self.credentials: dict = {}
        self.session = requests.Session()

    # -- processes -------------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> Cluster:
        """``strata up`` through the one stack launcher (``benchmarks.stack.Stack``): its process group, and every
        node this cluster starts, is stopped by :meth:`stop`, or when this process is told to stop."""
        self.stack = Stack(self.home, self.port, self.virtual_gpus, self.env, env=e2e_env(), command=strata_command(),
                           node_name=None, log_name="up.out")
        self.process = self.stack.process
        try:
            self.credentials = self.stack.wait_ready(timeout)
        except RuntimeError as error:
            output = self.output()
            self.stop()
            raise AssertionError(f"{error}:\n{output}") from None
        except BaseException:
            self.stop()
            raise
        self.session.headers["Authorization"] = f"Bearer {self.credentials['token']}"
        return self

    def start_node(self, name: str, virtual_gpus: int = 1, env: dict | None = None) -> subprocess.Popen:
        log = (self.home / f"node-{name}.out").open("ab")
        node = subprocess.Popen(
            [*strata_command(), "node", "--server", self.url, "--name", name, "--virtual-gpus", str(virtual_gpus),
             "--state-dir", str(self.home / f"node-{name}")],
            env=e2e_env(STRATA_NODE_TOKEN=self.credentials["node_token"], **(env or {})), stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self.nodes.append(node)
        if self.stack is not None:
            self.stack.adopt(node)
        return node

    def stop(self) -> None:
        # Every group at once, with a short shared grace: no test checks how the processes shut down (a graceful
        # `strata up` takes several seconds, its node's Celery worker most of them), only that none is left.
        if self.stack is not None:
            self.stack.stop(grace=STOP_GRACE_S)
        else:
            kill_groups(self.nodes, grace=STOP_GRACE_S)
        self.session.close()

    def output(self) -> str:
        parts = []
        for path in [self.home / "up.out", *sorted((self.home / "logs").glob("*.log")),
                     *sorted(self.home.glob("node-*.out"))]:
            if path.exists():
                parts.append(f"--- {path.name} ---\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    # -- REST ------------------------------------------------------------------------------------------
    def api(self, method: str, path: str, **kwargs):
        response = self.session.request(method, f"{self.url}/api/v1/{path}", timeout=30, **kwargs)
        response.raise_for_status()
        return response.json() if response.content else None

    def get(self, path: str, **params):
        return self.api("GET", path, params=params)

    def job(self, job_id: str) -> dict:
        return self.get(f"jobs/{job_id}/")

    def submit(self, body: dict) -> dict:
        return self.api("POST", "jobs/", json=body)

    def metrics(self, job_id: str) -> list[dict]:
        points, after = [], 0
        while True:
            page = self.get(f"jobs/{job_id}/metrics/", after=after)
            if not page:
                return points
            points.extend(page)
            after = page[-1]["id"]

    def logs(self, job_id: str) -> list[str]:
        lines, after = [], 0
        while True:
            page = self.get(f"jobs/{job_id}/logs/", after=after)
            if not page:
                return lines
            lines.extend(line["message"] for line in page)
            after = page[-1]["id"]

    def wait_state(self, job_id: str, states: set[str], timeout: float) -> dict:
        return wait_for(lambda: (job := self.job(job_id))["state"] in states and job, timeout,
                        message=f"job {job_id} to reach {sorted(states)}")

    # -- CLI -------------------------------------------------------------------------------------------
    def cli(self, *args: str, timeout: float = 120.0, env: dict | None = None) -> subprocess.CompletedProcess:
        variables = e2e_env(STRATA_CONFIG=str(self.home / "client.yaml"), **(env or {}))
        return subprocess.run([*strata_command(), *args], env=variables,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              cwd=self.home)


def training_children(pgid: int) -> list[psutil.Process]:
    """Attempt child processes (``python -m components.runtime.node.child``) in a process group."""
    found = []
    for process in group_processes(pgid):
        try:
            if "components.runtime.node.child" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


@contextlib.contextmanager
def running_cluster(home: Path, virtual_gpus: int, env: dict[str, str] | None = None):
    """A started :class:`Cluster` in ``home``, stopped (every process group killed) on exit."""
    running = Cluster(home, virtual_gpus=virtual_gpus, env=env)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``strata up`` with one local virtual GPU, shared by a module's tests."""
    with running_cluster(tmp_path_factory.mktemp("strata-e2e-home"), virtual_gpus=1) as running:
        yield running


@pytest.fixture
def bare_cluster(tmp_path):
    """``strata up --virtual-gpus 0``: a control plane and scheduler without a node; tests start nodes."""
    with running_cluster(tmp_path / "home", virtual_gpus=0) as running:
        yield running


def login(cluster) -> requests.Session:
    """A logged-in web session (the admin of `strata up`), for pages and their live refresh."""
    session = requests.Session()
    page = session.get(f"{cluster.url}/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    answer = session.post(f"{cluster.url}/login/", timeout=30, headers={"Referer": f"{cluster.url}/login/"},
                          data={"csrfmiddlewaretoken": token, "username": cluster.credentials["username"],
                                "password": cluster.credentials["password"]})
    assert answer.ok and "/login/" not in answer.url, answer.url
    return session
