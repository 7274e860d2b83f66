"""Sessions: jobs as step functions the shared-device executor can interleave.

A :class:`Session` (the node's session contract, :class:`components.runtime.contract.component.Session`, re-exported
here) advances one iteration per :meth:`~Session.step` call and keeps all of its state --
model, optimizer state, data position, random generators -- in itself, resident on the device. Switching
between sessions at an iteration boundary therefore copies nothing: the executor simply calls another
session's ``step``.

Adapters:

- :class:`WorkloadSession` drives a :class:`~components.train.workloads.Workload` directly (the built-in
  ``mlp-digits``, ``cnn-synthetic``, ``tiny-gpt`` or user code); it can profile its memory request on a CPU
  copy before admission.
- :class:`~components.train.sessions.TrainLoopSession` (the ``train`` plugin's, re-exported here) drives a
  :class:`~components.train.loop.TrainLoop` (metrics, checkpoints and artifacts through the job's Context),
  for running real ``train`` attempts on a shared device. Importing this module installs the shared device's
  tools into it (:func:`install_hosting`): memory profiling, stage preemption, serving between operators.
- :class:`StepObjectSession` / :class:`CallableSession`: any object with ``step()`` (truthy when done), or a
  plain function.
- :mod:`components.gpushare.stages` adds stage-preemptible training and inference sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.gpushare.factories import workload_factory
from components.gpushare.lanes import MemoryRequest
from components.runtime.contract.component import Progress, Session, never
from components.train.sessions import TrainLoopSession

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


def _profile(factory: Callable[[], Any], spec: dict[str, Any]) -> MemoryRequest:
    from components.gpushare.memory import profile_workload

    return profile_workload(factory, spec)


def _staged_step(workload: Any, stages: Any) -> Any:
    from components.gpushare.stages import StagedTrainStep

    return StagedTrainStep(workload, stages) if StagedTrainStep.supports(workload) else None


def _operator_preemption(should_yield: Callable[[], bool], serve: Callable[[], float]) -> Any:
    from components.gpushare.stages import OperatorPreemption

    return OperatorPreemption(should_yield, serve)


def install_hosting() -> None:
    """Give :class:`~components.train.sessions.TrainLoopSession` this plugin's hosting tools (done on import:
    the device service and the executor import this module before they build or step a session)."""
    TrainLoopSession.install_hosting(profiler=_profile, staged_step=_staged_step,
                                     operator_preemption=_operator_preemption)


install_hosting()
