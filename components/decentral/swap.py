"""Atom-style layer swapping: train a model larger than the device's memory (node side: torch).

In an Atom swarm (arXiv 2403.10504) every peer holds the **whole** model in host memory and trains it on a device
whose memory is too small for it, moving layers in and out. This module is that machinery for one peer:

1. :func:`profile_layers` measures each swap unit (:func:`~components.decentral.model.model_layers`: the
   embedding, each block, the head) for the batch it will train on: its parameter bytes, the bytes of its
   output, the bytes its forward saves for backward, its forward and backward compute time, and the time to
   load its parameters over the host-to-device link.
2. :func:`plan_segments` cuts the layers into **segments** (contiguous runs of layers) by dynamic programming
   over the cut points, so that two consecutive segments always fit the device budget together -- the one
   computing plus the one being prefetched -- and the estimated step time is minimal.
3. :class:`SwappedModel` runs a training step with that plan: computing segment ``i`` overlaps loading segment
   ``i + 1`` (a prefetch thread; on CUDA its copies run on a side stream), forward ``0 .. K-1`` then backward
   ``K-1 .. 0``. The master parameters stay in host memory -- the layers' own ``nn.Parameter`` objects, which an
   optimizer and a parameter averager see and update -- and the device only ever holds copies.

**Recomputation.** Keeping every layer's saved activations until its backward would cost device memory in
proportion to the whole model's depth, which is what swapping exists to avoid. So the forward pass runs each
segment under ``no_grad`` and keeps only its *input* (a segment-boundary activation, copied to host memory --
the "stash"); the backward pass reloads the segment, recomputes its forward from that input with grad enabled
and back-propagates the incoming gradient through it. The last segment is run forward with grad, the loss
computed and back-propagated at once (it is never recomputed), and the second-to-last segment stays on the
device across the turn (backward needs it right after), so a step loads ``2K - 2`` segments (``1`` when
``K = 1``). The layers are deterministic (no dropout), so the loss and the gradients equal in-memory training up
to float rounding. After a segment's backward its device gradients are added into the host parameters' ``.grad``
(created when ``None``) and freed.

**What counts against the budget** (bytes; :class:`DeviceMemory` tracks them at run time and raises
:class:`DeviceMemoryError` past the budget). For a segment ``s`` made of layers ``a .. b-1``:

* ``P(s)``: its parameters (and buffers): a device copy exists from the start of its load to its release;
* ``in(s)``: its input (the output of layer ``a - 1``; for ``a = 0`` nothing: the batch is counted apart),
  ``out(s)``: its output (the output of layer ``b - 1``);
* ``S(s)``: what its forward with grad saves for backward: each layer's saved tensors other than its parameters
  and its input (measured by :func:`profile_layers` with saved-tensor hooks, deduplicated by storage), plus the
  segment's internal boundary activations (a layer's output is the next layer's saved input); for the last
  layer, the loss's saved tensors (the log-probabilities);
* two **allowances**, which are not measured but defined: a no-grad forward's transient workspace
  ``Wf(s) = max over its layers of their saved bytes`` (a forward without grad holds at most the intermediates a
  forward with grad would keep), and a backward's transient gradients ``Wb(s) = 2 x the largest single saved
  tensor of its layers`` (the gradient a node consumes and the one it produces);
* the **batch** (inputs and targets) stays on the device for the whole step.

A segment's forward window holds ``fwd(s) = P + in + out + Wf``; its backward window (recompute and backward)
holds ``bwd(s) = 2 P + S + 2 in + 2 out + Wb`` (parameters and their gradients, the input and its gradient, the
output and the incoming gradient). Consecutive segments ``s, t = s + 1`` must satisfy
``batch + max(fwd(s) + P(t), bwd(t) + P(s)) <= budget`` -- computing ``s`` while ``t`` loads, and
back-propagating ``t`` while ``s`` loads (or stays, for ``s = K - 2``); and every segment needs
``batch + bwd(s) <= budget`` (the first one's backward runs with nothing beside it). The plan's peak is the
largest of these. At run time the same categories are charged with the real sizes (parameters, gradients,
boundary activations, the saved tensors packed by autograd's hooks, the batch) and the allowances as planned;
nothing else is on the device (the stash lives in host memory). A plan holds for the batch shape it was profiled
with. Not counted: the CUDA caching allocator's fragmentation and cuBLAS workspaces (a real GPU needs headroom).
At this small scale the activations weigh as much as the parameters: a block's saved tensors pass its
parameter bytes beyond about ``0.8 x width`` tokens per batch.

**Step time estimate.** With ``F``, ``B`` and ``L`` a segment's forward, backward and load time (and its
gradients' offload taken as ``L`` again, the link being symmetric): ``T = L_0 + sum_{i<K-1} max(F_i, L_{i+1})``
for the forward, then ``R_{K-1} + sum_{i=K-2..1} max(R_i, L_{i-1}) + R_0`` for the backward, with
``R_i = F_i + B_i + L_i`` (recompute, backward, gradient offload). The small activation stash transfers are left
out of the estimate (they are in the counters).

**CUDA vs CPU emulation.** On CUDA (``device="cuda"``) the master parameters are pinned, a load is a real
``non_blocking`` copy on a side stream issued by the prefetch thread, and compute waits for it through a CUDA
event; the link's bandwidth is measured. On CPU there is no device, so it is emulated with the same code path:
a device copy is a separate set of tensors (a real ``memcpy`` from the host store), and :class:`HostLink` is a
serial link of ``bytes_per_s`` each way (default 16 GB/s, PCIe-like; ``None`` = unthrottled): a transfer takes
``max(real copy time, bytes / bandwidth)``, the remainder slept, not spun. Device memory is the byte budget of
:class:`DeviceMemory` on both.

:func:`throughput` measures swapped training against in-memory training of the same model on the same batches
(the benchmark: a model four times the device budget).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

DEFAULT_LINK_BYTES_PER_S = 16e9  # PCIe 4.0 x16-ish
COMPUTE_KINDS = ("forward", "recompute", "backward")
EVENT_KINDS = ("load", *COMPUTE_KINDS, "offload")
MB = 1e6


class DeviceMemoryError(RuntimeError):
    """An allocation would take the device past its byte budget."""


class SwapPlanError(ValueError):
    """No segmentation of the layers fits the device budget."""


# --------------------------------------------------------------------------------------------------- memory


class DeviceMemory:
    """The device's memory as a byte budget: :meth:`allocate` and :meth:`free` by kind, ``current`` and
    ``peak``. Allocating past ``budget_bytes`` raises :class:`DeviceMemoryError` (and allocates nothing).
    ``budget_bytes=None`` is unlimited (still counted). Thread-safe (the prefetch thread allocates too)."""

    def __init__(self, budget_bytes: int | None):
        self.budget_bytes = None if budget_bytes is None else int(budget_bytes)
        self._lock = threading.Lock()
        self.current = 0
        self.peak = 0
        self.by_kind: dict[str, int] = {}
        self.peak_by_kind: dict[str, int] = {}  # what each kind held at the moment of the peak

    def allocate(self, nbytes: int, kind: str = "other") -> None:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        with self._lock:
            if self.budget_bytes is not None and self.current + nbytes > self.budget_bytes:
                held = ", ".join(f"{k} {v / MB:.3f} MB" for k, v in sorted(self.by_kind.items()) if v)
                raise DeviceMemoryError(
                    f"device memory budget exceeded: allocating {nbytes / MB:.3f} MB of {kind} with "
                    f"{self.current / MB:.3f} MB in use ({held or 'nothing'}) passes the budget of "
                    f"{self.budget_bytes / MB:.3f} MB")
            self.current += nbytes
            self.by_kind[kind] = self.by_kind.get(kind, 0) + nbytes
            if self.current > self.peak:
                self.peak = self.current
                self.peak_by_kind = dict(self.by_kind)

    def free(self, nbytes: int, kind: str = "other") -> None:
        nbytes = int(nbytes)
        with self._lock:
            if nbytes > self.by_kind.get(kind, 0):
                raise RuntimeError(f"freeing {nbytes} bytes of {kind}, only {self.by_kind.get(kind, 0)} held")
            self.current -= nbytes
            self.by_kind[kind] -= nbytes

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.current
            self.peak_by_kind = dict(self.by_kind)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"budget_bytes": self.budget_bytes, "current_bytes": self.current, "peak_bytes": self.peak,
                    "peak_by_kind": {k: v for k, v in self.peak_by_kind.items() if v}}


class _Held:
    """Allocations made for one window, all freed together."""

    def __init__(self, memory: DeviceMemory):
        self.memory = memory
        self.items: list[tuple[int, str]] = []

    def take(self, nbytes: int, kind: str) -> None:
        if nbytes:
            self.memory.allocate(nbytes, kind)
            self.items.append((int(nbytes), kind))

    def release(self) -> None:
        while self.items:
            nbytes, kind = self.items.pop()
            self.memory.free(nbytes, kind)


# ----------------------------------------------------------------------------------------------------- link


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _memcpy(tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of a CPU tensor (into ``out`` if given) by one plain ``memcpy`` (ctypes releases the GIL). Not
    ``clone``: in the prefetch thread that would start a second OpenMP team, whose spin-waiting threads fight the
    compute thread's team for the cores (steps ran many times slower on 2 cores)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        if out is None:
            return tensor.clone()
        with torch.no_grad():
            return out.copy_(tensor)
    copy = torch.empty_like(tensor, memory_format=torch.contiguous_format) if out is None else out
    if tensor.numel():
        ctypes.memmove(copy.data_ptr(), tensor.data_ptr(), _nbytes(tensor))
    return copy


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class HostLink:
    """The host-to-device link (and back).

    On CPU the device is emulated: :meth:`load` makes a real copy of each tensor (the "device copy", separate from
    the host store) and the link is a serial channel of ``bytes_per_s`` each way: a transfer occupies it for
    ``bytes / bytes_per_s`` from when it is free, and returns no earlier than that (sleeping the remainder after
    the real copy). ``bytes_per_s=None`` is unthrottled. On CUDA the copies are real (``non_blocking`` from
    pinned memory on a side stream, an event marking their end) and ``bytes_per_s`` is ignored; the bandwidth is
    measured. Counters: bytes and seconds per direction, and bytes by ``direction:kind`` (``h2d:parameters``,
    ``h2d:batch``, ``d2h:activations`` / ``h2d:activations`` (the stash), ``d2h:gradients``)."""

    def __init__(self, device: torch.device | str = "cpu", bytes_per_s: float | None = DEFAULT_LINK_BYTES_PER_S):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be positive or None, not {bytes_per_s}")
        self.bytes_per_s = None if self.cuda or bytes_per_s is None else float(bytes_per_s)
        self._lock = threading.Lock()
        self._free_at = {"h2d": 0.0, "d2h": 0.0}
        # CUDA: loads on one side stream, offloads (stash, gradients) on another, so both overlap the compute
        # stream and each other; their timing events are summed into the counters by settle().
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.d2h_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._timings: list[tuple[str, Any, Any]] = []
        self._bandwidth: float | None = None
        # CPU emulation: the device's memory arena -- released parameter copies, reused by shape and dtype, as a
        # GPU's caching allocator would (fresh host allocations would page-fault on every load).
        self._arena: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self.reset_counters()

    def reset_counters(self) -> None:
        with self._lock:
            self.bytes = {"h2d": 0, "d2h": 0}
            self.seconds = {"h2d": 0.0, "d2h": 0.0}
            self.bytes_by_kind: dict[str, int] = {}
            self.transfers = 0

    def bandwidth(self) -> float:
        """Bytes per second host to device: ``bytes_per_s`` on CPU; measured (pinned, 64 MB) on CUDA, or on CPU
        when unthrottled (a plain copy)."""
        if self.bytes_per_s is not None:
            return self.bytes_per_s
        if self._bandwidth is None:
            size = 64 << 20 if self.cuda else 32 << 20
            host = torch.empty(size, dtype=torch.uint8, pin_memory=self.cuda)
            times = []
            for _ in range(4):
                _synchronize(self.device)
                start = time.perf_counter()
                target = host.to(self.device, non_blocking=self.cuda, copy=True)
                _synchronize(self.device)
                times.append(time.perf_counter() - start)
                del target
            self._bandwidth = size / max(min(times[1:]), 1e-9)
        return self._bandwidth

    def _occupy(self, direction: str, nbytes: int, started: float) -> None:
        """Hold the link for ``nbytes``: return no earlier than the transfer's end on a serial link."""
        with self._lock:
            self.bytes[direction] += nbytes
            self.transfers += 1
            if self.bytes_per_s is None:
                end = time.perf_counter()
            else:
                begin = max(started, self._free_at[direction])
                end = begin + nbytes / self.bytes_per_s
                self._free_at[direction] = end
        remaining = end - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        with self._lock:
            self.seconds[direction] += time.perf_counter() - started

    def _count(self, key: str, nbytes: int) -> None:
        with self._lock:
            self.bytes_by_kind[key] = self.bytes_by_kind.get(key, 0) + nbytes

    def load(self, tensors: Sequence[torch.Tensor], kind: str = "parameters",
             after: Sequence[Any] = ()) -> tuple[list[torch.Tensor], Any]:
        """Copy ``tensors`` to the device as one transfer: ``(copies, event)``; ``event`` is the CUDA event after
        the copies (``None`` on CPU) -- the caller passes it to :meth:`wait` before computing with them.

        On CUDA the copies are only *issued* (``non_blocking`` on the side stream, from pinned memory for the
        parameters and the stash), after the CUDA events in ``after`` (a stash's offload); the call returns at
        once and the copy engine runs them while the compute stream works. On CPU the copies are made now (the
        emulated link's time slept) and reuse tensors given back with :meth:`recycle`."""
        started = time.perf_counter()
        nbytes = sum(_nbytes(t) for t in tensors)
        event = None
        if self.cuda:
            with torch.cuda.stream(self.stream):
                for waiting in after:
                    if waiting is not None:
                        self.stream.wait_event(waiting)
                begin = torch.cuda.Event(enable_timing=True)
                begin.record(self.stream)
                copies = [t.to(self.device, non_blocking=True) for t in tensors]
                event = torch.cuda.Event(enable_timing=True)
                event.record(self.stream)
            with self._lock:
                self.bytes["h2d"] += nbytes
                self.transfers += 1
                self._timings.append(("h2d", begin, event))
        else:
            copies = [_memcpy(t, self._reuse(t)) for t in tensors]
            self._occupy("h2d", nbytes, started)
        self._count(f"h2d:{kind}", nbytes)
        return copies, event

    def settle(self) -> None:
        """CUDA: wait for every copy issued so far and add their measured times to ``seconds`` (a call's end
        runs this; nothing on CPU)."""
        if not self.cuda:
            return
        torch.cuda.synchronize(self.device)
        with self._lock:
            timings, self._timings = self._timings, []
            for direction, begin, end in timings:
                self.seconds[direction] += begin.elapsed_time(end) / 1e3

    def _reuse(self, tensor: torch.Tensor) -> torch.Tensor | None:
        with self._lock:
            free = self._arena.get((tuple(tensor.shape), tensor.dtype))
            return free.pop() if free else None

    def recycle(self, copies: Sequence[torch.Tensor]) -> None:
        """Give device copies nothing references any more back to the emulated device's arena (CPU; on CUDA the
        caching allocator does this)."""
        if self.cuda:
            return
        with self._lock:
            for tensor in copies:
                tensor.grad = None
                self._arena.setdefault((tuple(tensor.shape), tensor.dtype), []).append(tensor)

    def clear(self) -> None:
        """Empty the emulated arena."""
        with self._lock:
            self._arena.clear()

    def wait(self, copies: Sequence[torch.Tensor], event: Any) -> None:
        """Order the current (compute) stream after a load's copies (CUDA; nothing on CPU)."""
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for tensor in copies:
                tensor.record_stream(stream)

    def offload(self, tensor: torch.Tensor, kind: str = "activations") -> tuple[torch.Tensor, Any]:
        """Copy ``tensor`` from the device to host memory: ``(host copy, event)``. On CPU the copy is made now
        (``event`` is None). On CUDA it is issued on the offload stream, after the compute stream's work so far,
        into pinned memory; ``event`` marks its end (pass it as ``after`` to the :meth:`load` that brings it
        back; the host copy must not be read before it)."""
        nbytes = _nbytes(tensor)
        if self.cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            with torch.cuda.stream(self.d2h_stream):
                begin = torch.cuda.Event(enable_timing=True)
                begin.record(self.d2h_stream)
                self.d2h_stream.wait_event(ready)
                host.copy_(tensor.detach(), non_blocking=True)
                tensor.record_stream(self.d2h_stream)  # not reused before the copy has read it
                event = torch.cuda.Event(enable_timing=True)
                event.record(self.d2h_stream)
            with self._lock:
                self.bytes["d2h"] += nbytes
                self.transfers += 1
                self._timings.append(("d2h", begin, event))
            self._count(f"d2h:{kind}", nbytes)
            return host, event
        started = time.perf_counter()
        host = tensor.detach().to("cpu", copy=True)
        self._occupy("d2h", nbytes, started)
        self._count(f"d2h:{kind}", nbytes)
        return host, None

    def offload_gradients(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """CUDA: copy each device gradient into its pinned host buffer (``(buffer, gradient)`` pairs) on the offload
        stream, after the compute stream's work so far; returns the event that marks the end of the copies (the
        caller waits for it before reading the buffers)."""
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        nbytes = 0
        with torch.cuda.stream(self.d2h_stream):
            begin = torch.cuda.Event(enable_timing=True)
            begin.record(self.d2h_stream)
            self.d2h_stream.wait_event(ready)
            for buffer, gradient in pairs:
                buffer.copy_(gradient, non_blocking=True)
                gradient.record_stream(self.d2h_stream)
                nbytes += _nbytes(gradient)
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.d2h_stream)
        with self._lock:
            self.bytes["d2h"] += nbytes
            self.transfers += 1
            self._timings.append(("d2h", begin, event))
        self._count("d2h:gradients", nbytes)
        return event

    def accumulate(self, target: torch.Tensor | None, gradient: torch.Tensor) -> torch.Tensor:
        """Bring a device ``gradient`` to host memory and add it into ``target`` (a host tensor, or ``None``:
        then a host copy is returned). On CPU the add reads the device copy directly (the transfer and the add
        in one pass)."""
        started = time.perf_counter()
        nbytes = _nbytes(gradient)
        with torch.no_grad():
            if self.cuda:
                host = gradient.detach().to("cpu")
                result = host if target is None else target.add_(host)
            else:
                result = _memcpy(gradient) if target is None else target.add_(gradient)
        self._occupy("d2h", nbytes, started)
        self._count("d2h:gradients", nbytes)
        return result

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"device": str(self.device), "bytes_per_s": self.bytes_per_s, "bytes": dict(self.bytes),
                    "seconds": dict(self.seconds), "bytes_by_kind": dict(self.bytes_by_kind),
                    "transfers": self.transfers}


# ---------------------------------------------------------------------------------------------------- layers


def _layer_tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    """A layer's parameters and buffers by name (what a device copy holds; shared tensors once)."""
    tensors: dict[str, torch.Tensor] = dict(layer.named_parameters())
    tensors.update(dict(layer.named_buffers()))
    return tensors


def _layer_name(layer: nn.Module, index: int) -> str:
    kind = type(layer).__name__
    if kind == "InputEmbedding":
        return "embedding"
    if kind == "Head":
        return "head"
    if kind == "Block":
        return f"block {index - 1}"
    return f"{kind.lower()} {index}"


class _SavedCounter:
    """Saved-tensor hooks that charge each new storage autograd saves (other than ``exclude``d ones) to
    ``on_new(nbytes)``; the largest one seen is kept."""

    def __init__(self, exclude: set[int], on_new: Callable[[int], None] | None = None):
        self.exclude = exclude
        self.seen: set[int] = set()
        self.total = 0
        self.largest = 0
        self.on_new = on_new

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self.exclude and pointer not in self.seen:
            self.seen.add(pointer)
            nbytes = storage.nbytes()
            if self.on_new is not None:
                self.on_new(nbytes)
            self.total += nbytes
            self.largest = max(self.largest, nbytes)
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


# --------------------------------------------------------------------------------------------------- profile


@dataclass
class LayerProfile:
    """One swap unit, measured for one batch. ``activation_bytes`` is its output; ``input_bytes`` its input (for
    layer 0: the whole batch, inputs and targets); ``saved_bytes`` what its forward with grad saves for backward
    besides its parameters and its input (for the last layer with a loss: the loss's too), ``largest_saved_bytes``
    the largest of those tensors. Times are medians in seconds; ``load_s`` is ``param_bytes`` over the link."""

    index: int
    name: str
    param_bytes: int
    activation_bytes: int
    forward_s: float
    backward_s: float
    load_s: float
    input_bytes: int = 0
    saved_bytes: int = 0
    largest_saved_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    _synchronize(device)
    start = time.perf_counter()
    result = fn()
    _synchronize(device)
    return time.perf_counter() - start, result


def profile_layers(layers: Sequence[nn.Module], sample_input: torch.Tensor, *, device: torch.device | str,
                   link: HostLink, repeats: int = 3, targets: torch.Tensor | None = None,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                   ) -> list[LayerProfile]:
    """Measure each layer for ``sample_input`` (the batch it will train on), one layer on the device at a time:
    forward time (no grad) and backward time (after a forward with grad; the gradient of its output is the loss's
    for the last layer when ``loss_fn`` and ``targets`` are given, ones otherwise), each the median of
    ``repeats`` after a warm-up; parameter, output and saved bytes; and the load time, ``param_bytes`` over
    ``link.bandwidth()`` (configured on the emulated CPU link, measured on CUDA)."""
    device = torch.device(device)
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    bandwidth = link.bandwidth()
    x = sample_input.to(device)
    targets = targets.to(device) if targets is not None else None
    batch = [x] + ([targets] if targets is not None else [])
    batch_storages = _storages(batch)
    profiles = []
    for index, layer in enumerate(layers):
        host = _layer_tensors(layer)
        copies = {name: t.detach().to(device, copy=True).requires_grad_(t.requires_grad) for name, t in host.items()}
        param_bytes = sum(_nbytes(t) for t in host.values())
        last = index == len(layers) - 1
        with_loss = last and loss_fn is not None and targets is not None

        def forward(inputs, copies=copies, layer=layer):
            return functional_call(layer, copies, (inputs,))

        with torch.no_grad():
            forward(x)  # warm-up
            times, outputs = zip(*(_timed(lambda x=x: forward(x), device) for _ in range(repeats)), strict=True)
        forward_s, output = statistics.median(times), outputs[-1]
        del outputs

        exclude = _storages(copies.values()) | _storages([x]) | batch_storages
        backward_times, counter = [], None
        for attempt in range(repeats + 1):
            inputs = x.detach().requires_grad_(x.is_floating_point())
            counter = _SavedCounter(exclude | _storages([inputs]))
            with counter.hooks(), torch.enable_grad():
                result = forward(inputs)
                loss = loss_fn(result, targets) if with_loss else None
            if with_loss:
                seconds, _ = _timed(lambda loss=loss: loss.backward(), device)
            else:
                gradient = torch.ones_like(result)
                seconds, _ = _timed(lambda r=result, g=gradient: torch.autograd.backward(r, g), device)
            if attempt:  # the first is the warm-up
                backward_times.append(seconds)
            for tensor in copies.values():
                tensor.grad = None
        input_bytes = sum(_nbytes(t) for t in batch) if index == 0 else _nbytes(x)
        profiles.append(LayerProfile(
            index=index, name=_layer_name(layer, index), param_bytes=param_bytes,
            activation_bytes=_nbytes(output), forward_s=forward_s, backward_s=statistics.median(backward_times),
            load_s=param_bytes / bandwidth, input_bytes=input_bytes, saved_bytes=counter.total,
            largest_saved_bytes=counter.largest))
        x = output.detach()
        del copies
    return profiles


# ------------------------------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class Segment:
    """Layers ``start .. stop - 1`` and what the plan takes them to cost."""

    start: int
    stop: int
    names: tuple[str, ...]
    param_bytes: int
    forward_s: float
    backward_s: float
    load_s: float
    forward_bytes: int  # fwd(s): a no-grad forward window
    backward_bytes: int  # bwd(s): a recompute-and-backward window
    forward_workspace_bytes: int  # Wf(s)
    backward_workspace_bytes: int  # Wb(s)

    @property
    def label(self) -> str:
        return self.names[0] if len(self.names) == 1 else f"{self.names[0]} .. {self.names[-1]}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "names": list(self.names), "label": self.label}


@dataclass(frozen=True)
class SwapPlan:
    """The segments (``[start, stop)`` layer ranges) and the estimates: step time, peak device bytes, bytes
    loaded and stashed per training step; ``compute_s`` is the in-memory (no swapping) forward and backward
    time, for comparison."""

    segments: tuple[Segment, ...]
    budget_bytes: int | None
    batch_bytes: int
    step_time_s: float
    peak_bytes: int
    load_bytes_per_step: int
    stash_bytes_per_step: int
    compute_s: float
    model_bytes: int

    @property
    def cuts(self) -> tuple[tuple[int, int], ...]:
        return tuple((segment.start, segment.stop) for segment in self.segments)

    @property
    def description(self) -> str:
        budget = "no budget" if self.budget_bytes is None else f"a budget of {self.budget_bytes / MB:.2f} MB"
        head = (f"{len(self.segments)} segment{'s' if len(self.segments) != 1 else ''} of a "
                f"{self.model_bytes / MB:.2f} MB model under {budget}: peak {self.peak_bytes / MB:.2f} MB, "
                f"est. step {self.step_time_s * 1e3:.1f} ms (in-memory compute {self.compute_s * 1e3:.1f} ms), "
                f"{self.load_bytes_per_step / MB:.2f} MB loaded per step")
        lines = [head] + [
            f"  [{i}] {s.label}: {s.param_bytes / MB:.2f} MB, fwd {s.forward_s * 1e3:.1f} ms, "
            f"bwd {s.backward_s * 1e3:.1f} ms, load {s.load_s * 1e3:.2f} ms, window "
            f"{s.backward_bytes / MB:.2f} MB" for i, s in enumerate(self.segments)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.description

    def as_dict(self) -> dict[str, Any]:
        return {"segments": [s.as_dict() for s in self.segments], "budget_bytes": self.budget_bytes,
                "batch_bytes": self.batch_bytes, "step_time_s": self.step_time_s, "peak_bytes": self.peak_bytes,
                "load_bytes_per_step": self.load_bytes_per_step, "stash_bytes_per_step": self.stash_bytes_per_step,
                "compute_s": self.compute_s, "model_bytes": self.model_bytes, "description": self.description}


class _CostModel:
    """The byte and time formulas of the module docstring, for any layer range ``[a, b)``."""

    def __init__(self, profiles: Sequence[LayerProfile]):
        if not profiles:
            raise ValueError("no layers to plan")
        if [p.index for p in profiles] != list(range(len(profiles))):
            raise ValueError("profiles must be the layers 0 .. n-1 in order")
        self.profiles = list(profiles)
        self.n = len(profiles)
        self.batch = profiles[0].input_bytes

        def prefix(values):
            return [0, *itertools.accumulate(values)]

        self._params = prefix(p.param_bytes for p in profiles)
        self._saved = prefix(p.saved_bytes for p in profiles)
        self._outputs = prefix(p.activation_bytes for p in profiles)
        self._forward = prefix(p.forward_s for p in profiles)
        self._backward = prefix(p.backward_s for p in profiles)
        self._load = prefix(p.load_s for p in profiles)
        self._cache: dict[tuple[int, int], Segment] = {}

    def segment(self, a: int, b: int) -> Segment:
        key = (a, b)
        if key not in self._cache:
            ps = self.profiles[a:b]
            params = self._params[b] - self._params[a]
            inputs = 0 if a == 0 else self.profiles[a - 1].activation_bytes
            output = self.profiles[b - 1].activation_bytes
            saved = self._saved[b] - self._saved[a] + self._outputs[b - 1] - self._outputs[a]
            forward_workspace = max(p.saved_bytes for p in ps)
            backward_workspace = 2 * max(p.largest_saved_bytes for p in ps)
            self._cache[key] = Segment(
                start=a, stop=b, names=tuple(p.name for p in ps), param_bytes=params,
                forward_s=self._forward[b] - self._forward[a], backward_s=self._backward[b] - self._backward[a],
                load_s=self._load[b] - self._load[a],
                forward_bytes=params + inputs + output + forward_workspace,
                backward_bytes=2 * params + saved + 2 * inputs + 2 * output + backward_workspace,
                forward_workspace_bytes=forward_workspace, backward_workspace_bytes=backward_workspace)
        return self._cache[key]

    def pair_bytes(self, s: Segment, t: Segment) -> int:
        return self.batch + max(s.forward_bytes + t.param_bytes, t.backward_bytes + s.param_bytes)

    def single_bytes(self, s: Segment) -> int:
        return self.batch + s.backward_bytes

    @staticmethod
    def rest(s: Segment) -> float:
        """``R``: recompute, backward, gradient offload."""
        return s.forward_s + s.backward_s + s.load_s

    def pair_time(self, s: Segment, t: Segment, t_is_last: bool) -> float:
        forward = max(s.forward_s, t.load_s)
        return forward + (self.rest(t) if t_is_last else max(self.rest(t), s.load_s))

    def first_time(self, s: Segment) -> float:
        return s.load_s + self.rest(s)

    def plan(self, bounds: Sequence[tuple[int, int]], budget_bytes: int | None) -> SwapPlan:
        bounds = [(int(a), int(b)) for a, b in bounds]
        edges = [a for a, _ in bounds] + [bounds[-1][1]] if bounds else []
        if not bounds or edges[0] != 0 or edges[-1] != self.n or any(a >= b for a, b in itertools.pairwise(edges)) \
                or any(b != c for (_, b), (c, _) in itertools.pairwise(bounds)):
            raise ValueError(f"segments {bounds} do not cut layers 0 .. {self.n - 1} into contiguous runs")
        segments = tuple(self.segment(a, b) for a, b in bounds)
        k = len(segments)
        time_s = self.first_time(segments[0])
        # Every window alone (the first segment's backward has no prefetch beside it), then every pair.
        peak = max(self.single_bytes(s) for s in segments)
        for i, (s, t) in enumerate(itertools.pairwise(segments)):
            peak = max(peak, self.pair_bytes(s, t))
            time_s += self.pair_time(s, t, i + 1 == k - 1)
        loads = sum(s.param_bytes for s in segments) + sum(s.param_bytes for s in segments[: max(k - 2, 0)])
        stash = sum(self.profiles[s.start - 1].activation_bytes for s in segments[1: max(k - 1, 1)])
        return SwapPlan(segments=segments, budget_bytes=budget_bytes, batch_bytes=self.batch, step_time_s=time_s,
                        peak_bytes=peak, load_bytes_per_step=loads, stash_bytes_per_step=stash,
                        compute_s=self._forward[-1] + self._backward[-1], model_bytes=self._params[-1])

    def minimum_budget(self) -> tuple[int, tuple[tuple[int, int], ...]]:
        """The smallest peak of any segmentation, and one that has it (minimax dynamic programme)."""
        n = self.n
        best: dict[tuple[int, int], tuple[int, tuple[tuple[int, int], ...]]] = {}
        for b in range(1, n + 1):
            best[(0, b)] = (self.single_bytes(self.segment(0, b)), ((0, b),))
        for b in range(1, n + 1):
            for c in range(b + 1, n + 1):
                t = self.segment(b, c)
                options = [(max(best[(a, b)][0], self.pair_bytes(self.segment(a, b), t), self.single_bytes(t)),
                            best[(a, b)][1] + ((b, c),)) for a in range(b)]
                best[(b, c)] = min(options)
        whole = (self.single_bytes(self.segment(0, n)), ((0, n),))
        return min([whole] + [best[(a, n)] for a in range(1, n)])


def _infeasible(model: _CostModel, budget_bytes: int) -> SwapPlanError:
    least, bounds = model.minimum_budget()
    segments = [model.segment(a, b) for a, b in bounds]
    windows = [(model.single_bytes(s), f"{s.label} alone needs {model.single_bytes(s) / MB:.3f} MB "
                f"(parameters {s.param_bytes / MB:.3f} MB, their gradients, activations and the batch)")
               for s in segments]
    windows += [(model.pair_bytes(s, t), f"{s.label} and its neighbour {t.label} together need "
                 f"{model.pair_bytes(s, t) / MB:.3f} MB (parameters {s.param_bytes / MB:.3f} + "
                 f"{t.param_bytes / MB:.3f} MB, plus gradients, activations and the batch)")
                for s, t in itertools.pairwise(segments)]
    _, where = max(windows, key=lambda window: window[0])
    return SwapPlanError(
        f"no swap plan fits a device budget of {budget_bytes / MB:.3f} MB: even with the best cuts, {where}; "
        f"the smallest budget any plan fits is {least / MB:.3f} MB")


def minimum_budget(profiles: Sequence[LayerProfile]) -> int:
    """The smallest device budget (bytes) that some segmentation of these layers fits."""
    return _CostModel(profiles).minimum_budget()[0]


def evaluate_plan(profiles: Sequence[LayerProfile], segments: Sequence[tuple[int, int]],
                  budget_bytes: int | None = None) -> SwapPlan:
    """The plan with the given ``[start, stop)`` segments, estimated; raises :class:`SwapPlanError` if it does not
    fit ``budget_bytes`` (``None``: not checked, the plan's budget is its own peak)."""
    model = _CostModel(profiles)
    plan = model.plan(segments, budget_bytes)
    if budget_bytes is not None and plan.peak_bytes > budget_bytes:
        raise SwapPlanError(f"segments {list(segments)} need {plan.peak_bytes / MB:.3f} MB, more than the budget of "
                            f"{budget_bytes / MB:.3f} MB")
    if budget_bytes is None:
        plan = dataclasses.replace(plan, budget_bytes=plan.peak_bytes)
    return plan


def plan_segments(profiles: Sequence[LayerProfile], budget_bytes: int) -> SwapPlan:
    """The segmentation with the least estimated step time among those whose peak fits ``budget_bytes``
    (dynamic programming over cut points, ``O(n^3)``: the state is the last segment, a transition adds the next
    one and the terms that depend on the pair). A model that fits gives one segment. Raises
    :class:`SwapPlanError` (with the smallest budget that would do) when nothing fits."""
    model = _CostModel(profiles)
    budget_bytes = int(budget_bytes)
    n = model.n
    # best[(a, b)]: least time of a feasible segmentation of layers 0 .. b-1 ending with segment [a, b), counting
    # every term but those of the pair with the next segment.
    best: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}
    for b in range(1, n + 1):
        if model.single_bytes(model.segment(0, b)) <= budget_bytes:  # its backward window, alone at the end
            best[(0, b)] = (model.first_time(model.segment(0, b)), (0, b))
    for b in range(1, n):
        for c in range(b + 1, n + 1):
            t = model.segment(b, c)
            choice = None
            for a in range(b):
                if (a, b) not in best:
                    continue
                s = model.segment(a, b)
                if max(model.pair_bytes(s, t), model.single_bytes(t)) > budget_bytes:
                    continue
                time_s = best[(a, b)][0] + model.pair_time(s, t, c == n)
                if choice is None or time_s < choice[0]:
                    choice = (time_s, (*best[(a, b)][1], c))
            if choice is not None:
                best[(b, c)] = choice
    candidates = [best[(a, n)] for a in range(n) if (a, n) in best]
    if not candidates:
        raise _infeasible(model, budget_bytes)
    _, cuts = min(candidates, key=lambda candidate: (candidate[0], len(candidate[1])))
    return model.plan(list(itertools.pairwise(cuts)), budget_bytes)


def exhaustive_plan(profiles: Sequence[LayerProfile], budget_bytes: int) -> SwapPlan:
    """:func:`plan_segments` by trying every set of cut points (``2^(n-1)``; a check for small ``n``)."""
    model = _CostModel(profiles)
    n = model.n
    if n > 16:
        raise ValueError(f"{n} layers are too many to try every cut")
    best = None
    for mask in range(1 << (n - 1)):
        cuts = [0, *(i + 1 for i in range(n - 1) if mask >> i & 1), n]
        plan = model.plan(list(itertools.pairwise(cuts)), int(budget_bytes))
        if plan.peak_bytes <= budget_bytes and (best is None or plan.step_time_s < best.step_time_s):
            best = plan
    if best is None:
        raise _infeasible(model, int(budget_bytes))
    return best


# ------------------------------------------------------------------------------------------------- execution


@dataclass
class _Copy:
    """A segment's device copy: per layer, its tensors by name."""

    segment: int
    tensors: list[dict[str, torch.Tensor]]
    nbytes: int
    event: Any = None

    def all(self) -> Iterator[torch.Tensor]:
        for tensors in self.tensors:
            yield from tensors.values()


@dataclass
class _Counters:
    steps: int = 0
    forwards: int = 0
    loads: int = 0
    bytes_loaded: int = 0
    load_seconds: float = 0.0
    stall_seconds: float = 0.0
    compute_seconds: float = 0.0
    step_seconds: float = 0.0
    stash_bytes: int = 0
    gradient_bytes: int = 0


@dataclass
class _Step:
    started: float
    kind: str
    events: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0
    origin: Any = None  # CUDA: an event on the compute stream at the call's start; timed events are relative to it
    pending: list[tuple[int, str, Any, Any]] = field(default_factory=list)  # CUDA: (segment, kind, start, end)


class SwappedModel:
    """``layers`` trained with ``plan`` on ``device``, swapping segments over ``link`` within ``memory``.

    The master parameters are the layers' own (host) parameters -- pinned in place on CUDA -- and the device
    holds copies only during a call. :meth:`train_step` runs forward and backward and adds the gradients into the
    host parameters' ``.grad``; the caller's optimizer steps them. :meth:`forward` evaluates (no grad). The
    timeline of the last ``timeline_steps`` calls and the counters are in :meth:`timeline_summary`."""

    def __init__(self, layers: Sequence[nn.Module], plan: SwapPlan, *, device: torch.device | str = "cpu",
                 link: HostLink | None = None, memory: DeviceMemory | None = None, timeline: bool = True,
                 timeline_steps: int = 4):
        self.layers = list(layers)
        self.plan = plan
        if plan.cuts[-1][1] != len(self.layers):
            raise ValueError(f"the plan covers {plan.cuts[-1][1]} layers, not {len(self.layers)}")
        self.device = torch.device(device)
        self.link = link if link is not None else HostLink(self.device)
        if self.link.device != self.device:
            raise ValueError(f"the link goes to {self.link.device}, not {self.device}")
        self.memory = memory if memory is not None else DeviceMemory(plan.budget_bytes)
        self.record = bool(timeline)
        self.timelines: deque[_Step] = deque(maxlen=max(1, int(timeline_steps)))
        self.counters = _Counters()
        self._events_lock = threading.Lock()
        self._current: _Step | None = None
        self._host = [_layer_tensors(layer) for layer in self.layers]
        self._cuda = self.device.type == "cuda"
        if self._cuda:
            with torch.no_grad():
                for tensors in self._host:
                    for tensor in tensors.values():
                        if not tensor.is_pinned():
                            tensor.data = tensor.data.pin_memory()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swap-prefetch")
        # The host side of a step: gradients landing in host memory and the caller's per-segment optimizer
        # steps (``on_gradients``), in backward order, while the device computes the segments below.
        self._host_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swap-host")
        self._host_jobs: list[Future] = []
        self._grad_buffers: dict[int, torch.Tensor] = {}  # CUDA: each parameter's pinned gradient buffer
        self._landing: set[int] = set()  # CUDA: parameters whose gradient copy this step has issued
        self._released: Any = None  # CUDA: an event after the compute that used the segment released last
        # A parameter's gradient is complete after the backward of the lowest segment that uses it.
        lowest: dict[int, int] = {}
        by_id: dict[int, nn.Parameter] = {}
        for index, (a, b) in enumerate(plan.cuts):
            for layer in self.layers[a:b]:
                for parameter in layer.parameters():
                    lowest[id(parameter)] = min(lowest.get(id(parameter), index), index)
                    by_id[id(parameter)] = parameter
        self._final: list[list[nn.Parameter]] = [[] for _ in plan.cuts]
        for key, index in lowest.items():
            self._final[index].append(by_id[key])

    # ---- housekeeping

    def parameters(self) -> Iterator[nn.Parameter]:
        seen: set[int] = set()
        for layer in self.layers:
            for parameter in layer.parameters():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    yield parameter

    def segment_parameters(self, segment: int) -> list[nn.Parameter]:
        """The parameters whose gradients are complete once ``segment``'s backward is done (those it is the
        lowest segment to use): what ``on_gradients`` is handed for it."""
        return list(self._final[segment])

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._host_pool.shutdown(wait=True)
        self.link.clear()

    def __enter__(self) -> SwappedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _event(self, segment: int, kind: str, start: Any, end: Any) -> None:
        """Record an event of the current call: ``start`` and ``end`` are ``perf_counter`` times, or (CUDA) events
        recorded on a stream, resolved when the call ends (:meth:`_resolve`)."""
        step = self._current
        if step is None:
            return
        if not isinstance(start, float):
            with self._events_lock:
                step.pending.append((segment, kind, start, end))
            return
        if kind in COMPUTE_KINDS:
            self.counters.compute_seconds += end - start
        if self.record:
            with self._events_lock:
                step.events.append({"segment": segment, "kind": kind, "start": start - step.started,
                                    "end": end - step.started})

    def _mark(self) -> Any:
        """Now: ``perf_counter`` on CPU; on CUDA an event on the compute stream (no synchronisation: the host
        runs ahead of the device and the copies overlap the compute)."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def _resolve(self, step: _Step) -> None:
        """CUDA, after the call's last synchronisation: turn the recorded events into times and counters."""
        with self._events_lock:
            pending, step.pending = step.pending, []
        for segment, kind, start, end in pending:
            begin = step.origin.elapsed_time(start) / 1e3
            finish = step.origin.elapsed_time(end) / 1e3
            if kind in COMPUTE_KINDS:
                self.counters.compute_seconds += finish - begin
            elif kind == "load":
                self.counters.load_seconds += finish - begin
            if self.record:
                step.events.append({"segment": segment, "kind": kind, "start": begin, "end": finish})
        step.events.sort(key=lambda event: event["start"])

    @property
    def timeline(self) -> list[dict[str, Any]]:
        """The events of the last call: ``segment``, ``kind`` (one of :data:`EVENT_KINDS`), ``start``, ``end``
        (seconds since the call began)."""
        return list(self.timelines[-1].events) if self.timelines else []

    # ---- loads

    def _load(self, segment: int, after: Any = None) -> _Copy:
        a, b = self.plan.cuts[segment]
        host = self._host[a:b]
        flat = [t for tensors in host for t in tensors.values()]
        nbytes = sum(_nbytes(t) for t in flat)
        start: Any = time.perf_counter()
        if self._cuda:  # the copy's own time on the side stream, not the moment it was issued
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.link.stream)
        self.memory.allocate(nbytes, "parameters")
        try:
            copies, event = self.link.load([t.detach() for t in flat], "parameters", after=[after])
        except BaseException:
            self.memory.free(nbytes, "parameters")
            raise
        it = iter(copies)
        tensors = [{name: next(it).requires_grad_(t.requires_grad) for name, t in layer.items()} for layer in host]
        self.counters.loads += 1
        self.counters.bytes_loaded += nbytes
        if self._cuda:
            self._event(segment, "load", start, event)
        else:
            end = time.perf_counter()
            self.counters.load_seconds += end - start
            self._event(segment, "load", start, end)
        return _Copy(segment, tensors, nbytes, event)

    def _prefetch(self, segment: int) -> Future:
        # CUDA: the copy starts on the device once the segment released last (two back) is computed, so at most
        # two segments' parameters are live on the device, as planned, however far the host runs ahead.
        return self._pool.submit(self._load, segment, self._released)

    def _wait(self, pending: Future) -> _Copy:
        start = time.perf_counter()
        copy = pending.result()
        self.counters.stall_seconds += time.perf_counter() - start
        self.link.wait(list(copy.all()), copy.event)
        return copy

    def _release(self, copy: _Copy | None) -> None:
        if copy is not None and self._cuda:
            self._released = torch.cuda.Event()
            self._released.record(torch.cuda.current_stream(self.device))
        if copy is not None:
            self.memory.free(copy.nbytes, "parameters")
            self.link.recycle(list(copy.all()))
            copy.tensors.clear()

    # ---- windows

    def _run(self, copy: _Copy, x: torch.Tensor) -> torch.Tensor:
        a, b = self.plan.cuts[copy.segment]
        for layer, tensors in zip(self.layers[a:b], copy.tensors, strict=True):
            x = functional_call(layer, tensors, (x,))
        return x

    def _forward_window(self, copy: _Copy, x: torch.Tensor) -> torch.Tensor:
        segment = self.plan.segments[copy.segment]
        held = _Held(self.memory)
        start = self._mark()
        try:
            held.take(segment.forward_workspace_bytes, "workspace")
            if copy.segment > 0:
                held.take(_nbytes(x), "activations")
            with torch.no_grad():
                y = self._run(copy, x)
            held.take(_nbytes(y), "activations")
        finally:
            held.release()
        self._event(copy.segment, "forward", start, self._mark())
        return y

    def _backward_window(self, copy: _Copy, x: torch.Tensor, *, exclude: set[int],
                         grad_output: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                         on_gradients: Callable[[int, list[nn.Parameter]], None] | None = None,
                         ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Forward with grad (a recompute, or the last segment's first forward with the loss), backward, gradients
        into the host parameters. Returns the loss (last segment; a device tensor) and the gradient of the
        input."""
        index = copy.segment
        segment = self.plan.segments[index]
        held = _Held(self.memory)
        loss_value = None
        try:
            held.take(sum(_nbytes(t) for t in copy.all() if t.requires_grad), "gradients")
            held.take(segment.backward_workspace_bytes, "workspace")
            if index > 0:
                held.take(_nbytes(x), "activations")
            if grad_output is not None:
                held.take(_nbytes(grad_output), "activations")
            x = x.detach().requires_grad_(x.is_floating_point())
            counter = _SavedCounter(exclude | _storages(copy.all()) | _storages([x]),
                                    on_new=lambda nbytes: held.take(nbytes, "saved"))
            start = self._mark()
            with counter.hooks(), torch.enable_grad():
                y = self._run(copy, x)
                held.take(_nbytes(y), "activations")
                loss = loss_fn(y, targets) if loss_fn is not None else None
            middle = self._mark()
            self._event(index, "forward" if loss_fn is not None else "recompute", start, middle)
            if loss is not None:
                held.take(_nbytes(y), "activations")  # the loss's gradient of the output
                loss.backward()
                loss_value = loss.detach()
            else:
                torch.autograd.backward(y, grad_output)
            del y, loss
            grad_input = x.grad if x.requires_grad else None
            if grad_input is not None:
                held.take(_nbytes(grad_input), "activations")
            end = self._mark()
            self._event(index, "backward", middle, end)
            if self._cuda:
                self._offload_gradients_async(copy, on_gradients)
            else:
                started = time.perf_counter()
                self._offload_gradients(copy)
                self._event(index, "offload", started, time.perf_counter())
                if on_gradients is not None:
                    params = self._final[index]
                    self._host_jobs.append(self._host_pool.submit(on_gradients, index, params))
        finally:
            held.release()
        return loss_value, grad_input

    def _offload_gradients(self, copy: _Copy) -> None:
        a, _ = self.plan.cuts[copy.segment]
        with torch.no_grad():
            for host, tensors in zip(self._host[a:], copy.tensors, strict=False):
                for name, tensor in tensors.items():
                    if tensor.grad is None:
                        continue
                    target = host[name]
                    target.grad = self.link.accumulate(target.grad, tensor.grad)
                    self.counters.gradient_bytes += _nbytes(tensor.grad)
                    tensor.grad = None

    def _grad_buffer(self, parameter: torch.Tensor) -> torch.Tensor:
        buffer = self._grad_buffers.get(id(parameter))
        if buffer is None or buffer.shape != parameter.shape or buffer.dtype != parameter.dtype:
            buffer = torch.empty(parameter.shape, dtype=parameter.dtype, pin_memory=True)
            self._grad_buffers[id(parameter)] = buffer
        return buffer

    def _offload_gradients_async(self, copy: _Copy,
                                 on_gradients: Callable[[int, list[nn.Parameter]], None] | None) -> None:
        """CUDA: issue the copies of this segment's device gradients into pinned host buffers on the offload
        stream (they overlap the backward of the segments below) and queue, on the host thread, their landing
        in the host parameters' ``.grad`` (a gradient that is ``None`` becomes the buffer itself; one that
        holds values has the buffer added) followed by ``on_gradients`` for the parameters now complete."""
        a, _ = self.plan.cuts[copy.segment]
        pairs, direct, added = [], [], []
        with torch.no_grad():
            for host, tensors in zip(self._host[a:], copy.tensors, strict=False):
                for name, tensor in tensors.items():
                    if tensor.grad is None:
                        continue
                    target = host[name]
                    if target.grad is None and id(target) not in self._landing:
                        buffer = self._grad_buffer(target)
                        direct.append((target, buffer))
                        self._landing.add(id(target))
                    else:  # a gradient already there, or one landing from another segment this step: add
                        buffer = torch.empty(target.shape, dtype=target.dtype, pin_memory=True)
                        added.append((target, buffer))
                    pairs.append((buffer, tensor.grad))
                    self.counters.gradient_bytes += _nbytes(tensor.grad)
                    tensor.grad = None
        event = self.link.offload_gradients(pairs) if pairs else None
        index = copy.segment

        def land() -> None:
            if event is not None:
                event.synchronize()
            with torch.no_grad():
                for target, buffer in direct:
                    target.grad = buffer
                for target, buffer in added:
                    target.grad.add_(buffer)
            if on_gradients is not None:
                on_gradients(index, self._final[index])

        self._host_jobs.append(self._host_pool.submit(land))

    def _join_host(self) -> None:
        """Wait for the host jobs of this call (all of them, then raise the first error)."""
        jobs, self._host_jobs = self._host_jobs, []
        error = None
        for job in jobs:
            try:
                job.result()
            except BaseException as caught:  # noqa: BLE001 - re-raised below, after the others finished
                error = error or caught
        self._landing.clear()
        if error is not None:
            raise error

    # ---- calls

    @contextlib.contextmanager
    def _call(self, kind: str, batch: Sequence[torch.Tensor]):
        step = _Step(time.perf_counter(), kind)
        if self._cuda:
            step.origin = self._mark()
        self._current = step
        held = _Held(self.memory)
        state: dict[str, Any] = {"pending": None, "copies": {}}
        try:
            moved, event = self.link.load(list(batch), "batch")
            self.link.wait(moved, event)
            held.take(sum(_nbytes(t) for t in moved), "batch")
            yield moved, state
        finally:
            pending = state["pending"]
            if pending is not None:
                with contextlib.suppress(BaseException):
                    self._release(pending.result())
            for copy in state["copies"].values():
                self._release(copy)
            held.release()
            try:
                self._join_host()
            finally:
                self.link.settle()  # CUDA: every copy done, their times counted
                if self._cuda:
                    self._resolve(step)
            step.duration_s = time.perf_counter() - step.started
            self.counters.step_seconds += step.duration_s
            self._current = None
            if self.record:
                self.timelines.append(step)

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   on_gradients: Callable[[int, list[nn.Parameter]], None] | None = None) -> float:
        """One forward and backward of ``loss_fn(model(inputs), targets)`` with swapping; the gradients are added
        into the host parameters' ``.grad``. Returns the loss.

        ``on_gradients(segment, parameters)``, if given, is called on the host thread for each segment in
        backward order, as soon as the gradients of ``parameters`` (:meth:`segment_parameters`) are complete in
        host memory -- a per-segment optimizer step there overlaps the backward of the segments below (ZeRO-Offload
        style). Every call has returned when this does. On CUDA a gradient that was ``None`` becomes a pinned
        buffer the model reuses at the next step: zero gradients with ``set_to_none=True`` (or accumulate)."""
        k = len(self.plan.segments)
        with self._call("train", [inputs, targets]) as ((inputs, targets), state):
            copies: dict[int, _Copy] = state["copies"]
            batch = _storages([inputs, targets])
            stash: dict[int, tuple[torch.Tensor, Any]] = {}
            state["pending"] = self._prefetch(0)
            x = inputs
            for s in range(k - 1):
                copies[s] = self._wait(state["pending"])
                state["pending"] = self._prefetch(s + 1)
                x = self._forward_window(copies[s], x)
                if s + 1 <= k - 2:  # the input of a segment that will be recomputed (host copy, its CUDA event)
                    stash[s + 1] = self.link.offload(x, "activations")
                    self.counters.stash_bytes += _nbytes(x)
                if s != k - 2:  # the second-to-last stays: backward needs it next
                    self._release(copies.pop(s))
            copies[k - 1] = self._wait(state["pending"])
            state["pending"] = None
            loss, gradient = self._backward_window(copies[k - 1], x, exclude=batch, targets=targets,
                                                   loss_fn=loss_fn, on_gradients=on_gradients)
            self._release(copies.pop(k - 1))
            for s in range(k - 2, -1, -1):
                if s not in copies:
                    copies[s] = self._wait(state["pending"])
                    state["pending"] = None
                if s == 0:
                    x = inputs
                else:
                    host, offloaded = stash.pop(s)
                    (x,), event = self.link.load([host], "activations", after=[offloaded])
                    self.link.wait([x], event)
                    self.counters.stash_bytes += _nbytes(x)
                    state["pending"] = self._prefetch(s - 1)
                _, gradient = self._backward_window(copies[s], x, exclude=batch, grad_output=gradient,
                                                    on_gradients=on_gradients)
                self._release(copies.pop(s))
            self.counters.steps += 1
        return float(loss)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The model's output for ``inputs`` (no grad), computed segment by segment with prefetching."""
        k = len(self.plan.segments)
        with self._call("forward", [inputs]) as ((x,), state):
            copies: dict[int, _Copy] = state["copies"]
            state["pending"] = self._prefetch(0)
            for s in range(k):
                copies[s] = self._wait(state["pending"])
                state["pending"] = self._prefetch(s + 1) if s + 1 < k else None
                x = self._forward_window(copies[s], x)
                self._release(copies.pop(s))
            self.counters.forwards += 1
        return x

    __call__ = forward

    # ---- reporting

    def timeline_summary(self) -> dict[str, Any]:
        """A JSON-able summary for the swapping-timeline panel: the plan, the counters, the memory, the link and
        the last calls' events (with how long loads overlapped computation)."""
        steps = []
        for step in self.timelines:
            loads = [e for e in step.events if e["kind"] == "load"]
            computes = [e for e in step.events if e["kind"] in COMPUTE_KINDS]
            steps.append({"kind": step.kind, "duration_s": step.duration_s, "events": list(step.events),
                          "overlap_s": _overlap(loads, computes)})
        counters = asdict(self.counters)
        counters["peak_device_bytes"] = self.memory.peak
        return {"device": str(self.device), "plan": self.plan.as_dict(), "counters": counters,
                "memory": self.memory.as_dict(), "link": self.link.as_dict(), "steps": steps}


def _overlap(loads: Sequence[dict[str, Any]], computes: Sequence[dict[str, Any]]) -> float:
    """Seconds during which some load and some computation both ran."""
    total = 0.0
    for load in loads:
        for compute in computes:
            total += max(0.0, min(load["end"], compute["end"]) - max(load["start"], compute["start"]))
    return total


def overlapping(events: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The (load, computation) pairs of a timeline whose intervals intersect."""
    loads = [e for e in events if e["kind"] == "load"]
    computes = [e for e in events if e["kind"] in COMPUTE_KINDS]
    return [(load, compute) for load in loads for compute in computes
            if min(load["end"], compute["end"]) > max(load["start"], compute["start"])]


# ------------------------------------------------------------------------------------------------- benchmark

# The default benchmark model: "large" (width 384) made 16 blocks deep. Stock "large" (8 blocks) cannot be
# swapped in a quarter of its parameter bytes at all -- two of its blocks alone are 24.8 % of it -- and neither can
# "medium"; a deeper model makes each block a smaller share. Batch 2 windows: at this width the activations a
# block saves for backward grow past a block's parameters beyond a few hundred tokens.
BENCH = {"config": ("large", {"layers": 16}), "batch": 2, "steps": 10}
QUICK = {"config": ("medium", {"layers": 16, "context": 32}), "batch": 2, "steps": 8}


def _config(config: Any):
    from components.decentral.model import ModelConfig

    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, str):
        return ModelConfig.named(config)
    name, overrides = config
    return ModelConfig.named(name, **overrides)


def throughput(config: Any = None, *, budget_fraction: float = 0.25, batch: int | None = None,
               steps: int | None = None, link_bytes_per_s: float | None = DEFAULT_LINK_BYTES_PER_S,
               device: torch.device | str = "cpu", quick: bool = False, seed: int = 0, lr: float = 1e-3,
               threads: int | None = None, overlap_optimizer: bool | None = None) -> dict[str, Any]:
    """Tokens per second of in-memory training (the plain model, no budget) and of swapped training with a device
    budget of ``budget_fraction`` x the model's parameter bytes, same model, same batches, same Adam step on the
    host parameters, measured in this process step by step, alternating (step ``i`` of one, then of the other,
    the order flipped every step), after a warm-up step each. The rates are from the **median** step time (robust
    to the spikes of a shared machine; ``mean_*`` from the total). Also: the plan, the swap counters, the peak
    device bytes, and both runs' losses (they train identically).
    Defaults: :data:`BENCH` (``quick``: :data:`QUICK`). On CUDA the in-memory baseline is the model on the GPU with
    its optimizer there; the swapped run steps the host parameters on the CPU.

    ``threads``: torch's intra-op threads for both runs (restored afterwards; ``None``: as they are). On CPU the
    prefetch thread's copies -- a GPU's copy engine -- take a core from the compute, and on a shared machine
    OpenMP teams as wide as the cores stall whenever one of their threads is descheduled: with one thread per core
    the measurements scatter widely (ratios from 0.2 to 1.9 on a loaded 2-core machine); ``threads=1`` leaves the
    second core to the copies and gives steady figures.

    ``overlap_optimizer`` (default: on CUDA only): the swapped run steps each segment's parameters with its own
    Adam (the same update: Adam is per parameter) on the host thread as soon as that segment's gradients are in
    host memory (``SwappedModel.train_step``'s ``on_gradients``), overlapping the backward of the segments
    below, instead of one Adam step over the whole model after the step."""
    overlap = torch.device(device).type == "cuda" if overlap_optimizer is None else bool(overlap_optimizer)
    if threads is None:
        return _throughput(config, budget_fraction=budget_fraction, batch=batch, steps=steps,
                           link_bytes_per_s=link_bytes_per_s, device=device, quick=quick, seed=seed, lr=lr,
                           overlap=overlap)
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        result = _throughput(config, budget_fraction=budget_fraction, batch=batch, steps=steps,
                             link_bytes_per_s=link_bytes_per_s, device=device, quick=quick, seed=seed, lr=lr,
                             overlap=overlap)
    finally:
        torch.set_num_threads(before)
    return {**result, "threads": int(threads)}


def _throughput(config: Any, *, budget_fraction: float, batch: int | None, steps: int | None,
                link_bytes_per_s: float | None, device: torch.device | str, quick: bool, seed: int,
                lr: float, overlap: bool = False) -> dict[str, Any]:
    from components.decentral.model import Corpus, build_model, lm_loss, model_layers, parameter_bytes

    preset = QUICK if quick else BENCH
    config = _config(preset["config"] if config is None else config)
    batch = int(preset["batch"] if batch is None else batch)
    steps = int(preset["steps"] if steps is None else steps)
    device = torch.device(device)
    corpus = Corpus(seed, context=config.context)
    batches = [corpus.batch(0, step, batch) for step in range(steps + 1)]  # batch 0 warms up

    plain = build_model(config, seed).to(device)
    plain_optimizer = torch.optim.Adam(plain.parameters(), lr=lr)
    host_model = build_model(config, seed)
    layers = model_layers(host_model)
    model_bytes = parameter_bytes(host_model)
    budget = int(budget_fraction * model_bytes)
    link = HostLink(device, link_bytes_per_s)
    sample, sample_targets = batches[0]
    profiles = profile_layers(layers, sample, device=device, link=link, targets=sample_targets, loss_fn=lm_loss)
    plan = plan_segments(profiles, budget)
    memory = DeviceMemory(budget)
    swapped_optimizer = torch.optim.Adam(host_model.parameters(), lr=lr)

    def plain_step(inputs, targets):
        plain_optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(plain(inputs.to(device)), targets.to(device))
        loss.backward()
        plain_optimizer.step()
        _synchronize(device)
        return float(loss.detach())

    with SwappedModel(layers, plan, device=device, link=link, memory=memory, timeline=True) as swapped:
        if overlap:  # one Adam per segment, stepped on the host thread as its gradients land
            del swapped_optimizer
            segment_optimizers = {index: torch.optim.Adam(swapped.segment_parameters(index), lr=lr)
                                  for index in range(len(plan.segments)) if swapped.segment_parameters(index)}

            def step_segment(index: int, parameters: list[nn.Parameter]) -> None:
                if index in segment_optimizers:
                    segment_optimizers[index].step()
                    segment_optimizers[index].zero_grad(set_to_none=True)

            def swapped_step(inputs, targets):
                return swapped.train_step(inputs, targets, lm_loss, on_gradients=step_segment)
        else:
            def swapped_step(inputs, targets):
                swapped_optimizer.zero_grad(set_to_none=True)
                loss = swapped.train_step(inputs, targets, lm_loss)
                swapped_optimizer.step()
                return loss

        plain_step(*batches[0])  # warm-up (allocator, kernels); the measured steps start from step 1
        swapped_step(*batches[0])
        link.reset_counters()
        swapped.counters = _Counters()
        losses: dict[str, list[float]] = {"in_memory": [], "swapped": []}
        times: dict[str, list[float]] = {"in_memory": [], "swapped": []}
        runs = (("in_memory", plain_step), ("swapped", swapped_step))
        for i in range(1, steps + 1):
            for name, step in runs if i % 2 else runs[::-1]:
                start = time.perf_counter()
                losses[name].append(step(*batches[i]))
                times[name].append(time.perf_counter() - start)
        summary = swapped.timeline_summary()
    tokens = batch * config.context
    rate = {name: tokens / statistics.median(values) for name, values in times.items()}
    mean = {name: tokens * steps / sum(values) for name, values in times.items()}
    return {
        "config": config.as_dict(), "device": str(device), "threads": torch.get_num_threads(), "batch": batch,
        "steps": steps, "overlap_optimizer": overlap, "tokens_per_step":
        tokens, "model_bytes": model_bytes, "budget_bytes": budget, "budget_fraction": budget_fraction,
        "link_bytes_per_s": link.bytes_per_s, "in_memory_tokens_per_s": rate["in_memory"],
        "swapped_tokens_per_s": rate["swapped"], "ratio": rate["swapped"] / rate["in_memory"],
        "mean_in_memory_tokens_per_s": mean["in_memory"], "mean_swapped_tokens_per_s": mean["swapped"],
        "mean_ratio": mean["swapped"] / mean["in_memory"], "step_seconds": times,
        "seconds": {name: sum(values) for name, values in times.items()},
        "plan": plan.as_dict(), "counters": summary["counters"], "memory": summary["memory"],
        "link": summary["link"], "final_losses": {k: v[-1] for k, v in losses.items()},
        "max_loss_difference": max(abs(a - b) for a, b in zip(losses["in_memory"], losses["swapped"], strict=True)),
        "profiles": [p.as_dict() for p in profiles],
    }


if __name__ == "__main__":  # pragma: no cover - python -m components.decentral.swap [--device cuda] [--quick]
    import argparse
    import json

    parser = argparse.ArgumentParser(description="swapped against in-memory training of a model 4x the budget")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--overlap-optimizer", choices=("auto", "yes", "no"), default="auto")
    args = parser.parse_args()
    result = throughput(quick=args.quick, threads=args.threads, device=args.device, steps=args.steps,
                        overlap_optimizer=None if args.overlap_optimizer == "auto" else args.overlap_optimizer == "yes")
    print(result["plan"]["description"])
    keys = ("device", "overlap_optimizer", "in_memory_tokens_per_s", "swapped_tokens_per_s", "ratio", "mean_ratio",
            "seconds", "final_losses", "max_loss_difference", "counters", "memory", "link")
    print(json.dumps({k: result[k] for k in keys}, indent=1))
