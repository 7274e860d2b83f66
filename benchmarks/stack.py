"""The local stack the benchmarks and the end-to-end tests run against: ``strata up`` in a process group of its
own (:class:`Stack`, the one launcher: interrupted, it stops its whole process tree), free ports, process groups
stopped together (:func:`kill_groups`), a clean environment, and scratch space on PostgreSQL and Redis (a fresh
database, a fresh key prefix), removed at the end. ``STRATA_BENCH_POSTGRES_URL`` and ``STRATA_BENCH_REDIS_URL``
name the servers."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

POSTGRES_ADMIN_URL = os.environ.get("STRATA_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STRATA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_processes(pgid: int) -> list:
    """The live (not zombie) processes (``psutil.Process``) of process group ``pgid``."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def kill_groups(processes: list[subprocess.Popen], grace: float = 10.0, settle: float = 10.0) -> None:
    """Stop the process groups of ``processes`` (each the leader of a group of its own, started with
    ``start_new_session=True``) together: SIGTERM every leader, one shared ``grace`` for all of them (not one
    after the other), then SIGKILL what is left of every group, and wait up to ``settle`` seconds until none of
    it is left (raising TimeoutError if some is)."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=settle)
    pgids = [process.pid for process in processes]
    deadline = time.monotonic() + settle
    while any(group_processes(pgid) for pgid in pgids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process groups {pgids} did not exit within {settle:g} s of SIGKILL")
        time.sleep(0.1)


def clean_env() -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("STRATA_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --- PostgreSQL and Redis scratch space ----------------------------------------------------------------------

def services_available() -> str | None:
    """None when PostgreSQL and Redis answer; otherwise why not."""
    try:
        import psycopg

        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=3):
            pass
    except Exception as error:  # noqa: BLE001 - any failure means "skip this backend"
        return f"PostgreSQL at {POSTGRES_ADMIN_URL} not reachable: {error}"
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as error:  # noqa: BLE001
        return f"Redis at {REDIS_URL} not reachable: {error}"
    return None


def database_url(name: str) -> str:
    base, _, _ = POSTGRES_ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def create_database() -> str:
    import psycopg

    name = f"strata_bench_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(name: str) -> None:
    import psycopg

    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception as error:  # noqa: BLE001
        print(f"  warning: could not drop database {name}: {error}", flush=True)


def clear_redis_prefix(prefix: str) -> None:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
    except Exception as error:  # noqa: BLE001
        print(f"  warning: could not clear Redis keys {prefix}*: {error}", flush=True)


_LIVE: dict[int, Callable[[], object]] = {}  # id(owner) -> how to stop what it started, for what runs now


def stop_on_exit(owner: object, stop: Callable[[], object]) -> None:
    """Call ``stop`` (which stops every process ``owner`` started) if this process is told to stop (SIGTERM,
    SIGHUP) or exits while ``owner`` runs: :class:`Stack` and the multi-host tools' ``Hosts`` register here, so
    an interrupted benchmark, test or chaos run leaves nothing behind. :func:`stopped` takes it back."""
    _LIVE[id(owner)] = stop
    _watch_signals()


def stopped(owner: object) -> None:
    """``owner`` stopped what it started: nothing is left to stop for it on exit."""
    _LIVE.pop(id(owner), None)


def _stop_live(signum: int | None = None, frame=None) -> None:
    """Stop every live stack (its whole process group); on SIGTERM, SIGHUP or SIGINT, then exit as that signal
    would have: an interrupted benchmark leaves no ``strata up`` behind."""
    for stop in list(_LIVE.values()):
        try:
            stop()
        except Exception as error:  # noqa: BLE001 - stop the others whatever one of them raised
            print(f"  warning: could not stop: {error}", flush=True)
    if signum is not None:
        raise SystemExit(128 + signum)


def _watch_signals() -> None:
    """Stop the live stacks when this process is told to stop (main thread only; once)."""
    if getattr(_watch_signals, "done", False) or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _stop_live)
    atexit.register(_stop_live)
    _watch_signals.done = True  # type: ignore[attr-defined]


class Stack:
    """``strata up`` in its own process group; ``stop()`` kills the whole group, and so does a SIGTERM or SIGHUP
    to this process (or its normal exit) while the stack runs. The one launcher of a local stack: the benchmarks,
    the end-to-end tests (``tests/e2e/e2e_support.Cluster``) and the multi-host tools' stacks start it here.

    ``env`` replaces the clean environment (:func:`clean_env`) the stack starts from; ``extra_env`` is added on
    top; ``command`` is how ``strata`` is run; ``node_name`` names the local node (None: the default)."""

    def __init__(self, home: Path, port: int, virtual_gpus: int, extra_env: dict, *, env: dict | None = None,
                 command: list[str] | None = None, node_name: str | None = "bench", log_name: str = "up.log"):
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}"
        env = {**(clean_env() if env is None else env), **extra_env, "STRATA_HOME": str(home),
               "STRATA_PUBLIC_URL": self.url}
        self.log_path = home / log_name
        home.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [*(command or [sys.executable, "-m", "strata.cli.main"]), "up", "--home", str(home), "--port", str(port),
             "--virtual-gpus", str(virtual_gpus), *(["--node-name", node_name] if node_name else [])],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.adopted: list[subprocess.Popen] = []
        stop_on_exit(self, lambda: self.stop(grace=2.0))

    def wait_ready(self, timeout: float = 120.0) -> dict:
        import requests

        deadline = time.monotonic() + timeout
        credentials = self.home / "credentials.json"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"strata up exited with {self.process.returncode}; see {self.log_path}")
            if credentials.exists():
                try:
                    if requests.get(f"{self.url}/healthz", timeout=1).ok:
                        return json.loads(credentials.read_text())
                except (requests.RequestException, ValueError):
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"the stack did not come up within {timeout:g} s; see {self.log_path}")

    def adopt(self, process: subprocess.Popen) -> subprocess.Popen:
        """Stop ``process`` (the leader of a process group of its own: a separate ``strata node``, say) with
        the stack, and on the same signals."""
        self.adopted.append(process)
        return process

    def stop(self, grace: float = 20.0) -> Stack:
        """SIGTERM the stack's process group and every adopted one, one shared ``grace``, then SIGKILL what is
        left of them all and wait until none of it is left."""
        stopped(self)
        try:
            kill_groups([*self.adopted, self.process], grace=grace)
        except TimeoutError as error:
            print(f"  warning: {error}", flush=True)
        self.adopted.clear()
        if not self._log.closed:
            self._log.close()
        return self
