"""The sweep on warm trial runners: Fluid without a platform job's start per trial.

:class:`RunnerEngine` is the tune engine (:class:`components.tuning.component.Engine`: the same searcher,
scheduler, trials table, checkpoint and results) with its trials run by the sweep's own warm processes
(:mod:`components.tuning.runners`) instead of being placed one by one:

- at start, it starts ``runners`` processes per GPU of its attempt (each with that share of the GPU), which
  import and warm the trainable's kind up while the engine builds its searcher;
- an idle runner takes the next trial at once: the engine submits the trials of every idle runner in one call
  (:meth:`Children.batch`, each a nested child that the sweep runs itself, started in the same call), and sends
  each its configuration;
- a runner reports each iteration's result over its pipe and waits for the scheduler's decision, so a stopped
  trial runs not one step more, and a freed runner takes the next trial in the same tick;
- the control-plane work is batched: metric points, log lines, ends and the watch for cancellations go in one
  call every :data:`FLUSH_SECONDS` (and with each batch of submits); the trials' checkpoints and artifacts are
  stored on the trials' jobs by an upload thread, off the trials' path;
- every trial is still its own child job: visible (``strata jobs``, ``/jobs/?parent=``), cancellable (the
  next batch answers its state, and the runner stops it at its next step, after a checkpoint), checkpointed
  (its checkpoints are its job's) and with its own metrics, logs and ``model.pt``.

Scheduling: a trial holds its runner's share for its whole life; a synchronous rung pauses a trial (it
checkpoints, its job goes back to QUEUED) and a promotion runs it again, on whichever runner is free, from that
checkpoint. Runners are not resized: Fluid's growth of a trial across GPUs needs a process of its own
(``runners: 0``, every trial placed as a job of its own, water-filled).
"""

from __future__ import annotations

import json
import math
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from components.runtime.contract.context import Context, DeviceHandle
from components.tuning.component import Engine, Trial
from components.tuning.runners import READY_SECONDS, Runner, runner_layout, start_runners, stop_runners
from components.tuning.schedulers import Action

# How often the engine sends its batch (metric points, log lines, ends, the watch for cancellations).
FLUSH_SECONDS = 0.5
# How often, at most, the engine checkpoints its own state (each is an upload); and always at the end.
SAVE_SECONDS = 5.0
# How long the sweep's end waits for its runners to finish the trials the scheduler stopped last.
DRAIN_SECONDS = 30.0
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


def runners_per_gpu(spec: dict[str, Any], devices: list[DeviceHandle]) -> int:
    """Warm runners per GPU for this sweep: ``spec.runners`` when set (0: every trial is placed as a job of its
    own); otherwise 1 per virtual GPU (a virtual GPU is one CPU core: two trials on it only share the core) and
    ``packing`` per real GPU (as many trials as may share it). 0 for population based training, whose exploit
    step starts a trial's next job from another trial's checkpoint (placed)."""
    if spec["scheduler"]["name"] == "pbt" or not devices:
        return 0
    if spec.get("runners") is not None:
        return int(spec["runners"])
    return 1 if all(device.virtual for device in devices) else int(spec["packing"])


class Uploads:
    """Stores trials' files on their jobs from one thread, newest first per file (an older checkpoint of a
    trial still waiting is replaced by the newer one)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.pending: dict[tuple[str, str, str], bytes] = {}
        self.order: queue.Queue[tuple[str, str, str] | None] = queue.Queue()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._loop, name="trial-uploads", daemon=True)
        self.thread.start()

    def put(self, job: str, kind: str, name: str, data: bytes) -> None:
        key = (job, kind, name)
        with self.lock:
            fresh = key not in self.pending
            self.pending[key] = data
        if fresh:
            self.order.put(key)

    def _loop(self) -> None:
        while True:
            key = self.order.get()
            if key is None:
                return
            with self.lock:
                data = self.pending.pop(key, None)
            if data is None:
                continue
            try:
                self.ctx.children.put_file(key[0], key[2], data, kind=key[1])
            except Exception as error:  # noqa: BLE001 - logged; the trial itself goes on
                self.errors.append(f"{key[2]} of {key[0]}: {error}")

    def close(self, timeout: float = 120.0) -> None:
        self.order.put(None)
        self.thread.join(timeout)


class Sender:
    """The engine's control-plane calls, from a thread of their own, so no decision ever waits for one: what the
    engine queues (new trials, starts, points, lines, ends) goes in one :meth:`Children.batch` call as soon as
    something urgent is queued (a submit or a start) or every ``period`` seconds, with the ids to watch; each
    answer is queued back and a byte on ``wake`` wakes the engine's wait. A failed call keeps its parts for the
    next one (submits are idempotent)."""

    def __init__(self, ctx: Context, period: float):
        import socket

        self.ctx, self.period = ctx, period
        self.lock = threading.Condition()
        self.parts: dict[str, Any] = self._empty()
        self.numbers: list[int] = []  # the trial numbers of ``parts["submit"]``, in order
        self.watch: list[str] = []
        self.urgent = False
        self.closed = False
        self.answers: queue.Queue[tuple[list[int], dict[str, Any]]] = queue.Queue()
        self.wake, self._wake = socket.socketpair()
        self.wake.setblocking(False)
        self.calls, self.seconds, self.failures = 0, 0.0, 0
        self.thread = threading.Thread(target=self._loop, name="sweep-control-plane", daemon=True)
        self.thread.start()

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"submit": [], "start": [], "metrics": {}, "logs": {}, "end": {}}

    def queue(self, *, submit: tuple[int, dict[str, Any]] | None = None, start: str | None = None,
              metrics: tuple[str, list[dict[str, Any]]] | None = None,
              log: tuple[str, dict[str, Any]] | None = None, end: tuple[str, dict[str, str]] | None = None) -> None:
        with self.lock:
            if submit is not None:
                self.numbers.append(submit[0])
                self.parts["submit"].append(submit[1])
                self.urgent = True
            if start is not None:
                self.parts["start"].append(start)
                self.urgent = True
            if metrics is not None:
                self.parts["metrics"].setdefault(metrics[0], []).extend(metrics[1])
            if log is not None:
                self.parts["logs"].setdefault(log[0], []).append(log[1])
            if end is not None:
                self.parts["end"][end[0]] = end[1]
            if self.urgent:
                self.lock.notify()

    def watching(self, ids: list[str]) -> None:
        with self.lock:
            self.watch = list(ids)

    def _loop(self) -> None:
        while True:
            with self.lock:
                if not self.urgent and not self.closed:
                    self.lock.wait(self.period)
                parts, numbers = self.parts, self.numbers
                self.parts, self.numbers, self.urgent = self._empty(), [], False
                watch, closed = list(self.watch), self.closed
            busy = any(parts[key] for key in parts)
            if busy or watch:
                self._send(parts, numbers, watch)
            if closed:
                return

    def _send(self, parts: dict[str, Any], numbers: list[int], watch: list[str]) -> None:
        began = time.perf_counter()
        try:
            answer = self.ctx.children.batch(**parts, watch=watch)
        except Exception as error:  # noqa: BLE001 - kept for the next call
            self.failures += 1
            with self.lock:  # put back, before what was queued meanwhile
                for key in ("submit", "start"):
                    self.parts[key][:0] = parts[key]
                self.numbers[:0] = numbers
                for key in ("metrics", "logs"):
                    for job, items in parts[key].items():
                        self.parts[key].setdefault(job, [])[:0] = items
                self.parts["end"] = {**parts["end"], **self.parts["end"]}
            if self.failures in {1, 10, 100}:
                self.ctx.log(f"could not reach the control plane ({self.failures}): {error}", level="warning")
            time.sleep(min(self.period, 1.0))
            return
        self.calls += 1
        self.seconds += time.perf_counter() - began
        self.answers.put((numbers, answer))
        try:
            self._wake.send(b"x")
        except OSError:
            pass

    def flush(self, timeout: float = 60.0) -> None:
        """Send everything queued now and wait for its answer (queued as usual)."""
        with self.lock:
            self.urgent = True
            self.lock.notify()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                idle = not self.urgent and not any(self.parts[key] for key in self.parts)
            if idle:
                break
            time.sleep(0.01)
        calls = self.calls
        with self.lock:
            self.urgent = True
            self.lock.notify()
        while self.calls == calls and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.01)

    def close(self, timeout: float = 60.0) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify()
        self.thread.join(timeout)


class RunnerEngine(Engine):
    """The tune engine with its trials on warm runners (see the module's docstring)."""

    def __init__(self, ctx: Context, spec: dict[str, Any], *, per_gpu: int, poll: float = FLUSH_SECONDS,
                 clock=time.time, sleep=time.sleep, threads: int = 1):
        self.scratch = Path(tempfile.mkdtemp(prefix="strata-trials-"))
        handles = runner_layout(list(ctx.devices), per_gpu)
        # First: the runners import torch and warm up while the searcher (Optuna) is imported.
        self.runners: list[Runner] = start_runners(spec["trainable"]["kind"], handles, self.scratch, threads)
        super().__init__(ctx, spec, poll=poll, clock=clock, sleep=sleep)
        self.per_gpu = per_gpu
        self.uploads = Uploads(ctx)
        self.waiting: list[Trial] = []  # paused trials promoted (or resumed after a restart), to run again
        self.checkpoints: dict[str, bytes] = {}  # a trial job's latest checkpoint, to resume it from
        self.ready: list[Trial] = []  # trials submitted ahead (their jobs wait, QUEUED), for the next free runner
        self.inflight = 0  # trials asked for and queued for submission, not answered yet
        self.sender = Sender(ctx, poll)
        self.saved = 0.0
        self.started_runners = time.perf_counter()
        self.saving = threading.Lock()
        self.to_save: str | None = None
        self.saver: threading.Thread | None = None
        # What running the trials here cost, per trial (seconds): from its runner going free to its first line of
        # code (the engine's decision, the batched submit, the message), plus the time its runner spent on it
        # outside the trial's own code (waiting for decisions, sending its reports and files).
        self.gaps: dict[str, float] = {}
        self.overheads: list[float] = []
        self.platform: dict[str, Any] = {"runners": len(self.runners)}

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        try:
            saved = self.read_state()
            if saved is not None:
                self.restore(saved)
                for trial in self.live():  # their jobs wait (held) for this attempt to run them again
                    if trial.status == "running" and trial.job:
                        self.waiting.append(trial)
                    elif trial.status == "running":  # asked for, its submit not answered: again (idempotent)
                        body = self.child_body(trial.number, trial.params, self.runners[0].device.share)
                        self.sender.queue(submit=(trial.number, {
                            "job": body, "idempotency_key": f"{self.ctx.job_id}:trial:{trial.number}"}))
                        self.inflight += 1
            self.ctx.log(f"sweep: {self.spec['trials']} trials of {self.spec['trainable']['kind']}, searcher "
                         f"{self.spec['searcher']['name']}, scheduler {self.spec['scheduler']['name']}, on "
                         f"{len(self.runners)} warm trial runner(s) ({self.per_gpu} per GPU, "
                         f"{self.runners[0].device.share:g} GPU each)")
            while True:
                if self.ctx.should_stop():
                    self.stop_all("the sweep stops")
                    self.sender.flush()
                    self.save_now()
                    self.ctx.log("stopping the sweep (its trials keep their checkpoints)")
                    return self.summary()
                changed = self.answers()
                changed |= self.fill_runners()
                self.sender.watching([t.job for t in self.trials.values()
                                      if t.job and t.status in {"running", "paused"}])
                changed |= self.pump(self.poll)
                if changed:
                    self.report()
                    if self.clock() - self.saved >= SAVE_SECONDS:
                        self.save()
                if self.finished():
                    break
                if not any(r.ready or r.broken for r in self.runners) \
                        and time.perf_counter() - self.started_runners > READY_SECONDS:
                    raise RuntimeError(f"no trial runner was ready after {READY_SECONDS:.0f} s")
                if self.runners and all(r.broken for r in self.runners):
                    raise RuntimeError("every trial runner failed: " + "; ".join(r.broken for r in self.runners))
            self.drain_runners()
            self.sender.flush()
            self.answers()
            self.uploads.close()
            for error in self.uploads.errors[:20]:
                self.ctx.log(f"could not store a trial's file: {error}", level="warning")
            self.save_now()
            self.report()
            return self.finish()
        finally:
            stop_runners(self.runners)
            self.sender.close(timeout=10.0)
            self.uploads.close(timeout=5.0)

    def drain_runners(self) -> None:
        """The sweep is done, but the trials the scheduler stopped last may still be on their runners, finishing
        the iteration that decided it: wait for their ``done`` (DRAIN_SECONDS at most) so their jobs end with the
        sweep's reason (``stop_reason``) rather than with the sweep's own end; a runner that does not answer in
        time has its trial's job ended here."""
        deadline = time.perf_counter() + DRAIN_SECONDS
        while any(r.job and not r.broken for r in self.runners) and time.perf_counter() < deadline:
            self.pump(min(self.poll, 0.5))
        for runner in self.runners:
            trial = self.trials.get(runner.number) if runner.job else None
            if trial is not None and trial.status == "stopped" and trial.job == runner.job:
                self.end_job(trial.job, {"state": "CANCELLED", "reason": self.stop_reason(trial)})

    def save(self) -> None:
        """Checkpoint the engine's state from a thread of its own (the first save imports torch, and every one
        is an upload: decisions must not wait for them); :meth:`save_now` at the end."""
        with self.saving:
            self.to_save = json.dumps(self.state())
        self.saved = self.clock()
        if self.saver is None or not self.saver.is_alive():
            self.saver = threading.Thread(target=self._save_loop, name="sweep-checkpoint", daemon=True)
            self.saver.start()

    def _save_loop(self) -> None:
        while True:
            with self.saving:
                state, self.to_save = self.to_save, None
            if state is None:
                return
            try:
                self.write_state(state)
            except Exception as error:  # noqa: BLE001 - the next save tries again
                self.ctx.log(f"could not checkpoint the sweep: {error}", level="warning")

    def save_now(self) -> None:
        if self.saver is not None:
            self.saver.join()
        self.write_state(json.dumps(self.state()))

    # The engine's state is JSON: stored as the checkpoint's bytes as they are, so the engine never imports torch
    # (an import of seconds that would hold up the trials' decisions). A checkpoint the placed engine wrote
    # (``ctx.checkpoint``, torch's format) is read too.
    def write_state(self, state: str) -> None:
        self.ctx._save_checkpoint_bytes(b"STRATA-SWEEP-JSON\n" + state.encode())  # noqa: SLF001

    def read_state(self) -> dict[str, Any] | None:
        data = self.ctx._load_checkpoint_bytes()  # noqa: SLF001
        if data is None:
            return None
        if data.startswith(b"STRATA-SWEEP-JSON\n"):
            return json.loads(data.split(b"\n", 1)[1])
        saved = self.ctx.restore()
        return json.loads(saved["tune"]) if saved and "tune" in saved else None

    def room(self) -> int:
        return min(self.spec["max_concurrent"], len([r for r in self.runners if not r.broken]))

    def fill_runners(self) -> bool:
        """Keep a trial submitted ahead for every runner (the searcher's next, submitted by the sender thread while
        the runners train), and give every idle runner a trial at once: a promoted one first, else one submitted
        ahead. No control-plane call on this path: the start goes with the sender's next call."""
        changed = False
        while not self.exhausted and len(self.ready) + self.inflight < self.room():
            trial = self.propose()
            if trial is None:
                break
            number, params = trial.number, trial.params
            body = self.child_body(number, params, self.runners[0].device.share if self.runners else 0.0)
            self.sender.queue(submit=(number, {"job": body, "idempotency_key": f"{self.ctx.job_id}:trial:{number}"}))
            self.inflight += 1
            changed = True
        running = sum(1 for runner in self.runners if runner.job)
        for runner in self.runners:
            if not runner.idle or running >= self.room():
                continue
            trial = self.waiting.pop(0) if self.waiting else self.ready.pop(0) if self.ready else None
            if trial is None:
                break
            self.launch(runner, trial)
            running += 1
            changed = True
        return changed

    def answers(self) -> bool:
        """What the sender's calls answered: the jobs of the trials submitted ahead, and the states of the live
        trials (a job cancelled through the API stops its trial)."""
        changed = False
        while True:
            try:
                numbers, answer = self.sender.answers.get_nowait()
            except queue.Empty:
                return changed
            for number, summary in zip(numbers, answer.get("submitted", []), strict=False):
                trial = self.trials[number]
                trial.job = summary["id"]
                self.inflight -= 1
                if summary.get("state") in ENDED:
                    self.ended_outside(trial, summary["state"])
                else:
                    self.ready.append(trial)
                changed = True
            for job, state in answer.get("states", {}).items():
                if state.get("state") not in ENDED:
                    continue
                trial = next((t for t in self.trials.values() if t.job == job), None)
                if trial is not None and trial.status in {"running", "paused"}:
                    self.ended_outside(trial, state["state"])
                    changed = True
                elif trial is not None and trial.status == "completed" and state["state"] == "CANCELLED":
                    # Cancelled through the API after its last iteration, before its end reached the control
                    # plane: the job's state stands, and the table says so (its results still count).
                    trial.status = "stopped"
                    trial.reason = "its job was cancelled outside the sweep after its last iteration"
                    changed = True

    def launch(self, runner: Runner, trial: Trial) -> None:
        checkpoint = self.checkpoints.get(trial.job)
        if checkpoint is None and trial.iterations:
            checkpoint = self.ctx.children.checkpoint_of(trial.job)  # resumed after a restart of the sweep
        trial.status, trial.share = "running", runner.device.share
        trial.shares.append([self.clock(), trial.share])
        runner.job, runner.number = trial.job, trial.number
        self.gaps[trial.job] = time.perf_counter() - runner.free_since
        body = self.child_body(trial.number, trial.params, runner.device.share)
        runner.send({"op": "run", "job": trial.job, "kind": body["kind"], "spec": body["spec"],
                     "metric": self.metric, "checkpoint": checkpoint})
        self.sender.queue(start=trial.job)
        self.ctx.log(f"trial {trial.number} ({trial.job}): {json.dumps(trial.params, sort_keys=True)} on runner "
                     f"{runner.index}" + (" (from its checkpoint)" if checkpoint else ""))

    # -- what the runners say ----------------------------------------------------------------------------
    def pump(self, timeout: float) -> bool:
        """Handle every message the runners sent, waiting up to ``timeout`` for the first."""
        from multiprocessing.connection import wait

        live: dict[Any, Runner] = {runner.conn: runner for runner in self.runners if not runner.broken}
        changed = False
        for conn in wait([*live, self.sender.wake], timeout=timeout):
            if conn is self.sender.wake:
                try:
                    while self.sender.wake.recv(4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                continue
            runner = live[conn]
            while not runner.broken and conn.poll(0):
                try:
                    message = conn.recv()
                except (EOFError, OSError) as error:
                    changed |= self.runner_lost(runner, f"the runner exited: {error or 'end of pipe'}")
                    break
                changed |= self.handle(runner, message)
        return changed

    def handle(self, runner: Runner, message: dict[str, Any]) -> bool:
        op = message["op"]
        if op == "ready":
            runner.ready = True
            runner.free_since = time.perf_counter()
            self.platform["ready_s"] = round(time.perf_counter() - self.started_runners, 3)
            return False
        if op == "failed":
            runner.broken = message.get("reason") or "failed"
            self.ctx.log(f"trial runner {runner.index} failed to start: {runner.broken}", level="error")
            return False
        job = message.get("job", "")
        trial = self.trials.get(runner.number) if runner.job == job else None
        if op == "metrics":
            points = [{"name": name, "step": message["step"], "value": value}
                      for name, value in message["values"].items() if math.isfinite(value)]
            self.sender.queue(metrics=(job, points))
            if self.metric in message["values"]:
                go = trial is not None and trial.status == "running" and self.decide(trial, message)
                runner.send({"op": "decision", "job": job, "go": go})
                return True
            return False
        if op == "log":
            self.sender.queue(log=(job, {"message": message["message"], "level": message["level"]}))
            return False
        if op == "file":
            if message["kind"] == "checkpoint":
                self.checkpoints[job] = message["data"]
            self.uploads.put(job, message["kind"], message["name"], message["data"])
            return False
        if op == "done":
            runner.job, runner.number = "", -1
            runner.free_since = time.perf_counter()
            gap = self.gaps.pop(job, 0.0)
            if "wall_s" in message:
                self.overheads.append(gap + max(message["wall_s"] - message["own_s"], 0.0))
            if trial is not None:
                self.trial_done(trial, message["outcome"], message.get("reason", ""))
            return True
        return False

    def decide(self, trial: Trial, message: dict[str, Any]) -> bool:
        """One iteration's result: the scheduler's decision (True: run the next iteration)."""
        decision, iteration = self.observe(trial, message["step"], message["values"][self.metric], message["time"])
        if iteration >= self.spec["max_iterations"]:
            return True  # it has done every iteration: it completes
        if decision.action is Action.STOP:
            self.end(trial, "stopped", decision.reason)
            return False
        if decision.action is Action.PAUSE:
            trial.status, trial.reason = "paused", decision.reason
            return False
        return True

    def trial_done(self, trial: Trial, outcome: str, reason: str) -> None:
        """A runner finished ``trial``'s run: record how its job ended."""
        if trial.status == "paused":
            self.end_job(trial.job, {"state": "QUEUED", "reason": f"paused: {trial.reason}"[:500]})
            trial.shares.append([self.clock(), 0.0])
            trial.share = 0.0
            self.apply_resumes()
            return
        if trial.status == "stopped":
            self.end_job(trial.job, {"state": "CANCELLED", "reason": self.stop_reason(trial)})
            return
        if trial.status != "running":
            return  # ended already (cancelled through the API)
        if outcome == "succeeded":
            self.end(trial, "completed", "finished its iterations")
            self.end_job(trial.job, {"state": "SUCCEEDED", "reason": "all steps finished"})
        elif outcome == "stopped":  # stopped on the sweep's request (it stops): it waits for the next attempt
            self.end_job(trial.job, {"state": "QUEUED", "reason": "the sweep stopped; waiting for it"})
        else:
            self.end(trial, "failed", reason or "failed")
            self.end_job(trial.job, {"state": "FAILED", "reason": reason or "failed"})

    def runner_lost(self, runner: Runner, why: str) -> bool:
        runner.broken = why
        self.ctx.log(f"trial runner {runner.index}: {why}", level="error")
        trial = self.trials.get(runner.number) if runner.job else None
        runner.job, runner.number = "", -1
        if trial is not None and trial.status == "running":
            self.end(trial, "failed", why)
            self.end_job(trial.job, {"state": "FAILED", "reason": why[:500]})
        return True

    # -- the control plane, batched ----------------------------------------------------------------------
    def end_job(self, job: str, end: dict[str, str]) -> None:
        self.sender.queue(end=(job, end))

    def table(self) -> dict[str, Any]:
        """The engine's table, with what running the trials here cost (``platform``)."""
        table = super().table()
        costs = sorted(self.overheads)
        table["platform"] = {**self.platform, "batches": self.sender.calls, "batch_s": round(self.sender.seconds, 3),
                             "trials_measured": len(costs),
                             "per_trial_s": round(sum(costs) / len(costs), 4) if costs else None,
                             "per_trial_median_s": round(costs[len(costs) // 2], 4) if costs else None,
                             "per_trial_max_s": round(costs[-1], 4) if costs else None}
        return table

    def ended_outside(self, trial: Trial, state: str) -> None:
        """``trial``'s job ended outside the sweep (cancelled through the API): stop running it."""
        for runner in self.runners:
            if runner.job == trial.job:
                runner.send({"op": "stop", "job": trial.job})
        if trial in self.waiting:
            self.waiting.remove(trial)
        if trial in self.ready:
            self.ready.remove(trial)
        if state == "SUCCEEDED":
            self.end(trial, "completed", "finished its iterations")
            return
        trial.status, trial.reason = "stopped", f"its job was {state.lower()} outside the sweep"
        if self.scheduler.trials.get(str(trial.number), {}).get("status") in {"running", "paused"}:
            self.scheduler.stop(str(trial.number))
        self.searcher.tell(trial.number, trial.best(self.mode), state="pruned")
        trial.shares.append([self.clock(), 0.0])
        trial.share = 0.0
        self.ctx.log(f"trial {trial.number} stopped: its job was {state.lower()} outside the sweep")

    def stop_all(self, why: str) -> None:
        for runner in self.runners:
            if runner.job:
                runner.send({"op": "stop", "job": runner.job})

    # -- the engine's hooks ------------------------------------------------------------------------------
    def stop_child(self, trial: Trial) -> None:
        """A trial on a runner stops at the decision (its job's end goes with the next batch); a paused one
        (its job waits, QUEUED) is cancelled."""
        if trial in self.waiting:
            self.waiting.remove(trial)
        if trial.job and not any(runner.job == trial.job for runner in self.runners):
            self.ctx.children.cancel(trial.job, self.stop_reason(trial))

    def resume_child(self, trial: Trial) -> None:
        if trial not in self.waiting:
            self.waiting.append(trial)

    def rebalance(self) -> bool:
        return False  # a runner's share is fixed
