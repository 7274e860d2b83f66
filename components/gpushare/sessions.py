"""Sessions: jobs as step functions the shared-device executor can interleave.

A :class:`Session` (the node's session contract, :class:`components.runtime.component.Session`, re-exported
here) advances one iteration per :meth:`~Session.step` call and keeps all of its state --
model, optimizer state, data position, random generators -- in itself, resident on the device. Switching
between sessions at an iteration boundary therefore copies nothing: the executor simply calls another
session's ``step``.

Adapters:

- :class:`WorkloadSession` drives a :class:`~components.train.workloads.Workload` directly (the built-in
  ``mlp-digits``, ``cnn-synthetic``, ``tiny-gpt`` or user code); it can profile its memory request on a CPU
  copy before admission.
- :class:`TrainLoopSession` drives a :class:`~components.train.loop.TrainLoop` (metrics, checkpoints and
  artifacts through the job's Context), for running real ``train`` attempts on a shared device.
- :class:`StepObjectSession` / :class:`CallableSession`: any object with ``step()`` (truthy when done), or a
  plain function.
- :mod:`components.gpushare.stages` adds stage-preemptible training and inference sessions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from components.gpushare.lanes import MemoryRequest
from components.runtime.component import Progress, Session, never

__all__ = ["CallableSession", "Progress", "Session", "StepObjectSession", "TrainLoopSession", "WorkloadSession",
           "as_session", "never", "workload_factory"]


class CallableSession(Session):
    """``fn()`` is one iteration; the job is done after ``steps`` calls, or when ``fn`` returns True."""

    def __init__(self, fn: Callable[[], Any], steps: int | None = None):
        self.fn = fn
        self.steps = steps
        self.done_steps = 0

    def step(self, should_yield=never) -> Progress:
        finished = bool(self.fn())
        self.done_steps += 1
        if finished or (self.steps is not None and self.done_steps >= self.steps):
            return Progress.DONE
        return Progress.ITERATION

    def remaining_steps(self) -> int | None:
        return None if self.steps is None else max(self.steps - self.done_steps, 0)


class StepObjectSession(Session):
    """Any object with ``step()`` returning truthy when done; optional ``start(device)``, ``close()``,
    ``remaining_steps()`` / ``remaining_steps`` and ``memory_estimate()`` are used when present."""

    def __init__(self, obj: Any):
        self.obj = obj

    def memory_estimate(self) -> MemoryRequest | None:
        estimate = getattr(self.obj, "memory_estimate", None)
        return estimate() if callable(estimate) else None

    def start(self, device) -> None:
        start = getattr(self.obj, "start", None)
        if callable(start):
            start(device)

    def step(self, should_yield=never) -> Progress:
        return Progress.DONE if self.obj.step() else Progress.ITERATION

    def remaining_steps(self) -> int | None:
        remaining = getattr(self.obj, "remaining_steps", None)
        remaining = remaining() if callable(remaining) else remaining
        return None if remaining is None else int(remaining)

    def resident(self) -> tuple[Any, ...]:
        return (self.obj,)

    def close(self) -> None:
        close = getattr(self.obj, "close", None)
        if callable(close):
            close()


class WorkloadSession(Session):
    """Drives a :class:`~components.train.workloads.Workload`: ``train_step(batch(epoch, index))`` per step.

    ``workload`` is a Workload not yet set up, or a factory returning one. ``spec`` is the normalized
    ``train`` spec (``TrainSpec().validate(...)``). The job runs ``steps`` steps, or ``spec["max_steps"]``,
    or ``spec["epochs"]`` epochs. Step ``n`` uses batch ``n % steps_per_epoch`` of epoch
    ``n // steps_per_epoch``, exactly as :class:`~components.train.loop.TrainLoop` does, so a job run here
    ends with the parameters it would have alone.
    """

    def __init__(self, workload: Any, spec: dict[str, Any], *, steps: int | None = None, profile_steps: int = 2):
        self.workload, self._factory = workload_factory(workload)
        self.spec = spec
        self.steps = steps
        self.profile_steps = profile_steps
        self.step_count = 0
        self.total_steps: int | None = steps if steps is not None else spec.get("max_steps")
        self.steps_per_epoch: int | None = None
        self.last_metrics: dict[str, Any] = {}

    @classmethod
    def builtin(cls, name: str, steps: int | None = None, **spec: Any) -> WorkloadSession:
        """A session of a built-in workload (``mlp-digits``, ``cnn-synthetic``, ``tiny-gpt``)."""
        from components.train.spec import TrainSpec
        from components.train.workloads import builtin_workload

        normalized = TrainSpec().validate({"workload": name, **spec})
        return cls(lambda: builtin_workload(name), normalized, steps=steps)

    def memory_estimate(self) -> MemoryRequest:
        from components.gpushare.memory import profile_workload

        return profile_workload(self._factory, self.spec, steps=self.profile_steps)

    def start(self, device) -> None:
        if self.workload is None:
            self.workload = self._factory()
        self.workload.setup(self.spec, device)
        self.steps_per_epoch = int(self.workload.steps_per_epoch())
        if self.steps_per_epoch < 1:
            raise ValueError("the workload has no steps per epoch")
        total = self.spec["epochs"] * self.steps_per_epoch
        if self.spec.get("max_steps"):
            total = min(total, self.spec["max_steps"])
        self.total_steps = self.steps if self.steps is not None else total

    def step(self, should_yield=never) -> Progress:
        epoch, index = divmod(self.step_count, self.steps_per_epoch)
        self.last_metrics = self.workload.train_step(self.workload.batch(epoch, index))
        self.step_count += 1
        return Progress.DONE if self.step_count >= self.total_steps else Progress.ITERATION

    def remaining_steps(self) -> int | None:
        return None if self.total_steps is None else max(self.total_steps - self.step_count, 0)

    def resident(self) -> tuple[Any, ...]:
        return (self.workload,) if self.workload is not None else ()

    def result(self) -> dict[str, Any]:
        metrics = {name: float(value) for name, value in self.last_metrics.items()}
        return {"steps": self.step_count, "metrics": metrics}

    def close(self) -> None:
        # Keep the (set-up) workload so the caller can read its final state; drop the batch metrics.
        self.last_metrics = {name: float(value) for name, value in self.last_metrics.items()}


class TrainLoopSession(Session):
    """Drives a :class:`~components.train.loop.TrainLoop` one step at a time.

    ``start`` runs ``loop.start()`` (setup, resume from the job's checkpoint); the last step runs
    ``loop.finish()`` (final evaluation, ``model.pt`` and ``metrics.json``). When the loop's context asks to
    stop (cancel or preemption through the control plane), the loop checkpoints and the session ends.
    Build the loop with ``owns_process=False``: the executor runs several jobs in one process.

    ``host_io=True`` keeps network and disk work off the execution thread: checkpoints and the final
    ``model.pt``/``metrics.json`` are CPU snapshots taken in ``step`` and stored by the loop's
    :class:`~components.train.loop.HostIO` thread. The job's executor state then ends before its files are
    stored: call :meth:`wait_host_io` (off the execution thread) before treating the job as finished. Call
    ``loop.prefetch()`` before submitting the session so that ``start`` does not download the checkpoint.

    **Stage preemption** (``staged=True``, the default): for a workload whose ``train_step`` is a built-in
    one (``mlp-digits``, ``cnn-synthetic``, ``tiny-gpt``, see
    :meth:`~components.gpushare.stages.StagedTrainStep.supports`), each step runs as
    :meth:`TrainLoop.step_stages` backed by :class:`~components.gpushare.stages.StagedTrainStep` (``stages``:
    its stage count or sizes, default one per layer). When the executor asks it to yield (an inference
    request, a higher-priority job, a cancel), the step stops at the next stage boundary and
    ``step`` returns ``Progress.YIELDED``; the next ``step`` call resumes it. Results are bit-identical to
    unpreempted ``TrainLoop.step`` calls. Other workloads (entrypoints) run whole steps.

    **Serving between operators** (``operator_preemption=True``, the default; as in
    :class:`~components.gpushare.stages.StagedSession`): while an inference endpoint is live on the executor,
    requests that arrive during a stage (or a whole step) are served before its next operator, on this thread,
    so a request waits about one operator instead of one stage. Training state is not touched by them.
    """

    def __init__(self, loop: Any, memory_request: MemoryRequest | None = None, *, host_io: bool = False,
                 staged: bool = True, stages: Any = None, operator_preemption: bool = True,
                 profile: Callable[[], Any] | None = None):
        self.loop = loop
        self._request = memory_request
        self._profile = profile  # a factory of fresh workloads: memory_estimate() profiles one on the CPU
        self.summary: dict[str, Any] | None = None
        self.stopped = False
        self.staged = staged
        self.stages = stages
        self.operator_preemption = operator_preemption
        self.inline_points = 0  # places where inference requests were served inside this job's steps
        self.train_step: Any = None  # the StagedTrainStep, once started (None: whole steps)
        self._pending: Any = None  # the suspended TrainLoop.step_stages() generator
        self.yields = 0
        if host_io:
            loop.use_host_io()

    def wait_host_io(self, timeout: float | None = None) -> None:
        """Wait until the job's checkpoints and artifacts are stored; raises the first upload error."""
        self.loop.wait_host_io(timeout)

    def memory_estimate(self) -> MemoryRequest | None:
        """The request given, or one measured on a throwaway CPU copy of the workload (two steps, as Salus
        does) when a ``profile`` factory was given; None otherwise."""
        if self._request is None and self._profile is not None:
            from components.gpushare.memory import profile_workload

            self._request = profile_workload(self._profile, self.loop.spec)
        return self._request

    def prepare(self) -> None:
        """Download the job's checkpoint now, so that :meth:`start` (on the device thread) does no I/O."""
        if not self.loop.started:
            self.loop.prefetch()

    def stopped_on_request(self) -> bool:
        return self.stopped

    def settle(self, timeout: float | None = None) -> None:
        self.wait_host_io(timeout)

    def start(self, device) -> None:
        if not self.loop.started:
            self.loop.start()
        if self.staged:
            from components.gpushare.stages import StagedTrainStep

            if StagedTrainStep.supports(self.loop.workload):
                self.train_step = StagedTrainStep(self.loop.workload, self.stages)

    @property
    def mid_iteration(self) -> bool:
        return self._pending is not None

    def step(self, should_yield=never) -> Progress:
        if self._pending is None:
            if self.loop.stop_requested():
                self.loop.checkpoint()
                self.stopped = True
                self.loop.stopped_together = True  # a gang's ranks all agreed to stop at this step
                self.loop.ctx.log(f"stopping {self.loop.name} at step {self.loop.step_count}/"
                                  f"{self.loop.total_steps}: checkpoint saved")
                return Progress.DONE
            if not self.loop.done:
                self._pending = self.loop.step_stages(self.train_step)
        if self._pending is not None:
            serve = getattr(should_yield, "serve_pending", None) if self.operator_preemption else None
            try:
                while True:
                    if serve is None:
                        next(self._pending)  # runs up to the next stage boundary
                    else:
                        from components.gpushare.stages import OperatorPreemption

                        points = OperatorPreemption(should_yield, serve)
                        try:
                            with points:
                                next(self._pending)
                        finally:
                            self.inline_points += points.points
                    if should_yield() and serve is not None and serve() > 0:
                        self.inline_points += 1  # requests served at the boundary, in place
                    if should_yield():
                        self.yields += 1
                        return Progress.YIELDED
            except StopIteration:
                self._pending = None
        if self.loop.done:
            self.summary = self.loop.finish()
            return Progress.DONE
        return Progress.ITERATION

    def remaining_steps(self) -> int | None:
        if not self.loop.started:
            return self.loop.spec.get("max_steps")
        return max(self.loop.total_steps - self.loop.step_count, 0)

    def resident(self) -> tuple[Any, ...]:
        return (self.loop.workload,)

    def close(self) -> None:
        if self._pending is not None:  # cancelled mid-step: drop the step's activations
            self._pending.close()
            self._pending = None
        self.loop.close()

    def result(self) -> dict[str, Any] | None:
        return self.summary if not self.stopped else {"stopped_at_step": self.loop.step_count}


def as_session(obj: Any, **options: Any) -> Session:
    """Wrap ``obj`` in the matching session: a Session as is, a TrainLoop, a Workload (give ``spec=``), an
    object with ``step()``, or a plain callable (one call per iteration)."""
    if isinstance(obj, Session):
        return obj
    from components.train.loop import TrainLoop
    from components.train.workloads import Workload

    if isinstance(obj, TrainLoop):
        return TrainLoopSession(obj, **options)
    if isinstance(obj, Workload):
        if "spec" not in options:
            raise ValueError("a Workload needs its normalized spec: as_session(workload, spec=...)")
        return WorkloadSession(obj, **options)
    if callable(getattr(obj, "step", None)):
        return StepObjectSession(obj)
    if callable(obj):
        return CallableSession(obj, **options)
    raise TypeError(f"cannot run {type(obj).__name__} as a session: it has no step()")


def workload_factory(workload: Any) -> tuple[Any, Callable[[], Any]]:
    """``(workload or None, factory of fresh copies)`` for a Workload instance, class or factory.

    A Workload is cheap before ``setup()``: a deep copy of it is a fresh, independent job (used to profile
    memory on a throwaway copy without touching the job's own state)."""
    if isinstance(workload, type) or (callable(workload) and not hasattr(workload, "train_step")):
        return None, workload
    pristine = copy.deepcopy(workload)
    return workload, lambda: copy.deepcopy(pristine)
