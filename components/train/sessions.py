"""The ``train`` kind's session: a :class:`~components.train.loop.TrainLoop` one step at a time.

:class:`TrainLoopSession` runs a ``train`` attempt in both of a node's execution paths: driven to its end in the
attempt's child process, or hosted by a device's sharing service next to other jobs. Hosting tools (memory
profiling, stage preemption, serving between operators) belong to the host, which installs them
(:meth:`TrainLoopSession.install_hosting`); this plugin imports no other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from components.runtime.contract.component import Progress, Session, never

__all__ = ["TrainLoopSession"]


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

    Stage preemption, serving between operators and memory profiling are the host's tools
    (:meth:`install_hosting`; the GPU-sharing plugin installs its own): without them, steps run whole.

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

    # Hosting tools, installed by a device host that interleaves sessions (the GPU-sharing plugin installs its
    # own when its sessions module is imported; see install_hosting). Without them a session profiles nothing
    # (memory_estimate() answers the request given), runs whole steps and serves nothing between operators.
    profiler: ClassVar[Callable[[Callable[[], Any], dict[str, Any]], Any] | None] = None
    staged_step: ClassVar[Callable[[Any, Any], Any] | None] = None
    operator_preemption_mode: ClassVar[Callable[[Callable[[], bool], Callable[[], float]], Any] | None] = None

    @classmethod
    def install_hosting(cls, *, profiler: Callable[[Callable[[], Any], dict[str, Any]], Any],
                        staged_step: Callable[[Any, Any], Any],
                        operator_preemption: Callable[[Callable[[], bool], Callable[[], float]], Any]) -> None:
        """Install a host's tools: ``profiler(workload_factory, spec)`` measures the memory request on a
        throwaway copy; ``staged_step(workload, stages)`` is a resumable stage-by-stage ``train_step`` (a
        generator function for :meth:`TrainLoop.step_stages`) or None when the workload cannot be staged;
        ``operator_preemption(should_yield, serve)`` is a context manager serving requests between operators
        (its ``points`` counts the places it served)."""
        cls.profiler = staticmethod(profiler)
        cls.staged_step = staticmethod(staged_step)
        cls.operator_preemption_mode = staticmethod(operator_preemption)

    def __init__(self, loop: Any, memory_request: Any = None, *, host_io: bool = False,
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

    def memory_estimate(self) -> Any | None:
        """The request given, or one measured on a throwaway CPU copy of the workload (two steps, as Salus
        does) when a ``profile`` factory was given; None otherwise."""
        if self._request is None and self._profile is not None and self.profiler is not None:
            self._request = self.profiler(self._profile, self.loop.spec)
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
        if self.staged and self.staged_step is not None:
            self.train_step = self.staged_step(self.loop.workload, self.stages)

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
            preemption = self.operator_preemption_mode if self.operator_preemption else None
            serve = getattr(should_yield, "serve_pending", None) if preemption is not None else None
            try:
                while True:
                    if serve is None:
                        next(self._pending)  # runs up to the next stage boundary
                    else:
                        points = preemption(should_yield, serve)
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
