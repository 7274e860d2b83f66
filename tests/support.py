"""Shared test support, in one place: waiting on a condition, free loopback ports, and reaping the processes a
test started. Importable from every test as ``support`` (pytest's ``pythonpath`` in pyproject.toml)."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.stack import free_port, group_processes, kill_groups  # noqa: F401 - the launcher's, re-exported
from components.runtime.testing.conformance import wait_for  # the one definition, shipped with the suites


def kill_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the group's leader (started with ``start_new_session=True``), wait up to ``grace`` seconds, then
    SIGKILL whatever is left of its process group, and wait until none of it is left."""
    kill_groups([process], grace)


@contextlib.contextmanager
def reaper(grace: float = 5.0) -> Iterator[Callable[..., subprocess.Popen]]:
    """``with reaper() as start: start([...])``: ``start`` is ``subprocess.Popen`` in a new process group; on
    exit every group it started is killed and waited for, also when the test failed."""
    started: list[subprocess.Popen] = []

    def start(*args: Any, **kwargs: Any) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        process = subprocess.Popen(*args, **kwargs)
        started.append(process)
        return process

    try:
        yield start
    finally:
        kill_groups(list(reversed(started)), grace=grace)


# -- the GPU-sharing device service (gpushare's node service hosts attempts) ------------------------------

def device_service_command(tmp_path: Path, policy: str = "pack") -> list[str]:
    return [sys.executable, "-m", "components.gpushare.service", "--device-index", "0", "--kind", "virtual",
            "--memory", str(2**30), "--socket", str(tmp_path / "s.sock"), "--authkey-file", str(tmp_path / "key"),
            "--policy", policy, "--local-root", str(tmp_path / "jobs")]


class DeviceService:
    """A running device service: ``call`` one request, ``run`` an attempt, wait for its ``done`` event."""

    def __init__(self, process: subprocess.Popen, path: str, authkey: bytes, root: Path):
        self.process, self.path, self.authkey, self.root = process, path, authkey, root

    def alive_and_listening(self) -> bool:
        assert self.process.poll() is None, f"the service exited with {self.process.returncode}"
        from components.gpushare.service import call

        try:
            return call(self.path, self.authkey, {"op": "ping"})["ok"]
        except OSError:
            return False

    def call(self, message: dict, timeout: float = 10.0) -> dict:
        from components.gpushare.service import call

        return call(self.path, self.authkey, message, timeout)

    def connect(self):
        from components.gpushare.service import connect

        return connect(self.path, self.authkey)

    def run(self, spec: dict, kind: str = "train", share: float = 0.5, memory: int = 2**28, **extra):
        """Submit an attempt; returns (attempt id, the open connection, the reply)."""
        attempt = str(uuid.uuid4())
        payload = {"attempt": attempt, "job": str(uuid.uuid4()), "number": 1, "kind": kind, "spec": spec,
                   "world_size": 1, "rank": 0,
                   "device": {"kind": "virtual", "index": 0, "memory": memory, "share": share}, **extra}
        conn = self.connect()
        conn.send({"op": "run", "payload": payload})
        assert conn.poll(60), "no answer to run"
        return attempt, conn, conn.recv()

    @staticmethod
    def done(conn, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if conn.poll(0.1):
                message = conn.recv()
                if message.get("event") == "done":
                    return message
        raise AssertionError("the job did not end")


def start_device_service(tmp_path: Path, policy: str = "pack"):
    """Start gpushare's device service on a virtual device under ``tmp_path`` and wait until it listens."""
    from components.gpushare.service import read_authkey

    (tmp_path / "key").write_text(secrets.token_hex(16))
    env = {**os.environ, "STRATA_TORCH_THREADS": "1", "STRATA_GPUSHARE_WARM_UP": "0"}
    process = subprocess.Popen(device_service_command(tmp_path, policy), env=env, stdin=subprocess.DEVNULL)
    handle = DeviceService(process, str(tmp_path / "s.sock"), read_authkey(tmp_path / "key"), tmp_path / "jobs")
    try:
        wait_for(handle.alive_and_listening, 30, "the service to listen")
    except BaseException:
        process.kill()
        process.wait(timeout=10)
        raise
    return handle


API_PREFIX = "/api/v1/"
HTTP_METHODS = ["get", "post", "put", "patch", "delete"]


def api_routes() -> list[tuple[str, str, list[str]]]:
    """(name, pattern text, methods) of every route of strata.api.urls, format-suffix variants excluded: what
    the access-control walks go over (tests/platform/api/test_scoping.py, test_access_walk.py)."""
    from django.urls import URLPattern, URLResolver

    from strata.api import urls as api_urls

    routes = []
    for entry in api_urls.urlpatterns:
        assert isinstance(entry, URLPattern) and not isinstance(entry, URLResolver)
        text = str(entry.pattern)
        if "format" in text:
            continue
        actions = getattr(entry.callback, "actions", None)
        if actions:
            methods = sorted(actions)
        else:
            view_class = entry.callback.view_class
            methods = [m for m in HTTP_METHODS if hasattr(view_class, m)] or ["get"]
        routes.append((entry.name, text, methods))
    return routes


def fill_route(text: str, values: dict) -> str:
    """A route's pattern text with its parameters replaced from ``values``, as an /api/v1/ path."""
    import re

    text = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: values[m.group(1)], text)
    text = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], text)
    return API_PREFIX + text.lstrip("^").rstrip("$")


# A package index on loopback (what a project's requirements.txt installs from; tests reach nothing else): the one
# definition, which `strata bench byo` uses too.
from benchmarks.core.package_index import build_wheel, index_environment, package_index  # noqa: E402, F401


def sibling_module(test_file: str, name: str):
    """The test module ``name`` of ``test_file``'s folder, loaded by path (the test folders are no packages), so a
    test can reuse another's builders without pytest collecting its tests twice."""
    import importlib.util

    path = Path(test_file).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_sibling_{path.parent.name}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
