"""The local stack the benchmarks run against: ``strata up`` in a process group of its own (:class:`Stack`), free
ports, a clean environment, and scratch space on PostgreSQL and Redis (a fresh database, a fresh key prefix),
removed at the end. ``STRATA_BENCH_POSTGRES_URL`` and ``STRATA_BENCH_REDIS_URL`` name the servers."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

POSTGRES_ADMIN_URL = os.environ.get("STRATA_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STRATA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


_LIVE: set[Stack] = set()  # stacks started and not yet stopped


def _stop_live(signum: int | None = None, frame=None) -> None:
    """Stop every live stack (its whole process group); on SIGTERM, SIGHUP or SIGINT, then exit as that signal
    would have: an interrupted benchmark leaves no ``strata up`` behind."""
    for stack in list(_LIVE):
        stack.stop(grace=2.0)
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
    to this process (or its normal exit) while the stack runs."""

    def __init__(self, home: Path, port: int, virtual_gpus: int, extra_env: dict):
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}"
        env = {**clean_env(), **extra_env, "STRATA_HOME": str(home), "STRATA_PUBLIC_URL": self.url}
        self.log_path = home / "up.log"
        home.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "strata.cli.main", "up", "--home", str(home), "--port", str(port),
             "--virtual-gpus", str(virtual_gpus), "--node-name", "bench"],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        _LIVE.add(self)
        _watch_signals()

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

    def stop(self, grace: float = 20.0) -> None:
        _LIVE.discard(self)
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever is left in the group (workers, attempt children)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if not self._log.closed:
            self._log.close()
