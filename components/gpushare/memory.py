"""Per-job memory measurement for GPU sharing, and the lane allocator (re-exported from :mod:`.lanes`).

Two numbers per job (Salus's memory classes):

- **persistent** bytes: what stays on the device between iterations -- parameters, gradients (PyTorch keeps
  ``.grad`` between steps unless the job frees it), buffers, optimizer state, and tensors the job keeps on
  the device (a dataset moved there). Measured by walking the job's objects and adding up the *storages*
  of their tensors, each storage once (views and shared weights are not counted twice).
- **peak ephemeral** bytes: the most memory one iteration needs on top of that (activations saved for
  backward, temporaries, new gradients).

  - On CUDA: ``torch.cuda.max_memory_allocated() - memory_allocated()`` around the iteration after
    ``reset_peak_memory_stats()`` -- exact, and cheap enough to do on every iteration.
  - On CPU (virtual GPUs): :class:`AllocationMeter`, a ``TorchDispatchMode`` that sees every tensor an
    operator returns during the iteration, counts each new storage once while it is alive (a weak reference
    tells when it is freed) and keeps the peak. Tensors freed during the iteration that existed before it
    (the previous step's gradients, say) are invisible to it, so the figure is an upper bound: safe for
    admission. It costs a few microseconds per operator, so the executor meters only the first iterations.

:func:`profile_workload` measures a job before it is admitted: it builds a *separate* copy of the workload on
the CPU, runs a couple of real steps under the meter and measures what stays resident. Byte sizes of
tensors do not depend on the device, so the figures carry over to a GPU (plus the caching allocator's
rounding, covered by the headroom). The job's own instance is untouched.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from components.gpushare.lanes import (  # noqa: F401 -- re-exported: the allocator is part of this module's API
    Admission,
    Lane,
    LaneAllocator,
    MemoryRequest,
    format_bytes,
    parse_bytes,
)

# Added to a profiled request: CUDA's caching allocator rounds blocks up (512 B, 2 MiB segments), and an
# iteration's peak can vary a little with the batch.
DEFAULT_HEADROOM = 0.10
DEFAULT_HEADROOM_MINIMUM = 64 * 1024


@dataclass(frozen=True)
class PersistentBytes:
    """A breakdown of what a job keeps on its device."""

    parameters: int = 0
    gradients: int = 0
    buffers: int = 0
    optimizer: int = 0
    data: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.buffers + self.optimizer + self.data

    def to_dict(self) -> dict[str, int]:
        return {"parameters": self.parameters, "gradients": self.gradients, "buffers": self.buffers,
                "optimizer": self.optimizer, "data": self.data, "total": self.total}


def _storage_key(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    if tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    pointer = storage.data_ptr()
    if pointer == 0:
        return None
    return (str(tensor.device), pointer, storage.nbytes())


def tensor_bytes(tensors: Iterable[torch.Tensor], seen: set | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (``seen`` carries storages already counted)."""
    seen = set() if seen is None else seen
    total = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        key = _storage_key(tensor)
        if key is None or key in seen:
            continue
        seen.add(key)
        total += key[2]
    return total


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    found = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                found.append(value)
    return found


def _data_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if depth >= 2:
        return []
    if isinstance(value, list | tuple):
        return [t for item in value for t in _data_tensors(item, depth + 1)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _data_tensors(item, depth + 1)]
    return []


def persistent_bytes(*objects: Any, device: torch.device | str | None = None) -> PersistentBytes:
    """What ``objects`` keep resident: modules, optimizers, tensors, and objects holding them (a Workload).

    For an arbitrary object the attributes are searched one level deep: modules and optimizers anywhere in
    ``vars(obj)``, plain tensors (and lists, tuples, dicts of them) as device-resident data. Only tensors on
    ``device`` count when it is given (a CUDA job's CPU-side copies are not device memory).
    """
    wanted = torch.device(device) if device is not None else None
    modules: list[nn.Module] = []
    optimizers: list[torch.optim.Optimizer] = []
    data: list[torch.Tensor] = []

    def collect(value: Any, nested: bool) -> None:
        if isinstance(value, nn.Module):
            modules.append(value)
        elif isinstance(value, torch.optim.Optimizer):
            optimizers.append(value)
        elif isinstance(value, torch.Tensor | list | tuple | dict):
            data.extend(_data_tensors(value))
        elif not nested and hasattr(value, "__dict__"):
            for attribute in vars(value).values():
                collect(attribute, True)

    for obj in objects:
        collect(obj, False)

    def on_device(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        return [t for t in tensors if wanted is None or _same_device(t.device, wanted)]

    seen: set = set()
    parameters = [p for module in modules for p in module.parameters()]
    counted = PersistentBytes(
        parameters=tensor_bytes(on_device(parameters), seen),
        gradients=tensor_bytes(on_device(p.grad for p in parameters if p.grad is not None), seen),
        buffers=tensor_bytes(on_device(b for module in modules for b in module.buffers()), seen),
        optimizer=tensor_bytes(on_device(t for opt in optimizers for t in _optimizer_tensors(opt)), seen),
        data=tensor_bytes(on_device(data), seen),
    )
    return counted


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index


class AllocationMeter(TorchDispatchMode):
    """Counts the bytes of tensors created while active; ``peak`` is the most alive at once.

    Thread-local (dispatch modes are): only operators run by the thread that entered it are counted. The
    backward pass on CPU runs in that thread too.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.allocated = 0
        self._alive: dict[int, int] = {}

    def _freed(self, key: int) -> None:
        self.live -= self._alive.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = id(storage)
            if key in inputs or key in self._alive:
                continue  # a view or an in-place result: no new memory
            size = storage.nbytes()
            self._alive[key] = size
            self.live += size
            self.allocated += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key)
        return out


class EphemeralMeter:
    """Measures an iteration's peak memory on ``device``: CUDA statistics there, :class:`AllocationMeter` on CPU.

    ``with EphemeralMeter(device) as meter: step()`` then ``meter.peak`` (bytes above what was allocated
    when the iteration began). The meter may be entered again to continue the same iteration after a
    preemption (a staged session resumed later): the peak then covers the whole iteration, activations kept
    across the pause included.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.peak = 0
        self._mode: AllocationMeter | None = None
        self._baseline: int | None = None

    def __enter__(self) -> EphemeralMeter:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            if self._baseline is None:
                self._baseline = torch.cuda.memory_allocated(self.device)
        else:
            if self._mode is None:
                self._mode = AllocationMeter()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device) - (self._baseline or 0), 0)
        elif self._mode is not None:
            self._mode.__exit__(*exc_info)
            self.peak = max(self.peak, self._mode.peak)


def measure_step(step: Callable[[], Any], device: torch.device | str = "cpu") -> tuple[Any, int]:
    """Run ``step()`` under an :class:`EphemeralMeter`; returns ``(its result, peak bytes)``."""
    with EphemeralMeter(device) as meter:
        result = step()
    return result, meter.peak


def profile_workload(
    workload_factory: Callable[[], Any],
    spec: dict[str, Any],
    *,
    steps: int = 2,
    headroom: float = DEFAULT_HEADROOM,
    headroom_minimum: int = DEFAULT_HEADROOM_MINIMUM,
) -> MemoryRequest:
    """Measure a :class:`~components.train.workloads.Workload`'s request on a throwaway CPU copy.

    ``steps`` real steps run under the meter (the first creates the optimizer state, the next ones show the
    steady iteration); persistent memory is measured after them. The copy's state is discarded, so the
    job's own run is unaffected.
    """
    workload = workload_factory()
    cpu = torch.device("cpu")
    with torch.random.fork_rng(devices=[]):  # user workloads may draw from the global RNG
        workload.setup(spec, cpu)
        per_epoch = max(1, int(workload.steps_per_epoch()))
        before = persistent_bytes(workload).total
        ephemeral = 0
        for index in range(max(1, steps)):
            epoch, position = divmod(index, per_epoch)
            batch = workload.batch(epoch, position)
            _, peak = measure_step(lambda b=batch: workload.train_step(b), cpu)
            after = persistent_bytes(workload).total
            # Memory that stayed (optimizer state, new gradients) is persistent, not per-iteration.
            ephemeral = max(ephemeral, peak - max(0, after - before), 0)
            before = after
    persistent = persistent_bytes(workload).total
    return MemoryRequest(persistent, ephemeral).with_headroom(headroom, headroom_minimum)


def profile_module(
    model: nn.Module,
    sample: Any,
    *,
    headroom: float = DEFAULT_HEADROOM,
    headroom_minimum: int = DEFAULT_HEADROOM_MINIMUM,
) -> MemoryRequest:
    """The request of an inference model: its weights, and the peak of one forward pass on ``sample``.

    Runs on a deep copy on the CPU, in inference mode, so the model itself is untouched.
    """
    clone = copy.deepcopy(model).to("cpu").eval()
    inputs = sample.to("cpu") if isinstance(sample, torch.Tensor) else sample
    with torch.inference_mode():
        _, peak = measure_step(lambda: clone(inputs), "cpu")
    return MemoryRequest(persistent_bytes(clone).total, peak).with_headroom(headroom, headroom_minimum)
