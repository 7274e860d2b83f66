"""The per-device execution service (Salus + SwitchFlow): several jobs on one device, switched per iteration.

One :class:`DeviceExecutor` owns one device. Jobs are submitted as :class:`~components.gpushare.sessions.Session`
objects (a Workload, a TrainLoop, anything with ``step()``). The executor

- **admits** a job only when its persistent memory plus a lane for its iteration fit the device budget
  (:class:`~components.gpushare.lanes.LaneAllocator`); a job that does not fit waits inside the service and is
  admitted when others leave, so admitted work never runs out of memory;
- runs **one execution thread** -- one iteration (or one stage) of one job at a time, like a single kernel
  stream -- and at every iteration boundary asks its **policy** (PACK, SRTF, FAIR, PRIORITY, FIFO) which job
  goes next. Switching is a function call: each job's parameters and optimizer state stay resident, nothing
  is checkpointed or copied;
- serves **inference requests** before any training work and makes a running stage-aware training job
  (:class:`~components.gpushare.stages.StagedSession`) **yield at its next stage boundary** when a request
  or a higher-priority job arrives (SwitchFlow); the preempted iteration resumes where it stopped. A staged
  job may instead serve queued requests **in place, between two of its operators**
  (``should_yield.serve_pending``, :meth:`DeviceExecutor._serve_inline`), so a request waits one operator;
- lets a job built with ``migrate_to`` run its next stages on **another device** while higher-priority work
  holds this one (SwitchFlow's migration: :mod:`components.gpushare.migration`, ``should_yield.contended``);
- **measures** each job: the first iterations' ephemeral peak (CUDA memory statistics, or the allocation
  meter on virtual GPUs) and its resident bytes; a job that turns out to need more than it reserved is
  re-laned, or paused until the memory is there;
- **isolates failures**: a job whose step raises is failed and its lane freed; the others keep running.

Counters: switches and switch latency (the gap between the end of one job's iteration and the start of the
next job's, when the next one was ready: pure scheduling overhead), utilization (busy time in iterations /
wall time), preemption latency (from a preemption request to the running job giving the device up),
inference latency, memory by lane, and a timeline of (job, kind, start, end, device).

On CUDA the executor synchronizes at the end of every unit of work (so the timeline and memory figures are
exact), and with ``enforce_memory_fraction`` caps the process at the budget with
``torch.cuda.set_per_process_memory_fraction``. On a virtual GPU (the CPU) the budget is enforced by the
accounting above.

Thread-safe API: :meth:`submit`, :meth:`serve`, :meth:`infer`, :meth:`cancel`, :meth:`wait`, :meth:`status`,
:meth:`job_status`, :meth:`timeline`, :meth:`shutdown`.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from components.gpushare.lanes import Admission, LaneAllocator, MemoryRequest, parse_bytes
from components.gpushare.memory import EphemeralMeter, persistent_bytes
from components.gpushare.policies import JobView, Policy, get_policy
from components.gpushare.sessions import Progress, Session, as_session
from components.runtime.shared.stats import percentile

log = logging.getLogger(__name__)

DEFAULT_VIRTUAL_BUDGET = 8 * 2**30
STEP_TIME_SMOOTHING = 0.3  # weight of the newest iteration in the step-time average
STATS_WINDOW = 100_000  # samples kept for percentiles
NOT_READY_POLL_S = 0.05  # idle wait when some job is not ready and did not promise a wakeup


class JobState(enum.StrEnum):
    WAITING = "waiting"  # queued for memory
    ADMITTED = "admitted"  # resident on the device, taking turns
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"  # can never fit the device

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED)


class ExecutorClosed(RuntimeError):
    pass


@dataclass
class _Request:
    inputs: Any
    arrival: float
    future: Future


@dataclass
class _Job:
    job_id: str
    session: Session
    request: MemoryRequest
    priority: int
    weight: float
    seq: int
    kind: str  # "train" | "inference"
    submitted: float
    state: JobState = JobState.WAITING
    lane: int | None = None
    admitted_at: float | None = None
    finished_at: float | None = None
    started: bool = False
    steps: int = 0
    slices: int = 0
    step_time: float | None = None
    iteration_time: float = 0.0  # device time of the iteration in flight (across preemptions)
    attained: float = 0.0
    virtual_start: float = 0.0
    last_run: int = -1
    mid_iteration: bool = False
    cancel_requested: bool = False
    paused: str = ""  # why the job may not run for now (it needs more memory than it reserved)
    measure_left: int = 0
    meter: EphemeralMeter | None = None
    persistent_seen: int | None = None
    measured: MemoryRequest | None = None
    overruns: int = 0
    kill_reason: str | None = None  # set when the executor itself stops the job (it can never fit)
    error: str | None = None
    queue: deque = field(default_factory=deque)  # inference requests
    served: int = 0
    last_served: float | None = None  # an endpoint's last request end (migration's settle window)
    migrations: int = 0  # times the job moved its work to another device
    migration: dict[str, Any] | None = None  # the session's migration_stats(), kept after it ends
    result: Any = None
    done: threading.Event = field(default_factory=threading.Event)



def _summary(values) -> dict[str, Any]:
    values = list(values)
    return {
        "count": len(values),
        "p50_s": percentile(values, 0.5),
        "p99_s": percentile(values, 0.99),
        "max_s": max(values) if values else None,
        "mean_s": sum(values) / len(values) if values else None,
    }


class DeviceExecutor:
    """The execution service of one device. See the module docstring for the mechanism.

    ``device``: ``"cpu"`` (a virtual GPU), ``"cuda:N"``, a ``torch.device`` or a
    :class:`~components.runtime.contract.context.DeviceHandle`. ``memory_budget``: bytes (or ``"6GiB"``); default the
    handle's memory, the CUDA device's total, or 8 GiB for a virtual GPU. ``policy``: a name or a
    :class:`~components.gpushare.policies.Policy`. ``measure_iterations``: how many first iterations of
    each job run under the allocation meter on a virtual GPU (CUDA measures every iteration).
    ``iteration_context``: a callable returning a context manager entered around every unit of device work
    on the execution thread. ``max_lanes`` / ``max_bypass``: see :class:`LaneAllocator`. ``start=False``
    defers the execution thread to :meth:`start`. The records of the last ``retain_finished`` ended jobs
    are kept for :meth:`job_status`; an ended job's session is dropped (its device memory with it, unless
    the caller still holds it).
    """

    def __init__(
        self,
        device: Any = "cpu",
        memory_budget: int | str | None = None,
        policy: str | Policy = "pack",
        *,
        name: str | None = None,
        measure_iterations: int = 2,
        enforce_memory_fraction: bool = True,
        iteration_context: Callable[[], Any] | None = None,
        max_lanes: int | None = None,
        max_bypass: int = 8,
        timeline_limit: int = STATS_WINDOW,
        retain_finished: int = 1000,
        migration_settle_s: float = 0.25,
        start: bool = True,
    ):
        handle_memory = getattr(device, "memory", None) if hasattr(device, "torch_device") else None
        if hasattr(device, "torch_device"):  # a DeviceHandle
            label = f"{device.kind}:{device.index}"
            device = device.torch_device
        else:
            label = None
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.label = name or label or (str(self.device) if self.cuda else "virtual:0")
        if memory_budget is not None:
            budget = parse_bytes(memory_budget)
        elif handle_memory:
            budget = int(handle_memory)
        elif self.cuda:
            budget = torch.cuda.get_device_properties(self.device).total_memory
        else:
            budget = DEFAULT_VIRTUAL_BUDGET
        self.budget = budget
        if self.cuda and enforce_memory_fraction:
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            total = torch.cuda.get_device_properties(index).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), index)
        self.policy = get_policy(policy)
        self.migration_settle_s = float(migration_settle_s)
        self.retain_finished = max(1, int(retain_finished))
        self._finished: deque[str] = deque()
        self.measure_iterations = max(0, int(measure_iterations))
        self._iteration_context = iteration_context or contextlib.nullcontext
        self._allocator = LaneAllocator(budget, max_lanes=max_lanes, max_bypass=max_bypass)
        self._cond = threading.Condition()  # re-entrant: a session may call wakeup() from ready()
        self._jobs: dict[str, _Job] = {}  # every job still remembered (live and recently ended)
        self._live: dict[str, _Job] = {}  # jobs that have not ended: what the scheduling loops scan
        self._seq = 0
        self._tick = 0
        self._to_start: deque[_Job] = deque()
        self._current: _Job | None = None
        self._yield = threading.Event()
        self._yield_at: float | None = None
        self._yield_inline_only = False  # every pending yield request is an inference request
        self._closing = False
        self._cancel_on_close = True
        self._crashed: BaseException | None = None
        # clocks and counters
        self._t0 = time.perf_counter()
        self._unix0 = time.time()
        self._busy = 0.0
        self._iterations = 0
        self._switches = 0
        self._switch_gaps: deque[float] = deque(maxlen=STATS_WINDOW)
        self._continue_gaps: deque[float] = deque(maxlen=STATS_WINDOW)
        self._preemptions = 0
        self._migrations = 0
        self._preempt_latencies: deque[float] = deque(maxlen=STATS_WINDOW)
        self._inference_latencies: deque[float] = deque(maxlen=STATS_WINDOW)
        self._timeline: deque[tuple[str, str, float, float]] = deque(maxlen=timeline_limit)
        self._last_end: float | None = None
        self._last_job: str | None = None
        self._fair_clock = 0.0
        self._admitted_count = 0
        self._active_since: float | None = None
        self._active_total = 0.0
        self._thread = threading.Thread(target=self._run, name=f"gpushare-{self.label}", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Start the execution thread (done by the constructor unless ``start=False``: then jobs submitted
        before are admitted or queued, and all begin together)."""
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()

    # -- public API -----------------------------------------------------------------------------------------
    def submit(
        self,
        job_id: str,
        session: Any,
        memory_request: MemoryRequest | None = None,
        priority: int = 0,
        weight: float = 1.0,
        **session_options: Any,
    ) -> Admission:
        """Submit a training job. Returns its admission: admitted (with its lane), waiting, or rejected.

        ``memory_request`` defaults to ``session.memory_estimate()`` (a :class:`WorkloadSession` profiles
        itself on a CPU copy, in this thread). ``weight`` is the FAIR share (e.g. the job's ``gpus``
        fraction); ``priority`` orders admission and PRIORITY scheduling, and a job of higher priority than
        the running one preempts it at its next stage boundary.
        """
        return self._add(job_id, as_session(session, **session_options), memory_request, priority, weight,
                         "train")

    def serve(
        self, name: str, session: Any, memory_request: MemoryRequest | None = None, priority: int = 0
    ) -> Admission:
        """Register an inference endpoint (an :class:`~components.gpushare.stages.InferenceSession` or an
        ``nn.Module``). It gets a lane of its own; requests go through :meth:`infer`."""
        from components.gpushare.stages import InferenceSession

        if not isinstance(session, InferenceSession):
            session = InferenceSession(session)
        return self._add(name, session, memory_request, priority, 1.0, "inference")

    def infer(self, name: str, inputs: Any) -> Future:
        """Queue an inference request; the future resolves to the model's output.

        Requests are served before any training work; a running staged training job yields at its next
        stage boundary.
        """
        request = _Request(inputs, time.perf_counter(), Future())
        with self._cond:
            job = self._jobs.get(name)
            if job is None or job.kind != "inference":
                raise KeyError(f"no inference endpoint {name!r}")
            if job.state.terminal or job.cancel_requested:
                raise ExecutorClosed(f"endpoint {name!r} is {job.state.value}")
            self._check_open()
            job.queue.append(request)
            if self._current is not None and self._current.kind == "train":
                self._request_yield(inline_ok=True)
            self._cond.notify_all()
        return request.future

    def cancel(self, job_id: str) -> bool:
        """Stop a job: a waiting one leaves the queue at once, an admitted one after its current iteration
        (a staged one at its next stage boundary). False when the job already ended."""
        with self._cond:
            job = self._jobs[job_id]
            if job.state.terminal:
                return False
            if job.state is JobState.WAITING:
                self._finalize(job, JobState.CANCELLED)
                return True
            job.cancel_requested = True
            if self._current is job:
                self._request_yield()
            self._cond.notify_all()
            return True

    def wait(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends; returns :meth:`job_status`. Raises TimeoutError."""
        with self._cond:
            job = self._jobs[job_id]
        if not job.done.wait(timeout):
            raise TimeoutError(f"job {job_id!r} still {job.state.value} after {timeout} s")
        if self._crashed is not None and job.state is not JobState.SUCCEEDED:
            raise RuntimeError("the executor thread crashed") from self._crashed
        return self.job_status(job_id)

    def job_status(self, job_id: str) -> dict[str, Any]:
        with self._cond:
            return self._job_status(self._jobs[job_id])

    def status(self) -> dict[str, Any]:
        """A snapshot: memory and lanes, every job, and the counters."""
        with self._cond:
            now = time.perf_counter()
            wall = now - self._t0
            active = self._active_total + (now - self._active_since if self._active_since is not None else 0.0)
            memory = self._allocator.snapshot()
            for lane in memory["lanes"]:
                lane["measured"] = {
                    job_id: self._jobs[job_id].measured.to_dict() if self._jobs[job_id].measured else None
                    for job_id in lane["jobs"]
                }
            return {
                "device": self.label,
                "torch_device": str(self.device),
                "virtual": not self.cuda,
                "policy": self.policy.name,
                "budget": self.budget,
                "memory": memory,
                "jobs": {job_id: self._job_status(job) for job_id, job in self._jobs.items()},
                "counters": {
                    "iterations": self._iterations,
                    "switches": self._switches,
                    "switch_latency": _summary(self._switch_gaps),
                    "same_job_gap": _summary(self._continue_gaps),
                    "busy_s": self._busy,
                    "wall_s": wall,
                    "utilization": self._busy / wall if wall > 0 else 0.0,
                    "active_s": active,
                    "active_utilization": self._busy / active if active > 0 else 0.0,
                    "preemptions": self._preemptions,
                    "migrations": self._migrations,
                    "preemption_latency": _summary(self._preempt_latencies),
                    "inference_latency": _summary(self._inference_latencies),
                },
                "crashed": repr(self._crashed) if self._crashed else None,
            }

    def timeline(self) -> list[dict[str, Any]]:
        """Units of device work: ``{"job", "kind" (setup|iteration|slice|inference), "start", "end", "device"}``,
        in seconds since the executor started (``start_unix`` in :meth:`status` terms: ``self.started_unix``)."""
        with self._cond:
            return [{"job": job, "kind": kind, "start": start, "end": end, "device": self.label}
                    for job, kind, start, end in self._timeline]

    @property
    def started_unix(self) -> float:
        return self._unix0

    def shutdown(self, *, cancel: bool = True, timeout: float | None = None) -> None:
        """Stop the service: cancel every job (or, with ``cancel=False``, let them finish), then join."""
        with self._cond:
            self._closing = True
            self._cancel_on_close = cancel
            if cancel:
                for job in list(self._live.values()):
                    if job.state is JobState.WAITING:
                        self._finalize(job, JobState.CANCELLED)
                    elif not job.state.terminal:
                        job.cancel_requested = True
                self._request_yield()
            self._cond.notify_all()
        if self._thread.ident is None:  # never started: end what is left here
            self.start()
        self._thread.join(timeout)

    def __enter__(self) -> DeviceExecutor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown(cancel=True)

    # -- submission -----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closing:
            raise ExecutorClosed("the executor is shutting down")
        if self._crashed is not None:
            raise ExecutorClosed("the executor thread crashed") from self._crashed

    def _add(self, job_id, session, memory_request, priority, weight, kind) -> Admission:
        if weight <= 0:
            raise ValueError(f"weight must be positive, got {weight}")
        with self._cond:
            self._check_open()
            if job_id in self._jobs:
                raise ValueError(f"job {job_id!r} was already submitted to this executor")
        request = memory_request if memory_request is not None else session.memory_estimate()
        if request is None:
            raise ValueError(f"job {job_id!r}: give a memory_request; its session cannot estimate one")
        with self._cond:
            self._check_open()
            if job_id in self._jobs:
                raise ValueError(f"job {job_id!r} was already submitted to this executor")
            self._seq += 1
            job = _Job(job_id, session, request, int(priority), float(weight), self._seq, kind,
                       time.perf_counter())
            self._jobs[job_id] = job
            admission = self._allocator.request(job_id, request, job.priority, exclusive=kind == "inference")
            if admission.status == "rejected":
                job.error = admission.reason
                job.state = JobState.REJECTED
                job.finished_at = time.perf_counter()
                job.session = None
                self._remember_ended(job)
                job.done.set()
                return admission
            self._live[job_id] = job
            if admission.admitted:
                self._on_admitted(job)
            self._admit(list(admission.also_admitted))
            self._cond.notify_all()
            return admission

    def _on_admitted(self, job: _Job) -> None:
        job.state = JobState.ADMITTED
        job.lane = self._allocator.lane_of(job.job_id)
        job.admitted_at = time.perf_counter()
        running = [other for other in self._live.values()
                   if other.kind == "train" and other.state is JobState.ADMITTED and other is not job]
        if running:
            self._fair_clock = min(other.virtual_start + other.attained / other.weight for other in running)
        job.virtual_start = self._fair_clock
        job.measure_left = self.measure_iterations
        job.session.bind(self._wakeup)
        self._to_start.append(job)
        if self._admitted_count == 0:
            self._active_since = job.admitted_at
        self._admitted_count += 1
        current = self._current
        if current is not None and current.kind == "train" and job.priority > current.priority:
            # The running job's lane is busy until its iteration ends: preempting it only helps if the new
            # job has a lane of its own.
            if job.lane != current.lane or self._allocator.separate(job.job_id):
                job.lane = self._allocator.lane_of(job.job_id)
                self._request_yield()

    def _wakeup(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _request_yield(self, inline_ok: bool = False) -> None:
        """Ask the running job to give the device up. ``inline_ok``: the request is only for inference,
        which a session that supports it may serve in place (:meth:`_serve_inline`)."""
        if self._yield_at is None:
            self._yield_at = time.perf_counter()
        if not self._yield.is_set():
            self._yield_inline_only = inline_ok
            self._yield.set()
        elif not inline_ok:
            self._yield_inline_only = False

    # -- the execution thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                work = self._next_work()
                if work is None:
                    return
                kind, job, payload, previous = work
                if kind == "close":
                    self._close(job, JobState.CANCELLED)
                elif kind == "start":
                    self._start(job)
                elif kind == "infer":
                    self._serve(job, payload, previous)
                else:
                    self._step(job, previous)
        except BaseException as error:  # a bug in the executor itself: fail everything visibly
            log.exception("gpushare executor %s crashed", self.label)
            with self._cond:
                self._crashed = error
                for job in self._live.values():
                    if not job.state.terminal:
                        job.error = f"executor crashed: {error!r}"
                        job.state = JobState.FAILED
                        job.done.set()
                        for request in job.queue:
                            request.future.set_exception(ExecutorClosed("the executor crashed"))
                self._cond.notify_all()

    def _next_work(self) -> tuple[str, _Job, Any, tuple[float | None, str | None]] | None:
        """The next unit of device work, chosen under the lock; it becomes ``_current`` in the same critical
        section, so a request arriving from now on asks *it* to yield."""
        with self._cond:
            work = self._choose_work()
            if work is None:
                return None
            kind, job, payload = work
            self._current = job
            self._yield.clear()
            self._yield_at = None
            self._yield_inline_only = False
            return kind, job, payload, (self._last_end, self._last_job)

    def _choose_work(self) -> tuple[str, _Job, Any] | None:
        with self._cond:
            while True:
                for job in self._live.values():
                    if job.state is JobState.ADMITTED and job.cancel_requested:
                        return ("close", job, None)
                for job in self._live.values():
                    if job.kind == "inference" and job.state is JobState.ADMITTED and job.queue:
                        if not job.started:
                            with contextlib.suppress(ValueError):
                                self._to_start.remove(job)
                            return ("start", job, None)
                        return ("infer", job, job.queue.popleft())
                if self._to_start:
                    return ("start", self._to_start.popleft(), None)
                job = self._migrating()
                if job is not None:
                    return ("step", job, None)
                job = self._pick()
                if job is not None:
                    return ("step", job, None)
                if self._closing and not any(j.kind == "train" for j in self._live.values()):
                    for job in list(self._live.values()):  # endpoints end with the service
                        self._finalize(job, JobState.CANCELLED)
                    return None
                self._last_end = None  # idle: the next gap is not switching overhead
                waiting_on_host = any(
                    j.kind == "train" and j.state is JobState.ADMITTED and j.started and not j.paused
                    for j in self._live.values()
                )
                self._cond.wait(NOT_READY_POLL_S if waiting_on_host else None)

    def _migrating(self) -> _Job | None:
        """A job that can migrate and should, because higher-priority work holds the device: it gets one call
        of ``step()``, which hands its work to its fallback device at once (SwitchFlow) instead of waiting
        for the policy to pick it."""
        for job in self._live.values():
            session = job.session
            if (job.kind == "train" and job.state is JobState.ADMITTED and job.started and not job.paused
                    and not job.cancel_requested and getattr(session, "migration", None) is not None
                    and not getattr(session, "away", False) and self._contended(job)):
                return job
        return None

    def _pick(self) -> _Job | None:
        busy_lanes = {job.lane for job in self._live.values()
                      if job.mid_iteration and job.state is JobState.ADMITTED}
        candidates = []
        for job in self._live.values():
            if (job.kind != "train" or job.state is not JobState.ADMITTED or not job.started or job.paused
                    or job.cancel_requested):
                continue
            if job.mid_iteration:
                candidates.append(job)
            elif job.lane not in busy_lanes and job.session.ready():
                candidates.append(job)
        if not candidates:
            return None
        resuming = [job for job in candidates if job.mid_iteration]
        if resuming:
            # A preempted iteration holds its lane: resume it unless a higher-priority job is waiting to run.
            top = max(job.priority for job in resuming)
            higher = [job for job in candidates if job.priority > top and not job.mid_iteration]
            candidates = higher or resuming
        views = {job.job_id: job for job in candidates}
        chosen = self.policy.pick([self._view(job) for job in candidates])
        return views[chosen.job_id]

    def _view(self, job: _Job) -> JobView:
        remaining = job.session.remaining_steps()
        return JobView(job.job_id, job.seq, job.priority, job.weight, remaining, job.step_time, job.attained,
                       job.virtual_start, job.last_run)

    @contextlib.contextmanager
    def _device_work(self, job: _Job, meter: EphemeralMeter | None):
        with self._iteration_context():
            if meter is not None:
                meter.__enter__()
            try:
                yield
            finally:
                if self.cuda:
                    torch.cuda.synchronize(self.device)
                if meter is not None:
                    meter.__exit__(None, None, None)

    def _record_gap(self, job: _Job, start: float, previous: tuple[float | None, str | None]) -> None:
        """Count a switch when the device changes jobs; time it when nothing but scheduling came between
        (no idle wait, setup or cleanup)."""
        previous_end, previous_job = previous
        switched = previous_job is not None and previous_job != job.job_id
        if switched:
            self._switches += 1
        if previous_end is None:
            return
        gap = start - previous_end
        (self._switch_gaps if switched else self._continue_gaps).append(gap)

    def _start(self, job: _Job) -> None:
        start = time.perf_counter()
        error = None
        try:
            with self._device_work(job, None):
                job.session.start(self.device)
            job.persistent_seen = persistent_bytes(*job.session.resident(), device=self.device).total
        except Exception:
            error = traceback.format_exc()
        end = time.perf_counter()
        if error is not None:
            self._close(job, JobState.FAILED, error, unit=("setup", start, end))
            return
        with self._cond:
            self._current = None
            job.started = True
            self._busy += end - start
            self._timeline.append((job.job_id, "setup", start - self._t0, end - self._t0))
            self._last_end = None  # a setup between two iterations is not switching overhead
            if job.persistent_seen and job.persistent_seen > job.request.persistent:
                self._account(job, job.persistent_seen, None)
            self._cond.notify_all()

    def _step(self, job: _Job, previous: tuple[float | None, str | None]) -> None:
        measure = self.cuda or job.measure_left > 0
        if measure and job.meter is None:
            job.meter = EphemeralMeter(self.device)

        def should_yield() -> bool:
            return self._yield.is_set() or job.cancel_requested

        inline = [0.0]

        def serve_pending() -> float:
            spent = self._serve_inline(job)
            inline[0] += spent
            return spent

        # A session may serve queued requests in place, between two of its operators (see StagedSession).
        # Offered only while an endpoint is live: the per-operator check costs training about a fifth of its
        # speed, for nothing when no request can come.
        with self._cond:
            endpoints = any(other.kind == "inference" for other in self._live.values())
        should_yield.serve_pending = serve_pending if endpoints else None  # type: ignore[attr-defined]
        # A session that can migrate asks whether higher-priority work holds the device (SwitchFlow).
        should_yield.contended = lambda: self._contended(job)  # type: ignore[attr-defined]

        error = None
        progress = None
        start = time.perf_counter()
        try:
            with self._device_work(job, job.meter if measure else None):
                start = time.perf_counter()
                progress = job.session.step(should_yield)
        except Exception:
            error = traceback.format_exc()
        end = time.perf_counter()
        if not isinstance(progress, Progress) and error is None:
            error = f"session.step() returned {progress!r}, not a Progress"
        persistent = None
        if error is None and measure and progress is not Progress.YIELDED:
            try:
                persistent = persistent_bytes(*job.session.resident(), device=self.device).total
            except Exception:
                persistent = None
        with self._cond:
            self._current = None
            self._record_gap(job, start, previous)
            duration = end - start - inline[0]  # requests served in place count as inference
            self._busy += duration
            job.attained += duration
            job.last_run = self._tick
            self._tick += 1
            job.slices += 1
            yielded_for = self._yield_at
            if yielded_for is not None:
                self._preempt_latencies.append(end - yielded_for)
            kind = "slice" if progress is Progress.YIELDED or job.mid_iteration else "iteration"
            self._timeline.append((job.job_id, kind, start - self._t0, end - self._t0))
            self._last_end = end
            self._last_job = job.job_id
            stats = getattr(job.session, "migration_stats", None)
            if callable(stats):
                job.migration = stats()
            if progress is Progress.YIELDED and getattr(job.session, "away", False):
                # The job went on on another device: it holds no lane here and is not resumed until it
                # parks (session.ready()).
                job.mid_iteration = False
                job.iteration_time += duration
                job.migrations += 1
                self._migrations += 1
                if yielded_for is not None:
                    self._preemptions += 1
            elif progress is Progress.YIELDED:
                job.mid_iteration = True
                job.iteration_time += duration
                if yielded_for is not None:
                    self._preemptions += 1
            elif error is None:
                job.mid_iteration = False
                iteration = job.iteration_time + duration
                job.iteration_time = 0.0
                job.steps += 1
                self._iterations += 1
                job.step_time = iteration if job.step_time is None else (
                    STEP_TIME_SMOOTHING * iteration + (1 - STEP_TIME_SMOOTHING) * job.step_time)
                if measure and job.meter is not None:
                    peak = job.meter.peak
                    job.meter = None
                    job.measure_left = max(0, job.measure_left - 1)
                    growth = 0
                    if persistent is not None and job.persistent_seen is not None:
                        growth = max(0, persistent - job.persistent_seen)
                    if persistent is not None:
                        job.persistent_seen = persistent
                    self._account(job, persistent, max(0, peak - growth))
        if error is not None:
            self._close(job, JobState.FAILED, error)
        elif progress is Progress.DONE:
            self._close(job, JobState.SUCCEEDED)
        elif job.cancel_requested:
            self._close(job, JobState.CANCELLED)

    def _contended(self, job: _Job) -> bool:
        """True while higher-priority work holds (or wants) the device: an admitted training job of higher
        priority, or an inference endpoint with queued requests or one served within
        ``migration_settle_s``. A migrating session runs on its fallback device while this holds."""
        with self._cond:
            if self._closing or job.cancel_requested or job.state is not JobState.ADMITTED:
                return False
            now = time.perf_counter()
            for other in self._live.values():
                if other is job or other.state is not JobState.ADMITTED:
                    continue
                if other.kind == "inference":
                    if other.queue or self._current is other or (
                            other.last_served is not None and now - other.last_served < self.migration_settle_s):
                        return True
                elif other.priority > job.priority and not other.paused and not other.cancel_requested:
                    return True
            return False

    def _serve_inline(self, train_job: _Job) -> float:
        """Serve the queued inference requests from inside ``train_job``'s running step (on this thread,
        between two of its operators, already inside the iteration context); return the seconds spent.

        Clears the yield request when inference was its only reason, so the training step goes on."""
        began = time.perf_counter()
        while True:
            with self._cond:
                if train_job.cancel_requested or self._crashed is not None:
                    break
                work = next(((job, job.queue.popleft()) for job in self._live.values()
                             if job.kind == "inference" and job.state is JobState.ADMITTED and job.started
                             and job.queue), None)
                if work is None:
                    if self._yield_inline_only:
                        self._yield.clear()
                        self._yield_at = None
                    break
                if self._yield_at is not None and self._yield_inline_only:
                    self._preempt_latencies.append(time.perf_counter() - self._yield_at)
                    self._preemptions += 1
                    self._yield_at = None  # a request arriving while this one runs starts a new wait
            self._serve(*work, None, inline=True)
        return time.perf_counter() - began

    def _serve(self, job: _Job, request: _Request, previous: tuple[float | None, str | None],
               inline: bool = False) -> None:
        measure = self.cuda or job.measure_left > 0
        # In place, the request runs inside the training step's context (and its meter, if any).
        meter = EphemeralMeter(self.device) if measure and not inline else None
        start = time.perf_counter()
        output = error = None
        try:
            with contextlib.nullcontext() if inline else self._device_work(job, meter):
                start = time.perf_counter()
                output = job.session.run(request.inputs)
                if inline and self.cuda:
                    torch.cuda.synchronize(self.device)
        except Exception as exc:
            error = exc
        end = time.perf_counter()
        with self._cond:
            if not inline:
                self._current = None
                self._record_gap(job, start, previous)
                self._last_end = end
                self._last_job = job.job_id
            self._busy += end - start
            job.attained += end - start
            job.served += 1
            job.last_served = end
            self._timeline.append((job.job_id, "inference", start - self._t0, end - self._t0))
            self._inference_latencies.append(end - request.arrival)
            if meter is not None and error is None:
                job.measure_left = max(0, job.measure_left - 1)
                self._account(job, None, meter.peak)
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(output)

    def _account(self, job: _Job, persistent: int | None, ephemeral: int | None) -> None:
        """Record a measurement; re-lane (or pause) a job that uses more than it reserved. Holds the lock."""
        reserved = self._allocator.request_of(job.job_id)
        if reserved is None:
            return
        measured = MemoryRequest(persistent if persistent is not None else 0, ephemeral or 0)
        job.measured = measured if job.measured is None else job.measured.union(measured)
        if reserved.covers(job.measured):
            return
        job.overruns += 1
        wanted = reserved.union(job.measured)
        ok, admitted = self._allocator.resize(job.job_id, wanted)
        if ok:
            job.lane = self._allocator.lane_of(job.job_id)
            job.request = wanted
            job.paused = ""
            self._admit(admitted)
        elif wanted.total > self.budget:
            job.cancel_requested = True
            job.kill_reason = (f"measured {wanted.persistent} B persistent + {wanted.ephemeral} B per iteration, more "
                         f"than the device budget {self.budget} B")
        else:
            job.paused = (f"measured {wanted.persistent} B persistent + {wanted.ephemeral} B per iteration; "
                          "waiting for memory")
            job.request = wanted  # retried whenever memory is released

    def _admit(self, admissions: list[Admission]) -> None:
        for admission in admissions:
            self._on_admitted(self._live[admission.job_id])

    def _retry_paused(self) -> None:
        for job in self._live.values():
            if job.paused and job.state is JobState.ADMITTED:
                ok, admitted = self._allocator.resize(job.job_id, job.request)
                if ok:
                    job.paused = ""
                    job.lane = self._allocator.lane_of(job.job_id)
                    self._admit(admitted)

    def _close(self, job: _Job, state: JobState, error: str | None = None, unit=None) -> None:
        """End an admitted job on the execution thread: close its session, free its lane."""
        try:
            job.session.close()
        except Exception:
            log.warning("closing %s failed:\n%s", job.job_id, traceback.format_exc())
        with self._cond:
            self._current = None
            if unit is not None:
                kind, start, end = unit
                self._busy += end - start
                self._timeline.append((job.job_id, kind, start - self._t0, end - self._t0))
            if job.kill_reason and state is JobState.CANCELLED:
                state, error = JobState.FAILED, job.kill_reason
            self._finalize(job, state, error)
            self._last_end = None  # closing is cleanup, not part of a switch

    def _finalize(self, job: _Job, state: JobState, error: str | None = None) -> None:
        """Record the end of a job and free its memory. Holds the lock."""
        was_admitted = job.state is JobState.ADMITTED
        job.state = state
        job.finished_at = time.perf_counter()
        if error is not None:
            job.error = error
        job.mid_iteration = False
        job.meter = None
        with contextlib.suppress(ValueError):
            self._to_start.remove(job)
        with contextlib.suppress(KeyError):
            admitted = self._allocator.release(job.job_id)
            if was_admitted:
                self._admitted_count -= 1
                if self._admitted_count == 0 and self._active_since is not None:
                    self._active_total += job.finished_at - self._active_since
                    self._active_since = None
            self._admit(admitted)
        self._retry_paused()
        while job.queue:
            job.queue.popleft().future.set_exception(ExecutorClosed(f"endpoint {job.job_id!r} is {state.value}"))
        try:
            job.result = job.session.result()
        except Exception:
            job.result = None
        stats = getattr(job.session, "migration_stats", None)
        if callable(stats):
            job.migration = stats()
        job.session = None  # the executor no longer keeps the job's tensors alive
        self._live.pop(job.job_id, None)
        self._remember_ended(job)
        job.done.set()
        self._cond.notify_all()

    def _remember_ended(self, job: _Job) -> None:
        self._finished.append(job.job_id)
        while len(self._finished) > self.retain_finished:
            self._jobs.pop(self._finished.popleft(), None)

    def _job_status(self, job: _Job) -> dict[str, Any]:
        def since(moment: float | None) -> float | None:
            return None if moment is None else moment - self._t0

        remaining = None
        if not job.state.terminal and job.session is not None:
            with contextlib.suppress(Exception):
                remaining = job.session.remaining_steps()
        position = None
        if job.state is JobState.WAITING:
            with contextlib.suppress(KeyError):
                position = self._allocator.admission_of(job.job_id).position
        return {
            "job_id": job.job_id,
            "kind": job.kind,
            "state": job.state.value,
            "lane": job.lane,
            "queue_position": position,
            "priority": job.priority,
            "weight": job.weight,
            "steps": job.steps,
            "remaining_steps": remaining,
            "step_time_s": job.step_time,
            "attained_s": job.attained,
            "submitted_s": since(job.submitted),
            "admitted_s": since(job.admitted_at),
            "finished_s": since(job.finished_at),
            "queued_s": (job.admitted_at - job.submitted) if job.admitted_at else None,
            "jct_s": (job.finished_at - job.submitted) if job.finished_at else None,
            "request": job.request.to_dict(),
            "measured": job.measured.to_dict() if job.measured else None,
            "overruns": job.overruns,
            "paused": job.paused or None,
            "mid_iteration": job.mid_iteration,
            "migrations": job.migrations,
            "migration": job.migration,
            "served": job.served if job.kind == "inference" else None,
            "error": job.error,
            "result": job.result,
        }
