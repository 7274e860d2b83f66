"""What the serving benchmarks share (:mod:`benchmarks.serving.bench`, :mod:`benchmarks.serving.slabench`,
:mod:`benchmarks.serving.emoebench`): the made-up train job their ``model.pt`` files come from, the child
processes they run on pinned cores, and how a child reports a failure to its parent.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

SOURCE_JOB = "00000000-0000-4000-8000-000000000000"  # the (made-up) train job the model.pt comes from
STARTUP_TIMEOUT_S = 180.0


@contextlib.contextmanager
def answering(conn):
    """The body of a child process's main: a parent that went away ends it quietly; any other failure is sent
    to the parent as ``{"error": traceback}`` (which :class:`_Child` raises there)."""
    try:
        yield
    except EOFError:  # the benchmark went away
        pass
    except BaseException:
        try:
            conn.send({"error": traceback.format_exc()})
        except OSError:
            pass


def _pin(core: int | None) -> None:
    """Pin every thread of this process (and, by inheritance, every thread it starts later) to ``core``."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        return
    try:
        threads = [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for thread in threads:
        try:
            os.sched_setaffinity(thread, {core})
        except OSError:  # the thread ended meanwhile
            pass


def _cores() -> tuple[int | None, int | None]:
    """``(device core, client core)``; the same core when only one is available, None without affinity."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    available = sorted(os.sched_getaffinity(0))
    return available[0], available[1] if len(available) > 1 else available[0]


def child_context():
    """The multiprocessing context the serving benchmarks start their children from: a fork server that imported
    torch once, so each child is forked from it with torch already loaded (about a second and a half less per child
    than a spawned one importing torch again) — never a fork of the benchmark's own process, which may run gRPC and
    torch threads. Spawn where the platform has no fork server."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch"])  # read when the fork server starts (once per process)
    return context


class _Child:
    """A child process (of :func:`child_context`, or any multiprocessing context) and the parent's end of its pipe."""

    def __init__(self, context, name: str, target: Callable[..., None], *args: Any):
        self.name = name
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=target, args=(child_end, *args), name=name, daemon=True)
        self.process.start()
        child_end.close()
        self.ready: dict[str, Any] = {}

    def receive(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"{self.name}: no answer within {timeout:.0f} s")
        try:
            reply = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"{self.name} exited (code {self.process.exitcode})") from None
        if isinstance(reply, dict) and "error" in reply:
            raise RuntimeError(f"{self.name} failed:\n{reply['error']}")
        return reply

    def call(self, message: Any, timeout: float = 30.0) -> Any:
        self.conn.send(message)
        return self.receive(timeout)

    def close(self, timeout: float = 15.0) -> None:
        """Ask it to stop, then terminate (and kill) it if it does not; always joined."""
        try:
            if self.process.is_alive():
                self.conn.send("stop")
                deadline = time.monotonic() + timeout
                while self.process.is_alive() and time.monotonic() < deadline:
                    if self.conn.poll(0.05):
                        try:
                            self.conn.recv()
                        except EOFError:
                            break
            self.process.join(max(0.0, timeout / 3))
        except (OSError, BrokenPipeError):
            pass
        finally:
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
            self.conn.close()
