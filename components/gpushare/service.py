"""The per-device GPU-sharing service: one long-lived process per device, run and supervised by the node agent.

``python -m components.gpushare.service --device-index N --kind virtual|cuda --memory BYTES --socket PATH
--authkey-file PATH [--policy fair]``

The process owns one :class:`~components.gpushare.executor.DeviceExecutor` for its device (created on the first
job). At start it warms up every hostable kind (``Component.warm_up``: torch, the train loop, its dataset
loaders and optimizers) in a background thread, so the first attempts it hosts do not each pay about 1.7 s of
imports at once; an idle service then holds those libraries (``STRATA_GPUSHARE_WARM_UP=0`` keeps it at a few MB
until its first job). It listens on a unix socket
(:mod:`multiprocessing.connection`, authenticated with the node's key) for these messages, each a dict with
an ``op``; every request gets exactly one reply dict:

- ``run`` ``{"payload": <the attempt payload: claim + server, node_token, node, fencing_token, rank, device>}``:
  builds the attempt's context with :func:`~components.runtime.client.remote.context_from_payload` (as the child
  process does) and asks the kind's component for its session (``component.session(ctx, hosted=True)``;
  no kind is named here). A step-at-a-time session (a ``train`` attempt's
  :class:`~components.train.sessions.TrainLoopSession`) is submitted to the executor with its measured
  memory as its request and the allocation's share as its FAIR weight; a session with an ``attach`` hook (a
  ``serve`` attempt's endpoint) joins the executor by itself. ``session.prepare()`` (the checkpoint or model
  download) runs here, before admission, and checkpoint and artifact uploads run on the job's own host thread,
  never on the execution thread. Reply ``{"ok": True, "pid", "admission": ...}`` or ``{"ok": False,
  "reason": ...}`` when the job cannot run here (then the caller runs it in a child process): a component
  that is not hostable or raises ``NotHostable`` (a ``train`` entrypoint *function*, which may train by
  itself), a spec that does not validate, a missing input, or a request that can never fit. When the job
  ends and its session settled (uploads stored, endpoint stopped), the service closes its context (flushing
  logs and metrics) and then sends one more message on the same connection:
  :func:`components.runtime.shared.protocol.done_event` (``state``: succeeded|stopped|failed|cancelled|lost). The
  caller (the worker's AttemptRunner) reports ``finish``: exactly once. If that connection closes before the
  end (the worker died), the job is asked to stop.
- ``cancel`` ``{"attempt", "hard": False}``: ask the job to stop at its next iteration boundary; the loop
  checkpoints, as the child path does on SIGTERM (``state: stopped``). ``hard``: drop it at once
  (``executor.cancel``, no checkpoint).
- ``status``: ``executor.status()``; ``timeline`` ``{"since": unix s}``: units that ended after ``since``,
  with unix times; ``report`` ``{"since": unix s, "limit": 2000}``: the heartbeat's ``sharing`` entry for
  this device (see :meth:`DeviceService.report`) and the next cursor; ``policy`` ``{"policy": name}``;
  ``ping``; ``shutdown``.

Trust: every job on the device runs in this one process, so a crash in one (segfault, ``os._exit``) ends the
others; the node agent restarts the service and the worker reports the attempts it was running as
``service_lost`` (the control plane requeues them without counting a failure, up to three times per job).

Tests can pass ``--local-root DIR``: attempts then report to a
:class:`~components.runtime.contract.context.LocalContext` under ``DIR/<attempt>`` instead of the control plane.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from components.runtime.contract.component import Session
from components.runtime.contract.services import set_parent_death_signal
from components.runtime.shared.protocol import End, call, connect, done_event, read_authkey, socket_path

__all__ = ["DeviceService", "call", "connect", "main", "read_authkey", "socket_path"]

log = logging.getLogger("strata.gpushare.service")

DEFAULT_POLICY = "fair"
SLICE_LIMIT = 2000  # slices per heartbeat
JOB_LIMIT = 256  # jobs (and lanes) per heartbeat: the control plane refuses more
SLICE_MERGE_GAP_S = 0.005  # consecutive units of one job closer than this are one slice
STOP_GRACE_S = 10.0  # on shutdown: how long jobs get to checkpoint before they are dropped
HOST_IO_WAIT_S = 900.0  # how long an ended job's checkpoint and artifact uploads may take


_ENDED = {"succeeded", "failed", "cancelled", "rejected"}


@dataclass
class _Attempt:
    attempt_id: str
    ctx: Any
    session: Any  # the attempt's Session (components.runtime.contract.component.Session), from its component
    send: Any  # callable sending one message to the connection that submitted the job
    acked: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


def _decline(reason: str) -> tuple[dict, None]:
    return {"ok": False, "reason": reason}, None


class DeviceService:
    """The service's logic, independent of the socket (the tests drive it through the process, though)."""

    def __init__(self, device_index: int, kind: str = "virtual", memory: int | None = None,
                 policy: str = DEFAULT_POLICY, local_root: str | Path | None = None):
        from components.gpushare.policies import get_policy

        self.device_index = int(device_index)
        self.kind = kind
        self.memory = memory
        self.policy = get_policy(policy).name
        self.local_root = Path(local_root) if local_root else None
        self._executor = None
        self._lock = threading.Lock()
        self.attempts: dict[str, _Attempt] = {}
        self.stopping = threading.Event()
        self.crashed = threading.Event()
        self._usage: tuple[float, float] | None = None  # (busy_s, wall_s) at the previous report

    # -- the executor ----------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return f"{self.kind}:{self.device_index}"

    def executor(self):
        with self._lock:
            if self._executor is None:
                import torch

                from components.gpushare.executor import DeviceExecutor
                from components.runtime.contract.component import torch_threads

                torch.set_num_threads(torch_threads())
                device = f"cuda:{self.device_index}" if self.kind == "cuda" else "cpu"
                self._executor = DeviceExecutor(device, memory_budget=self.memory, policy=self.policy,
                                                name=self.label)
            return self._executor

    # -- messages --------------------------------------------------------------------------------------
    def handle(self, message: dict, send, owned: list[str]) -> tuple[dict, Any]:
        """The reply to ``message``, and a callable to run once the reply was sent (or None)."""
        op = message.get("op")
        if op == "run":
            return self.run(message["payload"], send, owned)
        if op == "cancel":
            return {"ok": True, "found": self.cancel(str(message["attempt"]), bool(message.get("hard")))}, None
        if op == "status":
            return {"ok": True, "status": self.status()}, None
        if op == "timeline":
            return {"ok": True, "timeline": self.timeline(float(message.get("since", 0.0)))}, None
        if op == "report":
            return {"ok": True, **self.report(float(message.get("since", 0.0)),
                                              int(message.get("limit", SLICE_LIMIT)))}, None
        if op == "policy":
            self.set_policy(str(message["policy"]))
            return {"ok": True, "policy": self.policy}, None
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "device": self.label, "policy": self.policy}, None
        if op == "shutdown":
            return {"ok": True}, self.stopping.set
        return {"ok": False, "reason": f"unknown op {op!r}"}, None

    def run(self, payload: dict, send, owned: list[str]) -> tuple[dict, Any]:
        """Host one attempt: its component's session (``component.session(ctx, hosted=True)``), submitted to
        this device's executor as step-at-a-time work, or attached to it by the session itself (its
        :meth:`~components.runtime.contract.component.Session.attach` hook: a serving endpoint, say). Declined (the
        worker then runs it in a child process) when the kind is not hostable, the session cannot be built
        here (:class:`~components.runtime.contract.component.NotHostable`, a bad spec, a missing input), or the
        executor can never fit it."""
        from components.runtime.client.remote import context_from_payload
        from components.runtime.contract.component import NotHostable
        from components.runtime.contract.registry import load_component

        attempt_id = str(payload["attempt"])
        if self.stopping.is_set():
            return _decline("the device service is shutting down")
        with self._lock:
            if attempt_id in self.attempts:
                return _decline(f"attempt {attempt_id} already runs here")
        if int(payload.get("world_size", 1)) != 1:
            return _decline("multi-worker jobs do not share a device")
        try:
            component = load_component(str(payload.get("kind")))
        except Exception as error:  # the child path reports it
            return _decline(f"cannot run here: {error.__class__.__name__}: {error}")
        if not getattr(component, "hostable", False):
            return _decline(f"{payload.get('kind')!r} jobs cannot share a device")
        executor = self.executor()
        ctx = context_from_payload(payload, narrowed=False, local_root=self.local_root)
        try:
            session = component.session(ctx, hosted=True)
            session.prepare()  # downloads (checkpoint, source model) happen here, not on the device thread
        except NotHostable as error:
            ctx.close()
            return _decline(str(error))
        except Exception as error:  # the child path reports these; let it
            ctx.close()
            return _decline(f"cannot run here: {error.__class__.__name__}: {error}")
        device = payload["device"]
        share = float(device["share"])
        priority = int(payload.get("priority") or 0)
        entry = _Attempt(attempt_id, ctx, session, send)
        with self._lock:
            self.attempts[attempt_id] = entry
        try:
            note = (f"attempt {payload.get('number', 1)} rank {payload.get('rank', 0)} starting on {self.label}, "
                    f"shared: running in the GPU-sharing service (pid {os.getpid()}, policy {self.policy}, "
                    f"share {share:g}")
            admission = None
            if type(session).attach is Session.attach:  # step-at-a-time work: the executor's own admission
                request = self._memory_request(session, int(device["memory"]))
                ctx.log(f"{note}; reserved {request.persistent} B persistent + {request.ephemeral} B per "
                        f"iteration of its {int(device['memory'])} B allocation)")
                admission = executor.submit(attempt_id, session, request, priority=priority,
                                            weight=max(share, 1e-3))
            else:
                ctx.log(f"{note})")
                admission = session.attach(executor, attempt_id, priority=priority, weight=max(share, 1e-3))
        except Exception as error:
            with self._lock:
                self.attempts.pop(attempt_id, None)
            with contextlib.suppress(Exception):
                session.settle(0)
            ctx.close()
            return _decline(f"the device service refused it: {error.__class__.__name__}: {error}")
        if admission.status == "rejected":
            with self._lock:
                self.attempts.pop(attempt_id, None)
            ctx.log(f"the device service cannot hold this job ({admission.reason}); running it alone")
            ctx.close()
            return _decline(f"rejected by the device service: {admission.reason}")
        owned.append(attempt_id)
        threading.Thread(target=self._wait, args=(entry,), name=f"wait-{attempt_id[:8]}", daemon=True).start()
        return self._accepted(entry, admission), entry.acked.set

    @staticmethod
    def _accepted(entry: _Attempt, admission) -> dict:
        """The reply to a ``run`` the service took: its pid and the job's admission (admitted or waiting)."""
        return {"ok": True, "pid": os.getpid(), "attempt": entry.attempt_id,
                "admission": {"status": admission.status, "lane": admission.lane,
                              "position": admission.position, "reason": admission.reason}}

    @staticmethod
    def _memory_request(session, limit: int):
        """The session's own estimate (a training session measures a throwaway CPU copy, two steps, as Salus
        does). Reserving the whole allocation as persistent memory would leave no room for lanes on a full
        device (the executor would pause the jobs once it measured their per-iteration memory), so without an
        estimate the allocation is split in halves."""
        from components.gpushare.lanes import MemoryRequest

        try:
            request = session.memory_estimate()
        except Exception as error:
            log.warning("profiling failed (%s); reserving half of %d B per iteration", error, limit)
            request = None
        return request if request is not None else MemoryRequest.from_limit(limit, persistent=limit // 2)

    def _wait(self, entry: _Attempt) -> None:
        executor = self.executor()
        crashed = False
        try:
            status = executor.wait(entry.attempt_id)
        except RuntimeError as error:  # the executor thread itself crashed
            crashed = True
            status = {"state": "failed", "error": f"the device executor crashed: {error!r}", "steps": 0}
        state, error, result = status["state"], status.get("error"), status.get("result")
        ctx, session = entry.ctx, entry.session
        # Checkpoints and final artifacts are stored by the job's host thread, an endpoint is stopped: the
        # attempt is not done (and its end not reported) before they are.
        try:
            session.settle(HOST_IO_WAIT_S)
        except Exception as upload_error:
            if state == "succeeded":
                state = "failed"
                error = f"storing a checkpoint or artifact failed: {upload_error.__class__.__name__}: {upload_error}"
            else:
                log.warning("attempt %s: an upload failed: %r", entry.attempt_id, upload_error)
        if crashed:
            # The job did not end by itself; the service is going down under it (the worker reports the
            # attempt as service_lost, as when the service dies).
            end = End.LOST
        elif state in ("succeeded", "cancelled") and session.stopped_on_request():
            end = End.STOPPED
        elif state == "succeeded":
            end = End.SUCCEEDED
        elif state == "cancelled":
            end = End.CANCELLED
            ctx.log("dropped by the device service without a checkpoint", level="warning")
        else:
            end = End.FAILED
        if end in (End.FAILED, End.LOST):
            ctx.log(error or "failed in the device service", level="error")
        with contextlib.suppress(Exception):
            ctx.close()  # flush logs and metrics before the caller reports the end
        entry.acked.wait(30)
        message = done_event(entry.attempt_id, end, error=error, steps=status.get("steps", 0),
                             result=result if isinstance(result, dict) else None)
        with contextlib.suppress(Exception):
            entry.send(message)
        with self._lock:
            self.attempts.pop(entry.attempt_id, None)
        entry.ended.set()
        if crashed:
            self.crashed.set()
            self.stopping.set()

    def cancel(self, attempt_id: str, hard: bool = False) -> bool:
        with self._lock:
            entry = self.attempts.get(attempt_id)
        if entry is None:
            return False
        entry.ctx.request_stop()  # the session checkpoints and ends at its next step
        entry.session.interrupt(hard)
        executor = self._executor
        if executor is not None:
            with contextlib.suppress(KeyError):
                state = executor.job_status(attempt_id)["state"]
                if hard or state == "waiting":
                    executor.cancel(attempt_id)
        return True

    def set_policy(self, name: str) -> None:
        from components.gpushare.policies import get_policy

        policy = get_policy(name)
        self.policy = policy.name
        executor = self._executor
        if executor is not None:
            with executor._cond:
                executor.policy = policy
                executor._cond.notify_all()

    # -- reports ---------------------------------------------------------------------------------------
    def status(self) -> dict:
        if self._executor is None:
            return {"device": self.label, "policy": self.policy, "budget": self.memory, "jobs": {},
                    "memory": {"lanes": []}, "counters": {"switches": 0, "utilization": 0.0}}
        return self._executor.status()

    def timeline(self, since: float = 0.0) -> list[dict]:
        executor = self._executor
        if executor is None:
            return []
        origin = executor.started_unix
        return [{**unit, "start": origin + unit["start"], "end": origin + unit["end"]}
                for unit in executor.timeline() if origin + unit["end"] > since]

    def report(self, since: float = 0.0, limit: int = SLICE_LIMIT) -> dict:
        """``{"sharing": entry, "cursor": unix s}``. The entry (the heartbeat's ``sharing`` item)::

            {"index", "policy", "switches", "switch_latency_ms": {"p50", "p99"}, "utilization" (0..1, since the
             previous report), "budget", "lanes": [{"id", "size", "attempts"}], "jobs": [{"attempt", "state",
             "persistent", "ephemeral", "lane", "steps"}], "slices": [{"attempt", "start", "end"}]}

        Jobs are those not ended, plus those that ended after ``since``. Slices merge consecutive units of one
        job; at most the last ``limit`` are sent.
        """
        now = time.time()  # the next cursor: taken before the snapshot, so nothing ending later is missed
        status = self.status()
        counters = status["counters"]
        latency = counters.get("switch_latency") or {}
        usage = (float(counters.get("busy_s", 0.0)), float(counters.get("wall_s", 0.0)))
        utilization = float(counters.get("utilization", 0.0))
        if self._usage is not None and usage[1] > self._usage[1]:
            utilization = (usage[0] - self._usage[0]) / (usage[1] - self._usage[1])
        self._usage = usage
        origin = self._executor.started_unix if self._executor is not None else time.time()
        jobs = []
        for job_id, job in status["jobs"].items():
            ended = job.get("finished_s")
            if ended is not None and origin + ended <= since:
                continue
            memory = job.get("measured") or job.get("request") or {}
            jobs.append({"attempt": job_id, "state": job["state"], "persistent": int(memory.get("persistent", 0)),
                         "ephemeral": int(memory.get("ephemeral", 0)), "lane": job.get("lane"),
                         "steps": int(job.get("steps", 0))})
        slices: list[dict] = []
        cursor = max(since, now)
        for unit in self.timeline(since):
            cursor = max(cursor, unit["end"])
            last = slices[-1] if slices else None
            if last and last["attempt"] == unit["job"] and unit["start"] - last["end"] < SLICE_MERGE_GAP_S:
                last["end"] = unit["end"]
            else:
                slices.append({"attempt": unit["job"], "start": unit["start"], "end": unit["end"]})
        entry = {
            "index": self.device_index,
            "policy": self.policy,
            "switches": int(counters.get("switches", 0)),
            "switch_latency_ms": {"p50": 1000.0 * (latency.get("p50_s") or 0.0),
                                  "p99": 1000.0 * (latency.get("p99_s") or 0.0)},
            "utilization": max(0.0, min(1.0, utilization)),
            "budget": int(status.get("budget") or self.memory or 0),
            "lanes": [{"id": lane["id"], "size": int(lane["size"]), "attempts": list(lane["jobs"])[:JOB_LIMIT]}
                      for lane in status["memory"]["lanes"]][:JOB_LIMIT],
            # Live jobs first: when there are too many, the ones that already ended are left out.
            "jobs": sorted(jobs, key=lambda job: job["state"] in _ENDED)[:JOB_LIMIT],
            "slices": slices[-max(0, limit):] if limit else [],
        }
        return {"sharing": entry, "cursor": cursor}

    # -- shutdown --------------------------------------------------------------------------------------
    def shutdown(self, grace: float = STOP_GRACE_S) -> None:
        """Ask every job to checkpoint and stop, give them ``grace`` seconds, then drop what is left."""
        with self._lock:
            entries = list(self.attempts.values())
        for entry in entries:
            entry.ctx.request_stop()
        deadline = time.monotonic() + grace
        for entry in entries:
            entry.ended.wait(max(0.0, deadline - time.monotonic()))
        if self._executor is not None:
            self._executor.shutdown(cancel=True, timeout=5)
        for entry in entries:
            entry.ended.wait(max(0.0, min(5.0, deadline + 5 - time.monotonic())))


def _serve_connection(service: DeviceService, conn: Connection) -> None:
    send_lock = threading.Lock()
    owned: list[str] = []

    def send(message: dict) -> None:
        with send_lock:
            conn.send(message)

    try:
        while True:
            message = conn.recv()
            try:
                reply, after = service.handle(message, send, owned)
            except Exception as error:
                reply, after = {"ok": False, "reason": f"{error.__class__.__name__}: {error}"}, None
                log.warning("request %r failed:\n%s", message.get("op"), traceback.format_exc())
            send(reply)
            if after is not None:
                after()
    except (EOFError, OSError):
        pass
    finally:
        # The caller went away (its worker died): stop its jobs, which checkpoint as on a stop request.
        for attempt_id in owned:
            service.cancel(attempt_id)
        with contextlib.suppress(OSError):
            conn.close()


def _accept_loop(service: DeviceService, listener: Listener) -> None:
    while not service.stopping.is_set():
        try:
            conn = listener.accept()
        except Exception:  # AuthenticationError, or a client that went away during the handshake
            if service.stopping.is_set():
                return
            continue
        threading.Thread(target=_serve_connection, args=(service, conn), daemon=True, name="gpushare-conn").start()


def _watch_parent(service: DeviceService, parent: int) -> None:
    while not service.stopping.is_set():
        time.sleep(0.5)
        if os.getppid() != parent:
            log.warning("the node agent is gone: stopping")
            service.stopping.set()
            return


def warm_up() -> None:
    """Warm every hostable kind's component (:meth:`components.runtime.contract.component.Component.warm_up`) while the
    service waits for its first attempt; a kind that fails to warm up costs a log line, never the service."""
    from components.runtime.contract.registry import import_path, kinds

    began = time.monotonic()
    warmed = []
    for name, spec in sorted(kinds().items()):
        try:
            component = import_path(spec.component)
            if getattr(component, "hostable", False):
                component.warm_up()
                warmed.append(name)
        except Exception as error:  # noqa: BLE001 - a broken kind is reported when an attempt of it runs
            log.warning("could not warm up kind %s: %r", name, error)
    log.info("warmed up %s in %.2f s", ", ".join(warmed) or "no kind", time.monotonic() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.gpushare.service", description=__doc__.split("\n")[0])
    parser.add_argument("--device-index", type=int, required=True)
    parser.add_argument("--kind", choices=["virtual", "cuda"], default="virtual")
    parser.add_argument("--memory", type=int, default=None, help="the device's memory budget in bytes")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--authkey-file", required=True)
    parser.add_argument("--policy", default=os.environ.get("STRATA_GPUSHARE_POLICY", DEFAULT_POLICY))
    parser.add_argument("--local-root", default=None, help="tests: LocalContexts under this folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpushare[%(process)d] %(levelname)s %(message)s")

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack to stderr
    parent = os.getppid()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent or parent == 1:  # the parent died before the signal was armed
        return 1
    service = DeviceService(args.device_index, args.kind, args.memory, args.policy, args.local_root)
    signal.signal(signal.SIGTERM, lambda *_: service.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: service.stopping.set())
    path = Path(args.socket)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a socket left by a service that died
    listener = Listener(str(path), family="AF_UNIX", authkey=read_authkey(args.authkey_file))
    path.chmod(0o600)
    threading.Thread(target=_accept_loop, args=(service, listener), daemon=True, name="gpushare-accept").start()
    threading.Thread(target=_watch_parent, args=(service, parent), daemon=True, name="gpushare-parent").start()
    if os.environ.get("STRATA_GPUSHARE_WARM_UP", "1") != "0":
        threading.Thread(target=warm_up, daemon=True, name="gpushare-warm-up").start()
    log.info("serving %s on %s (policy %s)", service.label, path, service.policy)
    while not service.stopping.wait(0.5):
        pass
    # A watchdog: whatever happens below, the process does not outlive its agent by more than a few seconds.
    threading.Timer(STOP_GRACE_S + 15.0, lambda: os._exit(2)).start()
    with contextlib.suppress(OSError):
        listener.close()
    path.unlink(missing_ok=True)
    service.shutdown()
    log.info("stopped")
    sys.stdout.flush()
    os._exit(1 if service.crashed.is_set() else 0)


if __name__ == "__main__":
    sys.exit(main())
