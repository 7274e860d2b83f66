"""Warm trial runners: the processes a sweep keeps for its whole life, each running one trial after another
(Ray Tune's ``reuse_actors``), so a new configuration starts in a process that has already imported torch,
warmed the trainable's kind up and prepared its data, without a new job's placement, dispatch, claim and process
start.

A runner is a child process of the tune attempt (``multiprocessing``'s spawn context) on one of the attempt's own
devices, with a share of it. It runs a trial as a *session* of the trainable's kind (the same code a device's
sharing service hosts: ``Component.session(ctx, hosted=True)``), with a :class:`TrialContext` that talks only to
the engine, over a pipe:

- runner -> engine: ``ready``; ``metrics`` (``job``, ``values``, ``step``, ``time``); ``log``; ``file`` (a
  checkpoint or an artifact of the trial's job, as bytes); ``done`` (``job``, ``outcome``: succeeded, stopped
  or failed, ``reason``);
- engine -> runner: ``run`` (``job``, ``kind``, ``spec``, ``metric``, ``checkpoint``: bytes to resume from or
  None); ``decision`` (``job``, ``go``: the answer to a result of the sweep's metric, which the runner waits for
  at the iteration's end, so a trial the scheduler stops runs not one step more); ``stop`` (``job``: cancelled
  through the API, or the sweep stops); ``exit``.

The engine records every trial as its own child job (:meth:`Children.batch`), stores the files the runner sends
as the job's checkpoint and artifacts (:meth:`Children.put_file`), and learns of a cancellation through the API in
its next batch; the runner then stops the trial at its next step (after a checkpoint).
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.runtime.contract.context import (
    Children,
    Context,
    DeviceHandle,
    Endpoint,
    Identity,
    Rendezvous,
)

# How long a runner may take to import and warm its kind up before the sweep gives up on it.
READY_SECONDS = 300.0


@dataclass
class TrialContext(Context):
    """What a trial sees inside a runner: its reports, files and stop flag go to the engine over ``conn``."""

    conn: Any = None
    lock: Any = None
    metric: str = ""
    resume: bytes | None = None
    workdir: Path = field(default_factory=lambda: Path("."))
    waited: float = 0.0  # seconds spent waiting for the scheduler's decisions

    def parts(self) -> tuple[Children, Rendezvous, Identity, Endpoint]:
        return Children(self), Rendezvous(self), Identity(self), Endpoint(self)

    def _send(self, message: dict[str, Any]) -> None:
        with self.lock:
            self.conn.send(message)

    def log(self, message: str, level: str = "info") -> None:
        self._send({"op": "log", "job": self.job_id, "message": str(message)[:10000], "level": level,
                    "time": time.time()})

    def metrics(self, values: dict[str, float], step: int) -> None:
        values = {str(name): float(value) for name, value in values.items()}
        self._send({"op": "metrics", "job": self.job_id, "values": values, "step": int(step), "time": time.time()})
        if self.metric in values:  # an iteration's result: the engine's scheduler decides before the next one
            self._wait_decision()

    def _wait_decision(self) -> None:
        began = time.perf_counter()
        try:
            self._decision()
        finally:
            self.waited += time.perf_counter() - began

    def _decision(self) -> None:
        while True:
            message = self.conn.recv()
            if message.get("job") != self.job_id:
                continue  # about an earlier trial of this runner
            if message["op"] == "decision":
                if not message["go"]:
                    self.request_stop()
                return
            if message["op"] == "stop":
                self.request_stop()

    def should_stop(self) -> bool:
        while not self._stop.is_set() and self.conn.poll(0):
            message = self.conn.recv()
            if message.get("job") == self.job_id and message["op"] in {"stop", "decision"} \
                    and not message.get("go", False):
                self.request_stop()
        return self._stop.is_set()

    def artifact(self, path: str | Path, name: str | None = None) -> None:
        source = Path(path)
        self._send({"op": "file", "job": self.job_id, "kind": "artifact", "name": name or source.name,
                    "data": source.read_bytes()})

    def _save_checkpoint_bytes(self, data: bytes) -> None:
        self._send({"op": "file", "job": self.job_id, "kind": "checkpoint", "name": "checkpoint.pt",
                    "data": bytes(data)})
        self.resume = bytes(data)

    def _load_checkpoint_bytes(self) -> bytes | None:
        return self.resume


def _device(handle: DeviceHandle):
    import torch

    if handle.kind == "cuda":
        torch.cuda.set_per_process_memory_fraction(max(min(handle.share, 1.0), 0.05), handle.index)
    return torch.device(handle.torch_device)


def run_trial(conn: Any, lock: Any, message: dict[str, Any], handle: DeviceHandle, workdir: Path) -> None:
    """One trial, as a session of its kind, to its end (or until stopped); reports ``done``."""
    from components.runtime.contract.component import NotHostable, Progress
    from components.runtime.contract.registry import load_component

    received = time.perf_counter()
    job = message["job"]
    ctx = TrialContext(job_id=job, attempt_id=f"{job[:8]}-runner", spec=message["spec"], devices=[handle],
                       conn=conn, lock=lock, metric=message["metric"], resume=message.get("checkpoint"),
                       workdir=workdir / job)
    outcome, reason = "succeeded", ""
    own = time.perf_counter()
    try:
        component = load_component(message["kind"])
        try:
            session = component.session(ctx, hosted=True)
        except NotHostable:  # its spec needs a process of its own: this runner's process is one
            component.run(ctx)
            outcome = "stopped" if ctx.should_stop() else "succeeded"
            raise _Ran() from None
        try:
            session.prepare()
            session.start(_device(handle))
            while session.step() is not Progress.DONE:
                pass
        finally:
            session.close()
        session.settle()
        if session.stopped_on_request():
            outcome, reason = "stopped", "stopped at a checkpoint"
    except _Ran:
        pass
    except BaseException as error:  # noqa: BLE001 - the trial failed; the runner goes on with the next one
        outcome, reason = "failed", f"{error.__class__.__name__}: {error}"[:500]
        ctx.log("".join(traceback.format_exception(error)).rstrip()[-5000:], level="error")
    done = time.perf_counter()
    # The trial's own code (its kind's session: build, steps, evaluations, checkpoints) against the runner's
    # wall time for it; the difference, and the waits for decisions, are what running it here cost.
    with lock:
        conn.send({"op": "done", "job": job, "outcome": outcome, "reason": reason, "wall_s": done - received,
                   "own_s": max(done - own - ctx.waited, 0.0), "wait_s": ctx.waited})


class _Ran(Exception):
    """A trial that is not hostable ran as a plain ``Component.run`` in the runner's process."""


def runner_main(conn: Any, kind: str, device: dict[str, Any], threads: int, workdir: str) -> None:
    """A runner process: warm the kind up once, then run each trial the engine sends until ``exit``."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    handle = DeviceHandle(**device)
    lock = threading.Lock()
    try:
        import torch

        torch.set_num_threads(threads)
        from components.runtime.contract.registry import load_component

        type(load_component(kind)).warm_up()
    except BaseException as error:  # noqa: BLE001 - told to the engine, which runs the sweep without this runner
        conn.send({"op": "failed", "reason": f"{error.__class__.__name__}: {error}"[:500]})
        return
    conn.send({"op": "ready"})
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message["op"] == "exit":
            return
        if message["op"] == "run":
            run_trial(conn, lock, message, handle, Path(workdir))


@dataclass
class Runner:
    """The engine's handle on one runner process."""

    index: int
    device: DeviceHandle
    process: Any
    conn: Any
    ready: bool = False
    broken: str = ""
    job: str = ""  # the trial job it runs now ("" when idle)
    number: int = -1  # that trial's number
    free_since: float = 0.0  # when it last became idle (time.perf_counter())

    @property
    def idle(self) -> bool:
        return self.ready and not self.broken and not self.job

    def send(self, message: dict[str, Any]) -> bool:
        try:
            self.conn.send(message)
            return True
        except (BrokenPipeError, EOFError, OSError) as error:
            self.broken = self.broken or f"the runner's pipe broke: {error}"
            return False


def runner_layout(devices: list[DeviceHandle], per_gpu: int) -> list[DeviceHandle]:
    """One handle per runner: ``per_gpu`` runners on each of the attempt's devices, each with that share of it."""
    found = []
    for device in devices:
        for _ in range(per_gpu):
            found.append(DeviceHandle(device.kind, device.index, device.memory // per_gpu, device.share / per_gpu))
    return found


def start_runners(kind: str, handles: list[DeviceHandle], workdir: Path, threads: int = 1) -> list[Runner]:
    """Start a runner per handle (they import and warm up in parallel, while the engine starts): a fresh
    interpreter each (``python -m components.tuning.runners``), talking over a socket pair."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from multiprocessing.connection import Connection

    runners = []
    for index, handle in enumerate(handles):
        mine, theirs = socket.socketpair()
        device = {"kind": handle.kind, "index": handle.index, "memory": handle.memory, "share": handle.share}
        argument = json.dumps({"fd": theirs.fileno(), "kind": kind, "device": device, "threads": threads,
                               "workdir": str(workdir)})
        process = subprocess.Popen([sys.executable, "-m", "components.tuning.runners", argument],
                                   pass_fds=[theirs.fileno()], env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                                   stdin=subprocess.DEVNULL)
        theirs.close()
        runners.append(Runner(index, handle, process, Connection(mine.detach())))
    return runners


def stop_runners(runners: list[Runner], timeout: float = 5.0) -> None:
    for runner in runners:
        if runner.job:
            runner.send({"op": "stop", "job": runner.job})
        runner.send({"op": "exit"})
    deadline = time.monotonic() + timeout
    for runner in runners:
        try:
            runner.process.wait(max(deadline - time.monotonic(), 0.1))
        except Exception:  # noqa: BLE001 - it did not exit in time
            runner.process.kill()
            runner.process.wait(5.0)
        runner.conn.close()


if __name__ == "__main__":
    import json
    import sys
    from multiprocessing.connection import Connection

    options = json.loads(sys.argv[1])
    runner_main(Connection(options["fd"]), options["kind"], options["device"], options["threads"],
                options["workdir"])
