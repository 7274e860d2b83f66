"""Shared test support, in one place: waiting on a condition, free loopback ports, and reaping the processes a
test started. Importable from every test as ``support`` (pytest's ``pythonpath`` in pyproject.toml)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, message: str = "condition",
             interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something true and return that; AssertionError after ``timeout``
    seconds. Tests wait on states and counts with generous deadlines, never on short wall times."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def group_processes(pgid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def kill_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the group's leader (started with ``start_new_session=True``), wait up to ``grace`` seconds, then
    SIGKILL whatever is left of its process group, and wait until none of it is left."""
    pgid = process.pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    process.wait(timeout=10)
    wait_for(lambda: not group_processes(pgid), 10, message=f"process group {pgid} to exit")


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
        for process in reversed(started):
            kill_group(process, grace=grace)
