"""SwitchFlow on the shared device: training split into stages that yield to inference at stage boundaries.

A model is a sequence of stage modules -- what its workload's ``stages()`` gives
(:meth:`components.train.workloads.Workload.stages`; the workload owns its model's structure), the layers of
an ``nn.Sequential``, or else the whole model -- cut into ``k`` contiguous **stages** (the subgraphs).
:class:`StagedSession` runs one training iteration as a list of actions::

    forward 1 .. forward k, loss (+ zero_grad), backward k .. backward 1, optimizer step

and checks ``should_yield()`` before each action. When an inference request (or a higher-priority job)
arrives, the running iteration stops at the next boundary and :meth:`StagedSession.step` returns
``Progress.YIELDED``; the executor serves the request and calls ``step`` again to resume. So the device is
given up within one action: **preemption latency is bounded by the longest stage**, not by the iteration.

Resuming keeps the autograd state alive rather than recomputing: the activations saved for backward stay in
the job's lane (the lane allocator reserved them), so nothing is recomputed and no work is lost. Backward is
segmented at stage boundaries: stage ``i`` runs on a detached copy of stage ``i-1``'s output that requires
grad, and backward of stage ``i`` is ``torch.autograd.backward(output_i, grad_of_input_{i+1})``. This
computes the very same kernels on the same values as one whole-graph backward, so a staged job -- preempted
or not -- ends with parameters bit-identical to ``Workload.train_step`` (tested).

**Migration** (SwitchFlow's other half): with ``migrate_to=MigrationTarget(...)``, a session whose device is
busy with higher-priority work (``should_yield.contended()``, which the executor gives) runs its next actions
on a replica on another device instead of waiting, keeping the two copies in sync after each optimizer step
(:mod:`components.gpushare.migration`).

:class:`InferenceSession` is the serving side: a model in eval mode whose requests the executor runs between
any two stages of training (:meth:`DeviceExecutor.serve` / :meth:`DeviceExecutor.infer`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from components.gpushare.factories import workload_factory
from components.gpushare.lanes import MemoryRequest
from components.gpushare.migration import MigrationTarget, Replica, move_iteration, sync, to_device
from components.runtime.contract.component import Progress, Session, never


def partition(costs: Sequence[float], parts: int) -> list[int]:
    """Split ``costs`` into ``parts`` contiguous groups minimizing the largest group's sum.

    Returns the sizes of the groups (each >= 1). Exact dynamic programming: O(n^2 k), n is small (layers).
    """
    count = len(costs)
    if count == 0:
        raise ValueError("nothing to partition")
    parts = max(1, min(parts, count))
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + float(cost))
    inf = float("inf")
    # best[j][i]: the minimal largest sum splitting the first i items into j groups; cut[j][i]: last cut.
    best = [[inf] * (count + 1) for _ in range(parts + 1)]
    cut = [[0] * (count + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for j in range(1, parts + 1):
        for i in range(j, count + 1):
            for k in range(j - 1, i):
                value = max(best[j - 1][k], prefix[i] - prefix[k])
                if value < best[j][i]:
                    best[j][i], cut[j][i] = value, k
    sizes = []
    i = count
    for j in range(parts, 0, -1):
        k = cut[j][i]
        sizes.append(i - k)
        i = k
    return sizes[::-1]


def layer_costs(model: nn.Sequential, sample: Any = None, repeats: int = 3) -> list[float]:
    """A cost per layer: measured forward seconds on ``sample`` (no grad, eval mode, model untouched) or,
    without a sample, parameter count plus one."""
    layers = list(model)
    if sample is None:
        return [1.0 + sum(p.numel() for p in layer.parameters()) for layer in layers]
    training = model.training
    model.eval()
    costs = [0.0] * len(layers)
    try:
        with torch.no_grad():
            for _ in range(max(1, repeats)):
                x = sample
                for index, layer in enumerate(layers):
                    began = time.perf_counter()
                    x = layer(x)
                    costs[index] += time.perf_counter() - began
    finally:
        model.train(training)
    return costs


def split_sequential(model: nn.Sequential, stages: int | Sequence[int], sample: Any = None) -> list[nn.Module]:
    """Cut ``model`` into contiguous stages sharing its layers (no copies).

    ``stages`` is the number of stages (balanced by :func:`layer_costs`) or the explicit sizes (layers per
    stage).
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"only nn.Sequential models can be split into stages, got {type(model).__name__}")
    if isinstance(stages, int):
        sizes = partition(layer_costs(model, sample), stages)
    else:
        sizes = [int(size) for size in stages]
        if sum(sizes) != len(model) or min(sizes) < 1:
            raise ValueError(f"stage sizes {sizes} must be positive and add up to {len(model)} layers")
    result, first = [], 0
    for size in sizes:
        result.append(model[first : first + size])
        first += size
    return result


def as_sequential(model: nn.Module) -> nn.Sequential:
    """``model`` as an ``nn.Sequential`` of stage modules sharing its layers (not copies), computing its forward.

    A model whose class defines ``stages()`` (e.g. :meth:`components.train.workloads.TinyGPT.stages`: the
    embedding, each block's attention and feed-forward halves, the head) is split where it says; an
    ``nn.Sequential`` is itself; any other model is one stage.
    """
    method = getattr(type(model), "stages", None)
    if callable(method) and not isinstance(method, nn.Module):
        return nn.Sequential(*model.stages())
    if isinstance(model, nn.Sequential):
        return model
    return nn.Sequential(model)


def workload_stages(workload: Any) -> nn.Sequential:
    """A set-up workload's model as stage modules: what ``workload.stages()`` returns
    (:meth:`components.train.workloads.Workload.stages`), or :func:`as_sequential` of ``workload.model`` for an
    object that does not say."""
    method = getattr(workload, "stages", None)
    if callable(method):
        stages = list(method())
        if not stages or not all(isinstance(stage, nn.Module) for stage in stages):
            raise TypeError(f"{type(workload).__name__}.stages() must return a non-empty list of modules")
        return nn.Sequential(*stages)
    return as_sequential(workload.model)


def sequence_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of class logits ``(N, C)``, or of per-position logits ``(N, T, C)`` (language models)."""
    if logits.dim() > 2:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return F.cross_entropy(logits, targets)


class OperatorPreemption(TorchDispatchMode):
    """Preemption points between every two operators of a training action (forward, backward, optimizer).

    Before each aten operator it runs on this thread (the autograd engine runs CPU backward on the calling
    thread), it checks ``should_yield()``; when that is true it calls ``serve()``, which serves the queued
    inference requests right there and returns the seconds it took (``served_s`` sums them). The training
    operator then runs on the inputs it was given: nothing of the training job is read or written by the
    requests, so the iteration computes exactly what it would have computed uninterrupted (tested).
    """

    def __init__(self, should_yield: Callable[[], bool], serve: Callable[[], float]):
        super().__init__()
        self.should_yield = should_yield
        self.serve = serve
        self.served_s = 0.0
        self.points = 0  # how many times requests were served in place

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.should_yield():
            spent = self.serve()
            if spent > 0:
                self.served_s += spent
                self.points += 1
        return func(*args, **(kwargs or {}))


class StagedSession(Session):
    """Stage-preemptible training: one iteration as yieldable actions (see the module docstring).

    Give ``stages`` (modules applied in order), ``optimizer``, ``batch(step) -> (inputs, targets)``,
    ``loss(outputs, targets)`` and ``steps``; or subclass and set them in :meth:`start` (as
    :class:`StagedWorkloadSession` does). ``action_durations`` keeps the last duration of each action
    (``"forward 0"``, ..., ``"loss"``, ``"backward 0"``, ``"step"``) and ``longest_action_s`` the longest
    seen: the bound of the preemption latency.

    **Operator-level preemption.** When ``should_yield`` carries a ``serve_pending()`` callable (the
    :class:`~components.gpushare.executor.DeviceExecutor` gives one) and ``operator_preemption`` is true
    (the default), queued inference requests are also served *inside* an action, between two of its
    operators (:class:`OperatorPreemption`), so a request waits for one operator rather than one stage; at a
    stage boundary the session serves them in place too, and still returns ``Progress.YIELDED`` for any
    other reason to yield (a higher-priority job, a cancellation). ``action_durations`` exclude the time
    spent serving in place; ``inline_points`` counts the places where requests were served.
    """

    def __init__(
        self,
        stages: Sequence[nn.Module] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        batch: Callable[[int], tuple[Any, Any]] | None = None,
        loss: Callable[[Any, Any], torch.Tensor] = F.cross_entropy,
        steps: int | None = None,
        *,
        modules_to_train: Sequence[nn.Module] = (),
        operator_preemption: bool = True,
        migrate_to: MigrationTarget | None = None,
    ):
        self.operator_preemption = operator_preemption
        self.migration = migrate_to
        self._primary: Replica | None = None
        self._fallback: Replica | None = None
        self._on: Replica | None = None  # where the iteration in flight runs (None: no migration configured)
        self._worker: threading.Thread | None = None
        self._parked = threading.Event()
        self._stop_away = threading.Event()
        self._away_error: BaseException | None = None
        self._done_away = False
        self.migrations = 0  # moves to the fallback device
        self.returns = 0  # moves back
        self.steps_away = 0  # optimizer steps taken on the fallback device
        self.sync_bytes = 0
        self.sync_s = 0.0
        self.inline_points = 0
        self.stages = list(stages) if stages is not None else []
        self.optimizer = optimizer
        self.batch_fn = batch
        self.loss_fn = loss
        self.total_steps = steps
        self.modules_to_train = list(modules_to_train) or list(self.stages)
        self.step_count = 0
        self.yields = 0
        self.action_durations: dict[str, float] = {}
        self.longest_action_s = 0.0
        self._plan: list[tuple[str, int]] = []
        self._position = 0
        self._reset_iteration()

    def _reset_iteration(self) -> None:
        self._position = 0
        self._targets = None
        self._inputs: list[Any] = []
        self._outputs: list[Any] = []
        self._loss = None

    def _build_plan(self) -> None:
        count = len(self.stages)
        self._plan = ([("forward", i) for i in range(count)] + [("loss", -1)]
                      + [("backward", i) for i in reversed(range(count))] + [("step", -1)])

    def start(self, device) -> None:
        if not self.stages:
            raise ValueError("a StagedSession needs stages")
        self._build_plan()
        if self.migration is not None:
            if self.optimizer is None:
                raise ValueError("a migrating StagedSession needs its optimizer at start")
            self._primary = Replica(device, self.stages, self.optimizer)
            self._fallback = self._primary.replicate(self.migration)
            self._on = self._primary

    @property
    def mid_iteration(self) -> bool:
        return self._position > 0

    @property
    def away(self) -> bool:
        """True while the job runs (or is parked) on its fallback device."""
        return self._worker is not None

    def ready(self) -> bool:
        return self._worker is None or self._parked.is_set()

    def step(self, should_yield: Callable[[], bool] = never) -> Progress:
        if not self._plan:
            self._build_plan()
        if self._worker is not None:
            if self._come_back():
                return Progress.DONE
        serve = getattr(should_yield, "serve_pending", None) if self.operator_preemption else None
        contended = getattr(should_yield, "contended", None) if self.migration is not None else None
        while self._position < len(self._plan):
            if should_yield() and serve is not None and serve() > 0:
                self.inline_points += 1
            if contended is not None and contended():
                self._leave(contended)
                self.yields += 1
                return Progress.YIELDED
            if should_yield():
                self.yields += 1
                return Progress.YIELDED
            action, index = self._plan[self._position]
            began = time.perf_counter()
            if serve is None:
                self._run(action, index)
                served = 0.0
            else:
                points = OperatorPreemption(should_yield, serve)
                with points:
                    self._run(action, index)
                served, self.inline_points = points.served_s, self.inline_points + points.points
            duration = time.perf_counter() - began - served
            self.action_durations[f"{action} {index}" if index >= 0 else action] = duration
            self.longest_action_s = max(self.longest_action_s, duration)
            self._position += 1
        return self._end_iteration()

    def _end_iteration(self) -> Progress:
        self._reset_iteration()
        self.step_count += 1
        if self.total_steps is not None and self.step_count >= self.total_steps:
            return Progress.DONE
        return Progress.ITERATION

    # -- migration (components.gpushare.migration) ---------------------------------------------------------
    def _leave(self, contended: Callable[[], bool]) -> None:
        """Hand the rest of the work to a thread running it on the fallback device (the move itself, which
        may recompute forwards, runs there too, so the primary device is free at once)."""
        self._parked.clear()
        self._stop_away.clear()
        self._away_error = None
        self._done_away = False
        self._worker = threading.Thread(target=self._away, args=(contended,), daemon=True,
                                        name=f"migrated-{self.migration.name}")
        self._worker.start()

    def _away(self, contended: Callable[[], bool]) -> None:
        assert self.migration is not None and self._primary is not None and self._fallback is not None
        try:
            with self.migration.work():
                move_iteration(self, self._primary, self._fallback, len(self.stages))
                self._on = self._fallback
            self.migrations += 1
            while not self._stop_away.is_set():
                with self.migration.work():
                    action, index = self._plan[self._position]
                    self._run(action, index)
                    self._position += 1
                    if self._position == len(self._plan):
                        self.steps_away += 1
                        if self._end_iteration() is Progress.DONE:
                            self._done_away = True
                            return
                if not contended():  # the primary device is free again: park at this boundary
                    return
        except BaseException as error:  # reported by the next step()
            self._away_error = error
        finally:
            self._parked.set()
            self._wakeup()

    def _come_back(self) -> bool:
        """Join the parked worker and move the iteration in flight back to the primary device (on the
        executor's thread and context). True when the job finished while away."""
        assert self._worker is not None and self._primary is not None and self._fallback is not None
        self._worker.join()
        self._worker = None
        if self._away_error is not None:
            error, self._away_error = self._away_error, None
            raise error
        if self._done_away:
            return True
        move_iteration(self, self._fallback, self._primary, len(self.stages))
        self._on = self._primary
        self.returns += 1
        return False

    def _other(self, replica: Replica) -> Replica:
        assert self._primary is not None and self._fallback is not None
        return self._fallback if replica is self._primary else self._primary

    def _run(self, action: str, index: int) -> None:
        on = self._on
        stages = self.stages if on is None else on.stages
        optimizer = self.optimizer if on is None else on.optimizer
        if action == "forward":
            if index == 0:
                if on is None or on is self._primary:
                    for module in self.modules_to_train:
                        module.train()
                else:
                    on.train_mode()
                x, self._targets = self.batch_fn(self.step_count)
                if on is not None and on is not self._primary:
                    x, self._targets = to_device(x, on.device), to_device(self._targets, on.device)
            else:
                # Cut the graph here so backward can stop at this boundary too.
                x = self._outputs[index - 1].detach().requires_grad_(True)
            self._inputs.append(x)
            self._outputs.append(stages[index](x))
        elif action == "loss":
            self._loss = self.loss_fn(self._outputs[-1], self._targets)
            optimizer.zero_grad(set_to_none=True)
        elif action == "backward":
            if index == len(self.stages) - 1:
                self._loss.backward()
                self._loss = None
            else:
                output, downstream = self._outputs[index], self._inputs[index + 1]
                if output.requires_grad and downstream.grad is not None:
                    torch.autograd.backward(output, grad_tensors=downstream.grad)
            # This stage's activations are no longer needed.
            if index + 1 < len(self._inputs):
                self._inputs[index + 1] = None
            self._outputs[index] = None
        elif action == "step":
            optimizer.step()
            if on is not None:  # keep the other copy in sync after every optimizer step
                began = time.perf_counter()
                self.sync_bytes += sync(on, self._other(on))
                self.sync_s += time.perf_counter() - began

    def migration_stats(self) -> dict[str, Any]:
        return {"target": self.migration.name if self.migration else None, "migrations": self.migrations,
                "returns": self.returns, "steps_away": self.steps_away, "sync_bytes": self.sync_bytes,
                "sync_s": self.sync_s}

    def remaining_steps(self) -> int | None:
        return None if self.total_steps is None else max(self.total_steps - self.step_count, 0)

    def resident(self) -> tuple[Any, ...]:
        return (*self.stages, self.optimizer)

    def close(self) -> None:
        if self._worker is not None:
            self._stop_away.set()
            self._worker.join()
            self._worker = None
        self._reset_iteration()


class StagedWorkloadSession(StagedSession):
    """A stage-preemptible run of a :class:`~components.train.workloads.Workload`, split into the stages its
    :meth:`~components.train.workloads.Workload.stages` gives (see :func:`workload_stages`).

    Same batches, same loss (cross-entropy), same order of ``zero_grad`` / ``backward`` / ``step`` as
    ``Workload.train_step``: the parameters after ``n`` steps are bit-identical to ``n`` plain steps.
    ``stages`` is a count (balanced by measured layer time on the first batch) or explicit sizes.
    """

    def __init__(self, workload: Any, spec: dict[str, Any], stages: int | Sequence[int] = 3,
                 *, steps: int | None = None, operator_preemption: bool = True,
                 migrate_to: MigrationTarget | None = None):
        super().__init__(steps=steps, operator_preemption=operator_preemption, migrate_to=migrate_to)
        self.workload, self._factory = workload_factory(workload)
        self.spec = spec
        self.stage_spec = stages
        self.steps_per_epoch: int | None = None

    @classmethod
    def builtin(cls, name: str, stages: int | Sequence[int] = 3, steps: int | None = None,
                migrate_to: MigrationTarget | None = None, **spec: Any) -> StagedWorkloadSession:
        from components.train.spec import TrainSpec
        from components.train.workloads import builtin_workload

        normalized = TrainSpec().validate({"workload": name, **spec})
        return cls(lambda: builtin_workload(name), normalized, stages, steps=steps, migrate_to=migrate_to)

    def memory_estimate(self) -> MemoryRequest:
        from components.gpushare.memory import profile_workload

        return profile_workload(self._factory, self.spec)

    def start(self, device) -> None:
        if self.workload is None:
            self.workload = self._factory()
        workload = self.workload
        workload.setup(self.spec, device)
        model = workload.model
        layers = workload_stages(workload)
        self.steps_per_epoch = int(workload.steps_per_epoch())
        total = self.spec["epochs"] * self.steps_per_epoch
        if self.spec.get("max_steps"):
            total = min(total, self.spec["max_steps"])
        if self.total_steps is None:
            self.total_steps = total
        sample = workload.batch(0, 0)[0] if isinstance(self.stage_spec, int) else None
        self.stages = split_sequential(layers, self.stage_spec, sample)
        self.modules_to_train = [model]
        self.optimizer = workload.optimizer
        self.batch_fn = self._batch
        self.loss_fn = sequence_cross_entropy
        super().start(device)

    def _batch(self, step: int):
        epoch, index = divmod(step, self.steps_per_epoch)
        return self.workload.batch(epoch, index)

    def resident(self) -> tuple[Any, ...]:
        return (self.workload,) if self.workload is not None else ()


class StagedTrainStep:
    """The ``train_step`` of a built-in workload as a resumable generator that yields at stage boundaries.

    ``step = StagedTrainStep(workload)`` (after ``workload.setup``); ``metrics = yield from step(batch)``
    runs forward 1..k, loss (+ ``zero_grad``), backward k..1 and the optimizer step -- the actions of
    :class:`StagedSession` -- yielding the next action's name between two actions (never after the optimizer
    step: while the generator is suspended the parameters and optimizer state are those before the step).
    It returns what ``workload.train_step(batch)`` returns (``loss``, ``accuracy``, ``samples``), and the
    parameters, optimizer state and metrics are bit-identical to it, however often it was suspended.

    Only for workloads whose ``train_step`` is the built-in one (cross-entropy on the model that
    :func:`workload_stages` splits): see :meth:`supports`. ``stages``: a count (balanced by parameter
    count) or explicit sizes; default one stage per layer (finest boundaries).
    """

    def __init__(self, workload: Any, stages: int | Sequence[int] | None = None):
        if not self.supports(workload):
            raise TypeError(f"cannot stage the train_step of {type(workload).__name__}")
        self.workload = workload
        layers = workload_stages(workload)
        self.stages = split_sequential(layers, stages if stages is not None else [1] * len(layers))
        count = len(self.stages)
        self.plan = ([("forward", i) for i in range(count)] + [("loss", -1)]
                     + [("backward", i) for i in reversed(range(count))] + [("step", -1)])
        self.action_durations: dict[str, float] = {}
        self.longest_action_s = 0.0

    @staticmethod
    def supports(workload: Any) -> bool:
        """True for a set-up workload whose ``train_step`` is the built-in classification or TinyGPT one
        (not overridden) and whose stages :func:`workload_stages` gives."""
        from components.train.workloads import ClassificationWorkload, TinyGPTWorkload

        train_step = getattr(type(workload), "train_step", None)
        if train_step not in (ClassificationWorkload.train_step, TinyGPTWorkload.train_step):
            return False
        model = getattr(workload, "model", None)
        if not isinstance(model, nn.Module) or getattr(workload, "optimizer", None) is None:
            return False
        try:
            workload_stages(workload)
        except TypeError:
            return False
        return True

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> Generator[str, None, dict[str, Any]]:
        inputs_, targets = batch
        optimizer = self.workload.optimizer
        stages, last = self.stages, len(self.stages) - 1
        inputs: list[Any] = []
        outputs: list[Any] = []
        loss = logits = None
        for position, (action, index) in enumerate(self.plan):
            name = f"{action} {index}" if index >= 0 else action
            if position:
                yield name
            began = time.perf_counter()
            if action == "forward":
                if index == 0:
                    self.workload.model.train()
                    x = inputs_
                else:
                    # Cut the graph here so backward can stop at this boundary too.
                    x = outputs[index - 1].detach().requires_grad_(True)
                inputs.append(x)
                outputs.append(stages[index](x))
            elif action == "loss":
                logits = outputs[-1]
                loss = sequence_cross_entropy(logits, targets)
                optimizer.zero_grad(set_to_none=True)
            elif action == "backward":
                if index == last:
                    loss.backward()
                else:
                    output, downstream = outputs[index], inputs[index + 1]
                    if output.requires_grad and downstream.grad is not None:
                        torch.autograd.backward(output, grad_tensors=downstream.grad)
                if index + 1 < len(inputs):
                    inputs[index + 1] = None  # this stage's activations are no longer needed
                outputs[index] = None
            else:
                optimizer.step()
            duration = time.perf_counter() - began
            self.action_durations[name] = duration
            self.longest_action_s = max(self.longest_action_s, duration)
        accuracy = (logits.detach().argmax(dim=-1) == targets).float().mean()
        return {"loss": loss.detach(), "accuracy": accuracy, "samples": len(targets)}


class InferenceSession(Session):
    """A model serving requests on the shared device: ``run(inputs)`` is one forward pass in inference mode.

    ``model`` is an ``nn.Module`` (moved to the device at start) or a factory returning one; ``sample`` an
    example input for :meth:`memory_estimate` (profiled on a CPU copy); ``postprocess`` maps the output
    (e.g. ``argmax``) before it is returned. Inputs are moved to the device.
    """

    kind = "inference"

    def __init__(self, model: nn.Module | Callable[[], nn.Module], *, sample: Any = None,
                 postprocess: Callable[[Any], Any] | None = None):
        self._model = model
        self.model: nn.Module | None = model if isinstance(model, nn.Module) else None
        self.sample = sample
        self.postprocess = postprocess
        self.device = torch.device("cpu")

    def memory_estimate(self) -> MemoryRequest | None:
        if self.sample is None:
            return None
        from components.gpushare.memory import profile_module

        model = self.model if self.model is not None else self._model()
        return profile_module(model, self.sample)

    def start(self, device) -> None:
        self.device = torch.device(device)
        if self.model is None:
            self.model = self._model()
        self.model = self.model.to(self.device).eval()

    def run(self, inputs: Any) -> Any:
        if isinstance(inputs, torch.Tensor):
            inputs = inputs.to(self.device, non_blocking=True)
        with torch.inference_mode():
            output = self.model(inputs)
        return self.postprocess(output) if self.postprocess is not None else output

    def step(self, should_yield=never) -> Progress:
        raise RuntimeError("an InferenceSession serves requests through DeviceExecutor.infer(); it has no step()")

    def resident(self) -> tuple[Any, ...]:
        return (self.model,) if self.model is not None else ()
