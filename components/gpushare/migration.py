"""SwitchFlow's migration: a preempted training job runs its next stages on another device.

When the device is busy with higher-priority work (a higher-priority job, or an inference endpoint serving
requests), a :class:`~components.gpushare.stages.StagedSession` built with ``migrate_to=MigrationTarget(...)``
does not wait: at the next action boundary it hands the rest of its work to a thread of its own that runs the
actions -- forward, loss, backward, optimizer step, then the next iterations -- on a **replica** of its stages
and optimizer on the fallback device (the CPU, or a second GPU), while the executor gives the primary device to
the higher-priority work. When the primary device is free again, the job comes back at the next action
boundary and goes on there.

Exactness (tested):

- **The replica is kept in sync after each optimizer step**: the device that ran the step copies the
  parameters, buffers and optimizer state (and the param groups' hyperparameters, so a learning-rate schedule
  carries over) into the other copy. So after every step both copies hold the same values.
- **Moving mid-iteration recomputes, it never approximates.** The autograd graph of a stage lives on the device
  that ran its forward. A move at action boundary ``p`` therefore (see :func:`move_iteration`):
  recomputes on the new device the forward of every stage whose forward ran but whose backward has not, from
  that stage's recorded input (so the values are the same); moves the gradient of the boundary activation and
  the parameters' accumulated gradients; recomputes the loss if its backward has not run; and takes the
  buffers (BatchNorm statistics) from the old device, so a recomputed forward does not count twice. Forward
  work of at most one iteration is repeated; nothing else is.
- On two CPU "devices" the kernels are the same, so a migrated run ends **bit-identical** to one that never
  moved. Between a GPU and the CPU the kernels differ: the copies agree after every step (the sync copies
  them), and the run agrees with an unmigrated one within float tolerance.

It works for any :class:`~components.gpushare.stages.StagedSession` (stages, an optimizer, a batch function
and a loss) and so for any workload that :class:`~components.gpushare.stages.StagedWorkloadSession` runs, a
user's own :class:`~components.train.workloads.Workload` included: it needs the Workload API's ``model`` /
``optimizer`` / ``stages()`` and a pure ``batch(epoch, index)``, and a forward without randomness of its own
(dropout would draw different masks when recomputed). A ``train_step`` with more than forward, loss,
backward and one optimizer step (gradient clipping, several losses) is not split into actions, so it is not
migrated.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class MigrationTarget:
    """A device a preempted job may move to. ``device``: where the replica lives (``"cpu"`` or
    ``"cuda:1"``). ``context``: a callable returning a context manager entered around every action run there
    (the benchmark's kernel-stream model of a second virtual device). ``lock`` makes jobs that share the
    target run one action at a time on it, as on one device. ``name`` labels it in counters."""

    device: Any = "cpu"
    context: Callable[[], Any] | None = None
    name: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.name is None:
            self.name = str(self.device)

    @contextlib.contextmanager
    def work(self):
        with self.lock, (self.context() if self.context is not None else contextlib.nullcontext()):
            yield
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` (a tensor, or a tuple / list / dict of them) on ``device``; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(to_device(item, device) for item in value)
    if isinstance(value, list):
        return [to_device(item, device) for item in value]
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value


def _unique(tensors) -> list[torch.Tensor]:
    seen: set[int] = set()
    result = []
    for tensor in tensors:
        if tensor is not None and id(tensor) not in seen:
            seen.add(id(tensor))
            result.append(tensor)
    return result


class Replica:
    """A job's trainable state on one device: its stage modules and its optimizer, with the parameters and
    buffers listed in one fixed order, so two replicas of the same job align item by item."""

    def __init__(self, device: Any, stages: Sequence[nn.Module], optimizer: torch.optim.Optimizer,
                 target: MigrationTarget | None = None):
        self.device = torch.device(device)
        self.stages = list(stages)
        self.optimizer = optimizer
        self.target = target  # None for the primary copy (it runs under the executor's own context)
        group_params = [param for group in optimizer.param_groups for param in group["params"]]
        stage_params = [param for stage in self.stages for param in stage.parameters()]
        self.params: list[torch.Tensor] = _unique(group_params + stage_params)
        self.buffers: list[torch.Tensor] = _unique(buffer for stage in self.stages for buffer in stage.buffers())

    def replicate(self, target: MigrationTarget) -> Replica:
        """A copy of this replica on ``target.device`` (one deepcopy, so weights shared between stages -- tied
        embeddings -- stay shared in the copy)."""
        memo: dict[int, Any] = {}
        stages, optimizer = copy.deepcopy((self.stages, self.optimizer), memo)
        device = target.device
        with torch.no_grad():
            for stage in stages:
                stage.to(device)
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.device != device:
                        param.data = param.data.to(device)
            for param in optimizer.state:
                state = optimizer.state[param]
                for key, value in list(state.items()):
                    if isinstance(value, torch.Tensor) and not _keeps_device(key, value):
                        state[key] = value.to(device)
        replica = Replica(device, stages, optimizer, target)
        if len(replica.params) != len(self.params) or len(replica.buffers) != len(self.buffers):
            raise RuntimeError("the replica's parameters do not align with the original's")
        return replica

    def train_mode(self) -> None:
        for stage in self.stages:
            stage.train()


def _keeps_device(key: str, value: torch.Tensor) -> bool:
    """Optimizer state that stays where it is (Adam's scalar ``step`` lives on the CPU unless capturable)."""
    return key == "step" and value.dim() == 0 and value.device.type == "cpu"


@torch.no_grad()
def sync(source: Replica, destination: Replica) -> int:
    """Copy parameters, buffers, optimizer state and hyperparameters from ``source`` into ``destination``
    (after an optimizer step on ``source``). Returns the bytes copied."""
    copied = 0
    for src, dst in zip(source.params, destination.params, strict=True):
        dst.copy_(src)
        copied += src.numel() * src.element_size()
    for src, dst in zip(source.buffers, destination.buffers, strict=True):
        dst.copy_(src)
        copied += src.numel() * src.element_size()
    mapping = dict(zip(map(id, source.params), destination.params, strict=True))
    for src_param, src_state in source.optimizer.state.items():
        dst_param = mapping.get(id(src_param))
        if dst_param is None:
            continue
        dst_state = destination.optimizer.state[dst_param]
        for key, value in src_state.items():
            if isinstance(value, torch.Tensor):
                current = dst_state.get(key)
                if (isinstance(current, torch.Tensor) and current.shape == value.shape
                        and current.dtype == value.dtype):
                    current.copy_(value)
                else:
                    dst_state[key] = value.clone() if _keeps_device(key, value) else value.to(
                        dst_param.device, copy=True)
                copied += value.numel() * value.element_size()
            else:
                dst_state[key] = copy.deepcopy(value)
    for src_group, dst_group in zip(source.optimizer.param_groups, destination.optimizer.param_groups,
                                    strict=True):
        for key, value in src_group.items():
            if key != "params":
                dst_group[key] = value
    return copied


def move_iteration(state: Any, source: Replica, destination: Replica, stage_count: int) -> None:
    """Move a staged session's iteration in flight from ``source`` to ``destination`` at its action boundary
    ``state._position`` (see the module docstring). ``state`` has ``_position``, ``_inputs``, ``_outputs``,
    ``_targets``, ``_loss`` and ``loss_fn``, as :class:`~components.gpushare.stages.StagedSession` does."""
    position, n = state._position, stage_count
    device = destination.device
    if position == 0:
        return
    # Which stages still need their forward graph on the new device.
    if position <= n:
        recompute = range(position)  # forwards done, loss not yet
        boundary = None
    elif position <= 2 * n:
        next_backward = 2 * n - position  # stages next_backward .. 0 still need backward
        recompute = range(next_backward + 1)
        boundary = next_backward + 1 if next_backward + 1 < n else None
    else:  # only the optimizer step is left
        recompute = range(0)
        boundary = None
    with torch.no_grad():
        if position > n:  # the loss was taken: the gradients so far belong to this iteration
            for src, dst in zip(source.params, destination.params, strict=True):
                dst.grad = None if src.grad is None else src.grad.to(device, copy=True)
        # The old device's forward already updated the buffers; a recomputed forward must not count twice.
        saved = [buffer.detach().to(device, copy=True) for buffer in source.buffers]
    state._targets = to_device(state._targets, device)
    inputs, outputs = state._inputs, state._outputs
    destination.train_mode()
    for index in recompute:
        x = inputs[index]
        x = to_device(x, device) if index == 0 else x.detach().to(device).requires_grad_(True)
        inputs[index] = x
        outputs[index] = destination.stages[index](x)
    if boundary is not None:
        old = inputs[boundary]
        moved = old.detach().to(device).requires_grad_(True)
        if old.grad is not None:
            moved.grad = old.grad.to(device)
        inputs[boundary] = moved
    for index in range(len(outputs)):
        if index not in recompute and outputs[index] is not None:
            outputs[index] = None  # a stage past its backward, or not yet run: nothing of it is needed here
    if position == n + 1:  # loss taken, its backward not run yet
        state._loss = state.loss_fn(outputs[n - 1], state._targets)
    else:
        state._loss = None
    with torch.no_grad():
        for buffer, value in zip(destination.buffers, saved, strict=True):
            # ``.data``: the recomputed graph saved the buffer (BatchNorm keeps its running statistics for
            # backward's signature; training-mode backward reads the batch statistics); without it, autograd's
            # version check would refuse the backward.
            buffer.data.copy_(value)
