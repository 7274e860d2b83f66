"""A served model on a device executor, behind a gRPC ``Inference`` service.

Three layers, so the device's GPU-sharing service and the child-process component share everything:

- :class:`ServingEndpoint` is the domain object: it checks a request against the model's contract and runs
  it through :meth:`DeviceExecutor.infer <components.gpushare.executor.DeviceExecutor.infer>` within its
  deadline, raising a :class:`ServingFault` (each names its gRPC status) when it cannot answer.
- :class:`InferenceServicer` is the thin gRPC adapter: decode the message, call the endpoint, map faults to
  status codes. Every call gets a reply or a status.
- :func:`start_serving` registers the model in an executor, starts the gRPC server and returns a
  :class:`ServingHandle` (address, stats, stop).

Requests run on the executor's execution thread, before any training work: a co-located staged training
job yields to them at its next stage boundary, or serves them in place between two of its operators. A
request whose caller has gone (deadline passed, call cancelled) is skipped when its turn comes instead of
spending device time on an answer nobody reads.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import torch
from torch import nn

from components.gpushare.executor import DeviceExecutor, ExecutorClosed
from components.gpushare.lanes import Admission, MemoryRequest
from components.gpushare.stages import InferenceSession
from components.runtime.shared.stats import percentile
from components.runtime.shared.tokens import TokenGate, bearer
from components.serving import serving_pb2, serving_pb2_grpc
from components.serving.bind import InsecureBindError, check_bind_host
from components.serving.model import ServedModel
from components.serving.orloj import BatchPolicy, EdfBatcher, FifoBatcher, OrlojBatcher, Pending

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 2**20
MAX_DIMS = 8  # most dimensions a request tensor may have (the built-in models take 2 or 4)
MAX_DETAILS = 1000  # longest status message sent back (one line; gRPC carries it in a header)
DEFAULT_MAX_QUEUE = 128  # requests an endpoint holds waiting for the device; more is RESOURCE_EXHAUSTED
RPC_HEADROOM = 8  # concurrent RPCs beyond the queue: Describe calls, and the batch on the device
DEFAULT_MAX_CONCURRENT_RPCS = DEFAULT_MAX_QUEUE + RPC_HEADROOM
LENGTH_BUCKETS = 8  # a variable-length model's requests are bucketed by length into this many buckets
LATENCY_WINDOW = 1000  # latest successful requests the percentiles are taken over
# gRPC reports "no deadline" as a remaining time of about 2**63 ns rather than None.
NO_DEADLINE_S = 10**7
PROFILE_ROWS = 16  # the larger of the two batches endpoint_memory() measures
STOP_FLUSH_S = 0.5  # after stop() answered every call: time for the replies to go out
REQUEST_READ_S = 10.0  # a call's request message must arrive within this (or its deadline), else it is cancelled
MAX_METADATA_BYTES = 16 * 2**10  # a call's headers (a token is ~60 bytes); more is RESOURCE_EXHAUSTED
# Explicit server limits (gRPC's defaults are implicit and change between releases): message sizes each way, the
# headers, keepalive (ping a client every 60 s while it has calls, drop it after 20 s without an answer), and ping
# abuse: a client pinging more often than every 5 minutes without data gets GOAWAY after 2 strikes.
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 300_000),
    ("grpc.http2.max_ping_strikes", 2),
    # gRPC sets SO_REUSEPORT by default, and then a second server on a busy port binds silently.
    ("grpc.so_reuseport", 0),
]

# Wire dtypes: raw little-endian, whatever the host's byte order.
WIRE_DTYPES: dict[str, tuple[np.dtype, torch.dtype]] = {
    "float32": (np.dtype("<f4"), torch.float32),
    "int64": (np.dtype("<i8"), torch.int64),
}


# -- faults: what the endpoint cannot answer, each with its gRPC status --------------------------------------
class ServingFault(Exception):
    """A request the endpoint cannot answer; ``status`` names its :class:`grpc.StatusCode`."""

    status = "INTERNAL"


class InvalidRequest(ServingFault, ValueError):
    status = "INVALID_ARGUMENT"


class RequestTimedOut(ServingFault, TimeoutError):
    status = "DEADLINE_EXCEEDED"


class EndpointUnavailable(ServingFault):
    status = "UNAVAILABLE"


class ModelFailed(ServingFault):
    status = "INTERNAL"


class CallCancelled(ServingFault):
    status = "CANCELLED"


class QueueFull(ServingFault):
    status = "RESOURCE_EXHAUSTED"


class AdmissionRejected(ValueError):
    """The executor can never fit the model next to its budget: nothing was started."""


# How close to its deadline a call that gRPC ends counts as timed out rather than cancelled (clock rounding).
DEADLINE_SLACK_S = 0.05


class _Abandoned(Exception):
    """Raised on the execution thread instead of running a request whose caller is gone."""


@dataclass(eq=False)  # identity: calls in flight are kept in a set
class _Call:
    """One request: its inputs and how long anyone waits for them. The endpoint's :class:`Dispatcher` queues
    it and runs it in a :class:`_Batch`.

    The gRPC handler waits on ``answer``, not on the executor's future: :meth:`ServingEndpoint.abandon` (or the
    batching policy, for a request that cannot make its deadline) can then answer a call that is still queued.
    """

    inputs: torch.Tensor
    deadline: float  # time.monotonic()
    abandoned: threading.Event = field(default_factory=threading.Event)
    answer: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def caller_gone(self) -> None:
        """The caller stopped listening: answer now, and skip the request if it is still queued. (Also called
        after a normal reply, when it changes nothing.) gRPC ends a call whose deadline passed the same way as
        one its client cancelled; the deadline tells them apart (on a busy machine gRPC's cancellation can
        come before the endpoint's own timer)."""
        self.abandoned.set()
        if time.monotonic() >= self.deadline - DEADLINE_SLACK_S:
            self.settle(None, RequestTimedOut("the deadline passed before the device answered"))
        else:
            self.settle(None, CallCancelled("the call was cancelled by the client"))

    def settle(self, result: Any, error: BaseException | None = None) -> None:
        try:
            if error is not None:
                self.answer.set_exception(error)
            else:
                self.answer.set_result(result)
        except concurrent.futures.InvalidStateError:
            pass  # answered already (abandoned by a stop)


@dataclass(frozen=True)
class Batching:
    """How an endpoint batches its queued requests (the serve spec's ``batching``).

    ``policy``: ``orloj`` (deadline-aware, :class:`~components.serving.orloj.OrlojBatcher`), ``fifo`` (Triton's
    dynamic batcher: arrival order, ``max_queue_delay_s``) or ``edf`` (earliest deadline first, mean estimate).
    ``max_batch`` requests at most run as one forward pass; ``max_queue`` wait at most (more is
    ``RESOURCE_EXHAUSTED``). ``max_batch: 1`` serves each request on its own.
    """

    policy: str = "orloj"
    max_batch: int = 8
    max_queue_delay_s: float = 0.002
    max_queue: int = DEFAULT_MAX_QUEUE
    # What an answer needs to get back to its caller after the forward pass (reply encoding, gRPC): the policies
    # plan for each request's deadline less this. 0 by default: on loopback a margin cost more requests (dropped as
    # hopeless that would have made it) than it saved.
    reply_margin_s: float = 0.0
    # Orloj only (Irina's preemption): a running batch of a staged model (tiny-gpt, moe-gpt) lets requests that would
    # miss their deadlines waiting for it run between two of its layers, when its own requests can afford it.
    preempt: bool = True

    POLICIES = ("orloj", "fifo", "edf")

    def __post_init__(self):
        if self.policy not in self.POLICIES:
            raise ValueError(f"unknown batching policy {self.policy!r}: use one of {', '.join(self.POLICIES)}")
        if self.max_batch < 1 or self.max_queue < 1 or self.max_queue_delay_s < 0:
            raise ValueError(f"max_batch and max_queue must be at least 1 and max_queue_delay_s not negative: {self}")

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> Batching:
        spec = spec or {}
        return cls(policy=spec.get("policy", cls.policy), max_batch=int(spec.get("max_batch", cls.max_batch)),
                   max_queue_delay_s=float(spec.get("max_queue_delay_ms", cls.max_queue_delay_s * 1000)) / 1000,
                   max_queue=int(spec.get("max_queue", cls.max_queue)), preempt=bool(spec.get("preempt", cls.preempt)))

    def make_policy(self) -> BatchPolicy:
        if self.policy == "fifo":
            return FifoBatcher(self.max_batch, self.max_queue_delay_s)
        if self.policy == "edf":
            return EdfBatcher(self.max_batch)
        return OrlojBatcher(self.max_batch)


@dataclass(eq=False)
class _Batch:
    """What travels through :meth:`DeviceExecutor.infer`: queued calls to run as one forward pass.

    The execution thread fills in ``ran`` (the calls still waited for when the batch's turn came: the others
    are skipped) and ``seconds``, the forward pass's own time (what the batching policy learns from)."""

    calls: list[_Call]
    pending: list[Pending] = field(default_factory=list)
    ran: list[_Call] = field(default_factory=list)
    seconds: float | None = None
    nested: bool = False  # run inside another batch (preempting it): not preempted in turn


class ServedSession(InferenceSession):
    """The executor session of an endpoint: runs a :class:`_Batch` as one forward pass and splits the answer.

    Calls whose caller has gone (abandoned, or past their deadline) are left out when the batch's turn comes;
    a batch with none left raises :class:`_Abandoned` instead of running. Rows of a variable-length model are
    right-padded to the batch's longest and each answer cut back to its own length. Outputs are on the CPU.
    """

    def __init__(self, served: ServedModel, placement: Any = None):
        super().__init__(served.module, sample=served.sample)
        self.served = served
        # Set by the endpoint's Dispatcher when it preempts (Batching.preempt): ``urgent(batch, fraction done)``
        # gives a batch to run now between two layers, ``deliver(batch, answers)`` answers it.
        self.urgent: Callable[[_Batch, float], _Batch | None] | None = None
        self.deliver: Callable[[_Batch, list[torch.Tensor]], None] | None = None
        stages = getattr(served.module, "stages", None)
        self.stages: list[nn.Module] = list(stages()) if callable(stages) else []
        self.preemptions = 0
        self.placement = placement  # an emoe.ExpertPlacement: the model's experts, kept off the device
        self.perplexity = None
        if placement is not None:
            from components.serving.emoe import Perplexity

            self.perplexity = Perplexity()

    def start(self, device) -> None:
        super().start(device)
        if self.placement is not None:
            self.placement.to_device(self.device)

    def run(self, batch: _Batch) -> list[torch.Tensor]:
        now = time.monotonic()
        live = [call for call in batch.calls if not call.abandoned.is_set() and now < call.deadline]
        if not live:
            raise _Abandoned("the deadline passed before the request's turn")
        if self.placement is not None:
            self.placement.prepare()  # the predicted experts on the device before the batch
        served = self.served
        lengths = [served.length(call.inputs) for call in live]
        if len(live) == 1:
            inputs = live[0].inputs
        else:
            longest = max(lengths)
            inputs = torch.cat([served.pad_to(call.inputs, longest) if served.variable_length else call.inputs
                                for call in live])
        started = time.perf_counter()
        batch.ran = live
        # Copied to the CPU here, on the execution thread: on CUDA this is the synchronization point, so the
        # unit's end on the timeline is when the answer exists.
        output, nested = self._forward(batch, inputs)
        batch.seconds = time.perf_counter() - started - nested
        answers, start = [], 0
        for call, length in zip(live, lengths, strict=True):
            rows = int(call.inputs.shape[0])
            part = output[start:start + rows]
            start += rows
            answers.append(part[:, :length] if served.variable_length else part)
        if self.perplexity is not None:
            for call, answer in zip(live, answers, strict=True):
                self.perplexity.add(call.inputs, answer)
        return answers


    def _forward(self, batch: _Batch, inputs: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The batch's forward pass; ``(output on the CPU, seconds spent on preempting batches)``. A staged model is
        run stage by stage when the dispatcher preempts, and between two stages a batch it finds urgent runs whole
        and is answered at once."""
        if self.urgent is None or len(self.stages) < 2 or batch.nested:
            return super().run(inputs).detach().to("cpu"), 0.0
        nested = 0.0
        x = inputs.to(self.device, non_blocking=True) if isinstance(inputs, torch.Tensor) else inputs
        with torch.inference_mode():
            for index, stage in enumerate(self.stages):
                x = stage(x)
                if index + 1 < len(self.stages) and (urgent := self.urgent(batch, (index + 1) / len(self.stages))):
                    began = time.perf_counter()
                    urgent.nested = True
                    try:
                        answers = self.run(urgent)
                    except BaseException as error:  # answered by the dispatcher; the running batch goes on
                        self.deliver(urgent, None, error)
                    else:
                        self.deliver(urgent, answers, None)
                    self.preemptions += 1
                    nested += time.perf_counter() - began
        return x.detach().to("cpu"), nested


class Dispatcher:
    """An endpoint's request queue and its batching thread.

    Whenever the endpoint has no batch on the device, the :class:`Batching` policy is asked for the next batch of
    the queued requests (and which to answer at once with ``DEADLINE_EXCEEDED``), the batch goes to the executor,
    and the endpoint waits for it: one batch per endpoint on the device at a time, so the policy decides with the
    latest arrivals. The policy is asked by whichever thread finds the device free: the call's own thread when a
    request arrives at an idle endpoint, the executor's when a batch ends, and the batching thread only when the
    policy asked to look again later (FIFO's queue delay). So a request costs no hop to another thread before it
    reaches the executor. Each request's bucket is its length bucket (:data:`LENGTH_BUCKETS` over the model's
    longest input) for a variable-length model, 0 otherwise. The policy learns each batch's measured time.
    """

    def __init__(self, endpoint: ServingEndpoint, batching: Batching):
        self.endpoint = endpoint
        self.batching = batching
        self.policy = batching.make_policy()
        self._cond = threading.Condition()
        self._queue: list[Pending] = []
        self._busy = False
        self._stopping = False
        self._wake: float | None = None  # when the policy asked to look again (the batching thread's timer)
        self._ids = itertools.count()
        self.batches = 0
        self.batch_sizes: Counter[int] = Counter()
        self.dropped = 0
        self.device_s = 0.0
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"serving-batcher-{endpoint.name}")
        self._thread.start()

    def bucket(self, inputs: torch.Tensor) -> int:
        served = self.endpoint.served
        if not served.variable_length:
            return 0
        limit = max(1, served.input_shape[0])
        return (served.length(inputs) - 1) * LENGTH_BUCKETS // limit

    def submit(self, call: _Call) -> None:
        """Queue ``call``; :class:`QueueFull` when ``max_queue`` requests already wait."""
        pending = Pending(deadline=call.deadline - self.batching.reply_margin_s, arrival=time.monotonic(),
                          bucket=self.bucket(call.inputs), id=next(self._ids), payload=call)
        with self._cond:
            if self._stopping:
                raise EndpointUnavailable(f"endpoint {self.endpoint.name!r} is stopping")
            if len(self._queue) >= self.batching.max_queue:
                raise QueueFull(f"the queue is full ({len(self._queue)} requests wait for the device, the endpoint's "
                                f"max_queue); retry later or add replicas")
            self._queue.append(pending)
            batch = self._take()
        if batch:
            self._launch(batch)

    def depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def stop(self) -> None:
        """End the thread; the requests still queued are the endpoint's to answer (:meth:`ServingEndpoint.abandon`)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _purge(self) -> None:
        self._queue = [p for p in self._queue if not (p.payload.abandoned.is_set() or p.payload.answer.done())]

    def _take(self) -> list[Pending] | None:
        """With the lock held: if the device is free and requests wait, ask the policy. Answers its drops, and
        returns the batch to launch (the device is then the endpoint's: busy) or None; a policy that asked to
        look again later sets the batching thread's timer."""
        if self._stopping:
            return None
        self._purge()
        if not self._queue or self._busy:
            return None
        decision = self.policy.decide(list(self._queue), time.monotonic())
        for pending in decision.drop:
            self._queue.remove(pending)
            self.dropped += 1
            pending.payload.settle(None, RequestTimedOut(
                "the request cannot finish by its deadline (answered early, without running it)"))
        if decision.batch:
            batch, rows = [], 0
            for pending in decision.batch:  # at most max_rows rows per forward pass (the memory held)
                rows += int(pending.payload.inputs.shape[0])
                if batch and rows > self.endpoint.max_rows:
                    break
                batch.append(pending)
                self._queue.remove(pending)
            self._busy = True
            self._wake = None
            return batch
        if decision.wake_at is not None:
            self._wake = decision.wake_at
            self._cond.notify_all()  # the batching thread sets its timer
        return None

    def _next(self) -> list[Pending] | None:
        """The batching thread: block until the policy's timer is due and there is a batch to run; None when
        stopping."""
        with self._cond:
            while True:
                if self._stopping:
                    return None
                batch = self._take()
                if batch:
                    return batch
                wake = self._wake if self._queue and not self._busy else None
                self._cond.wait(None if wake is None else max(0.0, wake - time.monotonic()))

    def _loop(self) -> None:
        while (batch := self._next()) is not None:
            self._launch(batch)

    def _launch(self, batch: list[Pending]) -> None:
        """Hand ``batch`` (taken by :meth:`_take`) to the executor; :meth:`_done` answers it when it has run."""
        item = _Batch([pending.payload for pending in batch], pending=batch)
        try:
            future = self.endpoint.executor.infer(self.endpoint.name, item)
        except (KeyError, ExecutorClosed) as error:
            fault = EndpointUnavailable(f"endpoint {self.endpoint.name!r} is not serving: {error}")
            for call in item.calls:
                call.settle(None, fault)
            with self._cond:  # the next batch is the batching thread's, not a recursion of this one
                self._busy = False
                self._cond.notify_all()
            return
        future.add_done_callback(lambda future, item=item: self._done(item, future))

    def _done(self, item: _Batch, future: concurrent.futures.Future) -> None:
        """On the execution thread: answer the batch's calls, teach the policy, free the device for the next."""
        try:
            error = future.exception()
            self.deliver(item, None if error is not None else future.result(), error)
        finally:
            self._finished()

    def deliver(self, item: _Batch, answers: list[torch.Tensor] | None, error: BaseException | None) -> None:
        """Answer a batch's calls (the answers of those that ran, in order; or everyone the error) and teach the
        policy its measured time."""
        if error is None:
            for call, answer in zip(item.ran, answers, strict=True):
                call.settle(answer)
            ran = {id(call) for call in item.ran}
            for call in item.calls:
                if id(call) not in ran:
                    call.settle(None, RequestTimedOut("the deadline passed before the request's turn"))
            if item.seconds is not None:
                self.policy.observe([p for p in item.pending if id(p.payload) in ran], item.seconds)
                self.batches += 1
                self.batch_sizes[len(item.ran)] += 1
                self.device_s += item.seconds
        else:
            if isinstance(error, _Abandoned):
                error = RequestTimedOut(str(error))
            for call in item.calls:
                call.settle(None, error)

    def urgent(self, running: _Batch, done: float) -> _Batch | None:
        """Irina's preemption, asked between two layers of ``running`` (``done``: the share of its layers run): the
        queued requests that would miss their deadlines waiting for the rest of it, but are likely to make them if
        they run now, as one batch; None when there are none, or when running them would make ``running``'s own
        earliest request late. Orloj only (it has the batch-time distributions to judge by)."""
        policy = self.policy
        if not self.batching.preempt or not isinstance(policy, OrlojBatcher) or not running.pending:
            return None
        profile = policy.profile
        with self._cond:
            self._purge()
            if not self._queue:
                return None
            now = time.monotonic()
            left = (1.0 - done) * profile.mean(len(running.pending), max(p.bucket for p in running.pending))
            waiting = sorted(p for p in self._queue
                             if p.deadline < now + left + profile.mean(1, p.bucket)  # late if it waits
                             and profile.cdf(1, p.bucket, p.deadline - now) >= 0.5)  # on time if it runs now
            if not waiting:
                return None
            bucket = waiting[0].bucket
            chosen = [p for p in waiting if p.bucket <= bucket][: self.batching.max_batch]
            cost = profile.mean(len(chosen), bucket)
            if min(p.deadline for p in running.pending) < now + left + cost:
                return None  # the running batch cannot afford it
            for pending in chosen:
                self._queue.remove(pending)
        return _Batch([pending.payload for pending in chosen], pending=chosen)

    def _finished(self) -> None:
        """The device is free again: the next batch, if one is due, goes from this thread (the executor's)."""
        with self._cond:
            self._busy = False
            batch = self._take()
        if batch:
            self._launch(batch)


def endpoint_memory(served: ServedModel, max_rows: int) -> MemoryRequest:
    """The memory an endpoint reserves: the model's weights, and one forward pass of ``max_rows`` rows.

    Activations grow linearly with the batch, so the forward pass is profiled at two small batch sizes and
    extrapolated to ``max_rows`` (profiling a full batch would cost as much as serving one). Headroom is added
    once, to the extrapolated figure, not multiplied along with it.
    """
    from components.gpushare.memory import DEFAULT_HEADROOM, DEFAULT_HEADROOM_MINIMUM, profile_module

    def profile(rows: int) -> MemoryRequest:
        sample = served.sample[:1].repeat(rows, *([1] * (served.sample.dim() - 1)))
        return profile_module(served.module, sample, headroom=0.0, headroom_minimum=0)

    small_rows = min(max_rows, PROFILE_ROWS)
    small = profile(small_rows)
    ephemeral = small.ephemeral
    if max_rows > small_rows:
        one = profile(1)
        per_row = max(0.0, (small.ephemeral - one.ephemeral) / (small_rows - 1))
        ephemeral = max(small.ephemeral, math.ceil(small.ephemeral + per_row * (max_rows - small_rows)))
    return MemoryRequest(small.persistent, int(ephemeral)).with_headroom(DEFAULT_HEADROOM, DEFAULT_HEADROOM_MINIMUM)


class ServingEndpoint:
    """The model ``name`` registered in ``executor``: checks requests and runs them within their deadline.

    Thread-safe: :meth:`predict` is called from the gRPC server's worker threads. After :meth:`close`
    every request is refused with :class:`EndpointUnavailable`.
    """

    def __init__(self, executor: DeviceExecutor, name: str, served: ServedModel, *, request_timeout_s: float = 10.0,
                 max_rows: int = 1024, source_job: str = "", batching: Batching | None = None):
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s}")
        for role, dtype in (("inputs", served.input_dtype), ("outputs", served.output_dtype)):
            if dtype not in WIRE_DTYPES:
                raise ValueError(f"cannot serve {role} of dtype {dtype!r}: the wire carries {', '.join(WIRE_DTYPES)}")
        self.executor = executor
        self.name = name
        self.served = served
        self.request_timeout_s = float(request_timeout_s)
        self.max_rows = int(max_rows)
        self.source_job = source_job
        self.output_row_bytes = WIRE_DTYPES[served.output_dtype][0].itemsize * math.prod(served.output_shape)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._requests = 0
        self._rows = 0
        self._faults: Counter[str] = Counter()
        self._latencies_ms: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._inflight: set[_Call] = set()
        self._drained = threading.Condition(self._lock)
        self._on_time = 0  # answered within their deadline (every success is)
        self._started = time.monotonic()
        self.batching = batching or Batching()
        self.session: ServedSession | None = None  # start_serving's: the executor session (for eMoE's figures)
        self.dispatcher = Dispatcher(self, self.batching)

    # -- the contract ---------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        served = self.served
        return {
            "workload": served.workload,
            "source_job": self.source_job,
            "input_shape": list(served.input_shape),
            "input_dtype": served.input_dtype,
            "output_shape": list(served.output_shape),
            "output_dtype": served.output_dtype,
            "max_rows": self.max_rows,
            "input_limit": served.input_limit,
        }

    def check(self, inputs: torch.Tensor) -> None:
        """Raise :class:`InvalidRequest` naming what in ``inputs`` breaks the model's contract."""
        served = self.served
        expected = WIRE_DTYPES[served.input_dtype][1]
        if inputs.dtype != expected:
            got = next((name for name, (_, dtype) in WIRE_DTYPES.items() if dtype == inputs.dtype), str(inputs.dtype))
            raise InvalidRequest(f"dtype {got} is not accepted: this model takes {served.input_dtype}")
        if served.variable_length:
            shape, limit = tuple(inputs.shape[1:]), served.input_shape[0]
            if (inputs.dim() != len(served.input_shape) + 1 or shape[1:] != served.input_shape[1:]
                    or not 1 <= shape[0] <= limit):
                rest = "".join(f", {size}" for size in served.input_shape[1:])
                raise InvalidRequest(f"shape {list(inputs.shape)} does not match: send [rows, length{rest}] "
                                     f"with 1 <= length <= {limit}")
        elif inputs.dim() == 0 or tuple(inputs.shape[1:]) != served.input_shape:
            raise InvalidRequest(f"shape {list(inputs.shape)} does not match: each row must be "
                                 f"{list(served.input_shape)}, so send [rows, {', '.join(map(str, served.input_shape))}]")
        rows = inputs.shape[0]
        if rows < 1:
            raise InvalidRequest("the batch is empty: send at least one row")
        if rows > self.max_rows:
            raise InvalidRequest(f"{rows} rows is more than this endpoint's max_rows {self.max_rows}")
        reply_rows = MAX_MESSAGE_BYTES // max(1, self.output_row_bytes)
        if rows > reply_rows:
            raise InvalidRequest(f"the answer to {rows} rows would exceed the {MAX_MESSAGE_BYTES >> 20} MiB message "
                                 f"limit: send at most {reply_rows} rows per request")
        if inputs.is_floating_point():
            finite = torch.isfinite(inputs).reshape(rows, -1).all(dim=1)
            if not bool(finite.all()):
                row = int((~finite).nonzero()[0, 0])
                raise InvalidRequest(f"inputs must be finite numbers: row {row} holds NaN or infinity")
        if served.input_limit:
            low, high = int(inputs.min()), int(inputs.max())
            if low < 0 or high >= served.input_limit:
                raise InvalidRequest(f"values must lie in [0, {served.input_limit}) (token ids of the vocabulary); "
                                     f"got [{low}, {high}]")

    # -- serving ----------------------------------------------------------------------------------------------
    def predict(self, inputs: torch.Tensor, timeout: float | None = None,
                when_caller_gone: Callable[[Callable[[], None]], Any] | None = None) -> tuple[torch.Tensor, float]:
        """Run one batch; returns ``(output on the CPU, milliseconds spent here)``.

        ``timeout``: seconds the caller waits (its gRPC deadline), ``request_timeout_s`` when None.
        ``when_caller_gone`` registers a callback to run when the caller stops listening (gRPC's
        ``context.add_callback``): the request is then answered :class:`CallCancelled` at once and skipped
        if it is still queued. Raises a :class:`ServingFault`.
        """
        started = time.perf_counter()
        call = None
        try:
            try:
                self.check(inputs)
            except InvalidRequest:
                raise
            except Exception as error:  # a request the checks did not foresee is still the caller's fault
                log.warning("endpoint %s: checking a request raised", self.name, exc_info=True)
                raise InvalidRequest(f"the request could not be checked: {type(error).__name__}: "
                                     f"{one_line(error)}") from error
            timeout = self.request_timeout_s if timeout is None else float(timeout)
            if timeout <= 0:
                raise RequestTimedOut("the deadline passed before the request reached the model")
            call = _Call(inputs, time.monotonic() + timeout)
            with self._lock:
                # Checked and registered together, so abandon() cannot miss a call that got past the check.
                if self._closed.is_set():
                    raise EndpointUnavailable(f"endpoint {self.name!r} is stopping")
                self._inflight.add(call)
            try:
                if when_caller_gone is not None:
                    when_caller_gone(call.caller_gone)
                self.dispatcher.submit(call)
                try:
                    output = call.answer.result(timeout)
                except ServingFault:  # first: RequestTimedOut is a TimeoutError, as concurrent.futures' is
                    raise
                except concurrent.futures.TimeoutError:
                    raise RequestTimedOut(f"no answer within {timeout:.3g} s (the device is busy)") from None
                except _Abandoned as error:
                    raise RequestTimedOut(str(error)) from None
                except ExecutorClosed as error:
                    raise EndpointUnavailable(f"endpoint {self.name!r} stopped: {error}") from error
                except Exception as error:
                    raise ModelFailed(f"the model raised {type(error).__name__}: {error}") from error
            finally:
                with self._lock:
                    self._inflight.discard(call)
                    self._drained.notify_all()
        except ServingFault as fault:
            if call is not None:
                call.abandoned.set()  # if still queued, it is skipped when its turn comes
            with self._lock:
                self._requests += 1
                self._faults[fault.status] += 1
            raise
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        with self._lock:
            self._requests += 1
            self._rows += int(inputs.shape[0])
            self._latencies_ms.append(elapsed_ms)
        return output, elapsed_ms

    def record_fault(self, status: str) -> None:
        """Count a request refused before it reached :meth:`predict` (e.g. undecodable)."""
        with self._lock:
            self._requests += 1
            self._faults[status] += 1

    def close(self) -> None:
        """Refuse new requests; those in flight go on."""
        with self._lock:
            self._closed.set()

    def shutdown(self) -> None:
        """Stop the batching thread (after :meth:`drain` or :meth:`abandon`); requests still queued are skipped."""
        self.close()
        self.dispatcher.stop()

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the requests in flight to be answered; True when none is left."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._drained.wait(left)
            return True

    def abandon(self, reason: str) -> int:
        """Answer every request in flight with :class:`EndpointUnavailable` (``reason``) now; the executor skips
        those still queued. Returns how many were abandoned."""
        with self._lock:
            calls = list(self._inflight)
        for call in calls:
            call.abandoned.set()
            call.settle(None, EndpointUnavailable(reason))
        return len(calls)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def stats(self) -> dict[str, Any]:
        """Requests answered (successes and faults), faults by status, and server latency over the latest
        ``LATENCY_WINDOW`` successes."""
        with self._lock:
            window = list(self._latencies_ms)
            stats: dict[str, Any] = {
                "requests": self._requests,
                "errors": sum(self._faults.values()),
                "errors_by_status": dict(self._faults),
                "rows": self._rows,
                "in_flight": len(self._inflight),
            }
        stats["p50_ms"] = percentile(window, 0.5)
        stats["p99_ms"] = percentile(window, 0.99)
        stats["window"] = len(window)
        # SLO attainment: the share of requests that reached the queue and were answered within their deadline
        # (a success always is; DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are misses). Malformed ones are not counted.
        answered = stats["requests"] - stats["errors"]
        missed = sum(stats["errors_by_status"].get(status, 0) for status in ("DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"))
        stats["slo_attainment"] = answered / (answered + missed) if answered + missed else None
        dispatcher = self.dispatcher
        sizes = dict(dispatcher.batch_sizes)
        stats.update(
            policy=self.batching.policy, max_batch=self.batching.max_batch, queue_depth=dispatcher.depth(),
            batches=dispatcher.batches, batch_sizes=sizes, dropped_early=dispatcher.dropped,
            mean_batch=(sum(size * count for size, count in sizes.items()) / dispatcher.batches
                        if dispatcher.batches else None),
            throughput_rps=answered / max(1e-9, time.monotonic() - self._started),
        )
        session = self.session
        if session is not None and session.placement is not None:
            stats["emoe"] = {**session.placement.stats(), "perplexity": session.perplexity.value}
        stats["preemptions"] = session.preemptions if session is not None else 0
        depths = getattr(self.served.module, "depths", None)
        if isinstance(depths, list):  # an early-exit model: rows answered at each exit so far
            stats["exit_depths"] = list(depths)
        return stats


# -- gRPC ----------------------------------------------------------------------------------------------------
def one_line(text: Any, limit: int = MAX_DETAILS) -> str:
    """``text`` on one line (whitespace runs become one space), at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _count(number: int) -> str:
    return str(number) if number < 10**12 else f"{float(number):.3g}"


def decode_tensor(message: serving_pb2.Tensor) -> torch.Tensor:
    """The tensor in ``message``; :class:`InvalidRequest`, naming the problem, when it is malformed.

    Everything is checked in Python integers before numpy or torch sees the data: the dtype is one of
    ``WIRE_DTYPES``; the shape has 1 to ``MAX_DIMS`` dimensions, each at least 1 (an empty batch or a zero
    dimension is refused); ``prod(shape)`` elements fit in a ``MAX_MESSAGE_BYTES`` message; and ``data`` is
    exactly ``prod(shape)`` elements. Whether the tensor fits the model is :meth:`ServingEndpoint.check`'s
    business.
    """
    name = message.dtype
    wire = WIRE_DTYPES.get(name)
    if wire is None:
        if not name:
            raise InvalidRequest(f"the tensor has no dtype: use one of {', '.join(WIRE_DTYPES)}")
        raise InvalidRequest(f"dtype {_clip(name)!r} is not supported: use one of {', '.join(WIRE_DTYPES)}")
    dims = len(message.shape)  # before anything walks a shape that may have millions of entries
    if dims == 0:
        raise InvalidRequest("the tensor has no shape (a scalar): send a batch, [rows, ...]")
    if dims > MAX_DIMS:
        raise InvalidRequest(f"the shape has {dims} dimensions; at most {MAX_DIMS} are accepted")
    shape = [int(size) for size in message.shape]
    if any(size < 0 for size in shape):
        raise InvalidRequest(f"shape {shape} has a negative dimension")
    if shape[0] == 0:
        raise InvalidRequest(f"the batch is empty (shape {shape}): send at least one row")
    if 0 in shape:
        raise InvalidRequest(f"shape {shape} has a dimension of 0: every dimension must be at least 1")
    itemsize = wire[0].itemsize
    elements = math.prod(shape)  # a Python int: no overflow, however large the dimensions
    needed = elements * itemsize
    if needed > MAX_MESSAGE_BYTES:
        raise InvalidRequest(f"shape {shape} describes {_count(elements)} {name} elements ({_count(needed)} bytes), "
                             f"more than a {MAX_MESSAGE_BYTES >> 20} MiB message can carry")
    size = len(message.data)
    if size % itemsize:
        raise InvalidRequest(f"data holds {size} bytes, not a whole number of {name} elements "
                             f"({itemsize} bytes each)")
    if size != needed:
        raise InvalidRequest(f"data holds {size} bytes ({size // itemsize} elements); shape {shape} of {name} "
                             f"needs {needed} bytes ({elements} elements)")
    array = np.frombuffer(message.data, dtype=wire[0]).reshape(shape)
    # A native-order, writable copy: torch must not alias the (read-only) message buffer.
    return torch.from_numpy(array.astype(wire[0].newbyteorder("="), copy=True))


def encode_tensor(tensor: torch.Tensor) -> serving_pb2.Tensor:
    """``tensor`` as a wire message: float outputs as float32, integer and boolean ones as int64."""
    tensor = tensor.detach().to("cpu")
    name = "float32" if tensor.is_floating_point() else "int64"
    wire, dtype = WIRE_DTYPES[name]
    data = tensor.to(dtype).contiguous().numpy().astype(wire, copy=False).tobytes()
    return serving_pb2.Tensor(shape=list(tensor.shape), dtype=name, data=data)


class _Unparsed:
    """A request whose bytes are not a valid message (bad wire format, a string that is not UTF-8): the
    handler answers it INVALID_ARGUMENT instead of gRPC's own INTERNAL "Exception deserializing request"."""

    def __init__(self, kind: str, error: Exception):
        self.reason = f"the request is not a valid {kind} message: {one_line(error, 300)}"


def _tolerant_parser(message_type) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as error:
            return _Unparsed(message_type.DESCRIPTOR.full_name, error)

    return parse


class ReadWatch:
    """Cancels the calls whose request message has not arrived in time (a stalled or trickling client).

    A synchronous gRPC server holds a worker thread and one of its ``maximum_concurrent_rpcs`` slots from a call's
    headers until its message has arrived; a client that sends headers and then nothing (no deadline) would hold
    them for ever, and ``maximum_concurrent_rpcs`` such streams would lock every caller out. One thread per server
    looks at the calls still reading every ``tick`` seconds (at most ``maximum_concurrent_rpcs`` of them) and
    cancels those past their bound.
    """

    def __init__(self, name: str, tick: float = 0.25):
        self.tick = tick
        self.cancelled = 0
        self._cond = threading.Condition()
        self._reading: dict[int, tuple[float, Any]] = {}
        self._ids = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"serving-readwatch-{name}")
        self._thread.start()

    def arm(self, seconds: float, context) -> int:
        key = next(self._ids)
        with self._cond:
            self._reading[key] = (time.monotonic() + seconds, context)
            self._cond.notify()
        return key

    def disarm(self, key: int) -> None:
        with self._cond:
            self._reading.pop(key, None)

    @property
    def reading(self) -> int:
        """How many calls are waiting for their request message now (each holds a slot and a thread)."""
        with self._cond:
            return len(self._reading)

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                for key, (deadline, context) in list(self._reading.items()):
                    if now >= deadline:
                        del self._reading[key]
                        self.cancelled += 1
                        context.cancel()  # the handler's read raises; the client sees CANCELLED
                self._cond.wait(self.tick if self._reading else None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(2.0)


def _guarded(servicer: InferenceServicer, behavior: Callable[[Any, Any], Any], count: bool) -> Callable:
    """``behavior(request, context)`` as a request-streaming handler, so that a call is judged before its message is
    read: the deployment token is checked on the headers alone (a caller without one is refused at once, however
    slowly it sends), and the one request message must arrive within :data:`REQUEST_READ_S` (or the call's own
    deadline, when sooner; gRPC ends the call then), else the call is cancelled (:class:`ReadWatch`). The wire is
    the same as a unary call's: clients call it as one."""

    def handle(requests, context):
        if (refused := servicer._refused(context)) is not None:
            if count:
                servicer.endpoint.record_fault("UNAUTHENTICATED")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        remaining = context.time_remaining()
        key = None
        if servicer.watch is not None and (remaining is None or remaining > REQUEST_READ_S):
            key = servicer.watch.arm(REQUEST_READ_S, context)
        try:
            request = next(requests)
        except StopIteration:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
        except grpc.RpcError:  # cancelled while reading: by the client, its deadline, or the ReadWatch
            context.abort(grpc.StatusCode.CANCELLED, "the request message did not arrive in time")
        finally:
            if key is not None:
                servicer.watch.disarm(key)
        return behavior(request, context)

    return handle


def add_servicer(servicer: InferenceServicer, server: grpc.Server) -> None:
    """``serving_pb2_grpc.add_InferenceServicer_to_server``, but with request parsers that never raise, the token
    checked before the request is read, and a bound on reading it (:func:`_guarded`)."""
    handlers = {
        "Predict": grpc.stream_unary_rpc_method_handler(
            _guarded(servicer, servicer.Predict, count=True),
            request_deserializer=_tolerant_parser(serving_pb2.PredictRequest),
            response_serializer=serving_pb2.PredictReply.SerializeToString),
        "Describe": grpc.stream_unary_rpc_method_handler(
            _guarded(servicer, servicer.Describe, count=False),
            request_deserializer=_tolerant_parser(serving_pb2.DescribeRequest),
            response_serializer=serving_pb2.ModelInfo.SerializeToString),
    }
    service = serving_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


class InferenceServicer(serving_pb2_grpc.InferenceServicer):
    """The gRPC face of a :class:`ServingEndpoint`: decode, call it, map its faults to status codes.

    A request that cannot be parsed, decoded or checked is ``INVALID_ARGUMENT`` whatever went wrong, with a
    one-line message; a failure after that (the model, the runtime) is ``INTERNAL``.
    """

    def __init__(self, endpoint: ServingEndpoint, gate: TokenGate | None = None, watch: ReadWatch | None = None):
        self.endpoint = endpoint
        self.gate = gate
        self.watch = watch  # add_servicer's bound on reading a request (None: unbounded)

    def _refused(self, context) -> str | None:
        """Why the call's deployment token is refused (None: accepted, or no gate)."""
        if self.gate is None:
            return None
        return self.gate.check(bearer(context.invocation_metadata() or ()))

    def _inputs(self, request) -> torch.Tensor:
        if isinstance(request, _Unparsed):
            raise InvalidRequest(request.reason)
        if not request.HasField("input"):
            raise InvalidRequest("the request has no input tensor")
        try:
            return decode_tensor(request.input)
        except InvalidRequest:
            raise
        except Exception as error:  # a malformed tensor the checks did not foresee
            log.warning("endpoint %s: decoding a request raised", self.endpoint.name, exc_info=True)
            raise InvalidRequest(f"the input tensor could not be decoded: {type(error).__name__}: "
                                 f"{one_line(error)}") from error

    def Predict(self, request, context):  # noqa: N802 -- the generated servicer's name
        status, details = None, ""
        if (refused := self._refused(context)) is not None:
            self.endpoint.record_fault("UNAUTHENTICATED")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        try:
            inputs = self._inputs(request)
        except InvalidRequest as fault:
            self.endpoint.record_fault(fault.status)
            status, details = fault.status, str(fault)
        else:
            # A client deadline is the caller's bound; without one, the job's request_timeout_s.
            remaining = context.time_remaining()
            if remaining is not None and remaining > NO_DEADLINE_S:
                remaining = None
            try:
                output, server_ms = self.endpoint.predict(inputs, remaining, context.add_callback)
                return serving_pb2.PredictReply(output=encode_tensor(output), server_ms=server_ms)
            except ServingFault as fault:
                status, details = fault.status, str(fault)
            except Exception as error:  # a bug here must still answer, with the error
                log.exception("Predict on %s failed", self.endpoint.name)
                self.endpoint.record_fault("INTERNAL")
                status, details = "INTERNAL", f"{type(error).__name__}: {error}"
        context.abort(grpc.StatusCode[status], one_line(details))

    def Describe(self, request, context):  # noqa: N802 -- the generated servicer's name
        if (refused := self._refused(context)) is not None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)
        if isinstance(request, _Unparsed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        if self.endpoint.closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"endpoint {self.endpoint.name!r} is stopping")
        return serving_pb2.ModelInfo(**self.endpoint.info())


class ServingHandle:
    """A running endpoint: its gRPC server and its registration in a device executor.

    ``address`` is ``host:port`` as clients should dial it. :meth:`stats` merges the endpoint's request
    counters with the executor's view of it (``state``, ``served``, ``error``). :meth:`stop` is idempotent
    and thread-safe. Also a context manager (stops on exit).
    """

    def __init__(self, *, endpoint: ServingEndpoint, server: grpc.Server, pool: concurrent.futures.ThreadPoolExecutor,
                 address: str, port: int, admission: Admission):
        self.endpoint = endpoint
        self.executor = endpoint.executor
        self.name = endpoint.name
        self.address = address
        self.port = port
        self.admission = admission
        self._server = server
        self._pool = pool
        self._stop_lock = threading.Lock()
        self._stopped = False
        self.watch: ReadWatch | None = None  # start_serving's bound on reading requests

    def stats(self) -> dict[str, Any]:
        stats = self.endpoint.stats()
        try:
            job = self.executor.job_status(self.name)
        except KeyError:  # the executor forgot it (long ended)
            job = {"state": "unknown", "served": None, "error": None}
        stats.update(address=self.address, state=job["state"], served=job["served"], error=job["error"])
        return stats

    def failed(self) -> str | None:
        """Why the model can no longer serve (it failed or was cancelled in the executor) while this handle was
        not stopped; None while it serves."""
        if self._stopped:
            return None
        try:
            job = self.executor.job_status(self.name)
        except KeyError:
            return "the executor no longer knows this endpoint"
        if job["state"] in ("failed", "cancelled", "rejected", "succeeded"):
            return f"endpoint {job['state']}: {job['error'] or 'no error recorded'}"
        return None

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving; idempotent. New calls are refused (UNAVAILABLE) at once; calls in flight get ``grace``
        seconds to be answered, and those still waiting then (the device is busy) are answered UNAVAILABLE.
        Then the gRPC server stops, the endpoint is cancelled in the executor, and this waits up to ``grace``
        more seconds for the executor to release it (it does so between two units of work)."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            self.endpoint.close()
            if not self.endpoint.drain(grace):
                count = self.endpoint.abandon(f"endpoint {self.name!r} stopped before the request's turn")
                log.info("endpoint %s: %d requests still waiting after %.3g s were answered UNAVAILABLE",
                         self.name, count, grace)
            self.endpoint.shutdown()
            # Every handler has its answer now: the short grace only lets those replies go out.
            self._server.stop(STOP_FLUSH_S).wait(STOP_FLUSH_S + 1.0)
            if self.watch is not None:
                self.watch.stop()
            self._pool.shutdown(wait=False, cancel_futures=True)
            try:
                self.executor.cancel(self.name)
                self.executor.wait(self.name, timeout=max(grace, 0.1))
            except (KeyError, TimeoutError, RuntimeError) as error:
                # A long unit of another job still holds the execution thread (or the executor is gone):
                # the endpoint is released as soon as the thread comes back.
                log.info("endpoint %s: not yet released by the executor: %s", self.name, error)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the endpoint ends in the executor; returns its executor status."""
        return self.executor.wait(self.name, timeout)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def __enter__(self) -> ServingHandle:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _dial_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def start_serving(
    executor: DeviceExecutor,
    name: str,
    served: ServedModel,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    request_timeout_s: float = 10.0,
    max_rows: int = 1024,
    source_job: str = "",
    priority: int = 0,
    memory_request: MemoryRequest | None = None,
    advertise_host: str | None = None,
    max_concurrent_rpcs: int | None = None,
    insecure_bind: bool | None = None,
    batching: Batching | None = None,
    gate: TokenGate | None = None,
    tls: tuple[bytes, bytes] | None = None,
    emoe: dict[str, Any] | None = None,
) -> ServingHandle:
    """Register ``served`` in ``executor`` as endpoint ``name`` and serve it over gRPC on ``host:port``.

    ``port`` 0 picks a free port. ``memory_request`` defaults to :func:`endpoint_memory` (weights plus a
    ``max_rows`` forward pass). Raises :class:`AdmissionRejected` when the executor can never fit it,
    ``ValueError`` when ``name`` is taken, :class:`~components.gpushare.executor.ExecutorClosed` when the
    executor is shutting down, ``OSError`` when the port cannot be bound, and
    :class:`~components.serving.bind.InsecureBindError` when there is no ``gate`` (no authentication),
    ``host`` is not a loopback address and ``insecure_bind`` (default: ``STRATA_SERVING_INSECURE_BIND=1`` in
    the environment) does not allow it; nothing is left running then.
    An admission that has to wait for memory is accepted: requests queue (within their deadlines) until the
    executor admits the endpoint. ``advertise_host`` is the host put in ``address`` (default ``host``).

    ``gate``: every call must carry one of the job's deployment tokens (``authorization: Bearer``), else
    ``UNAUTHENTICATED``. ``tls``: ``(certificate chain PEM, private key PEM)`` serves over TLS. ``batching``:
    how queued requests are batched (:class:`Batching`; default Orloj, 8 requests). ``emoe``: ``{"budget":
    fraction of the experts' bytes kept on the device, "miss": "load" | "reroute"}`` for a mixture-of-experts
    model (:class:`~components.serving.emoe.ExpertPlacement`); its figures are in ``stats()["emoe"]``.
    """
    if gate is None:  # no authentication: a loopback address only, unless the operator opted in
        check_bind_host(host, insecure=insecure_bind)
    batching = batching or Batching()
    placement = None
    if emoe is not None:  # before the memory is profiled: the experts leave the model for host memory
        from components.serving.emoe import ExpertPlacement, moe_layers

        layers = moe_layers(served.module)
        total = sum(p.numel() * p.element_size() for layer in layers for p in layer.experts.parameters())
        placement = ExpertPlacement(served.module, max(1, int(emoe["budget"] * total)), miss=emoe.get("miss", "load"))
    request = memory_request if memory_request is not None else endpoint_memory(served, max_rows)
    if placement is not None and memory_request is None:
        request = MemoryRequest(request.persistent + placement.budget_bytes, request.ephemeral)
    session = ServedSession(served, placement)
    admission = executor.serve(name, session, request, priority)
    if admission.status == "rejected":
        raise AdmissionRejected(f"endpoint {name!r} cannot fit the device: {admission.reason}")
    endpoint = ServingEndpoint(executor, name, served, request_timeout_s=request_timeout_s, max_rows=max_rows,
                               source_job=source_job, batching=batching)
    endpoint.session = session
    if batching.preempt and batching.policy == "orloj":
        session.urgent, session.deliver = endpoint.dispatcher.urgent, endpoint.dispatcher.deliver
    if max_concurrent_rpcs is None:
        max_concurrent_rpcs = batching.max_queue + RPC_HEADROOM
    if not admission.admitted:
        log.warning("endpoint %s waits for device memory (position %s); requests queue until it is admitted",
                    name, admission.position)
    # The server is synchronous: a call holds a worker thread while it waits in the queue, so there is one
    # worker per concurrent RPC, or the queue could never fill past the worker count.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_concurrent_rpcs),
                                                 thread_name_prefix=f"serving-{name}")
    server = grpc.server(pool, options=SERVER_OPTIONS, maximum_concurrent_rpcs=max(1, max_concurrent_rpcs))
    watch = ReadWatch(name)
    add_servicer(InferenceServicer(endpoint, gate, watch), server)
    try:
        try:
            if tls is not None:
                credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])  # [(private key, certificate chain)]
                bound = server.add_secure_port(_dial_address(host, port), credentials)
            else:
                bound = server.add_insecure_port(_dial_address(host, port))
        except RuntimeError as error:
            raise OSError(f"cannot bind {_dial_address(host, port)}: {error}") from error
        if not bound:
            raise OSError(f"cannot bind {_dial_address(host, port)}")
        server.start()
    except BaseException:
        endpoint.shutdown()
        watch.stop()
        server.stop(None)
        pool.shutdown(wait=False)
        executor.cancel(name)
        raise
    address = _dial_address(advertise_host or host, bound)
    log.info("endpoint %s serves %s on %s", name, served.workload, address)
    handle = ServingHandle(endpoint=endpoint, server=server, pool=pool, address=address, port=bound,
                           admission=admission)
    handle.watch = watch
    return handle


__all__ = [
    "AdmissionRejected",
    "Batching",
    "CallCancelled",
    "Dispatcher",
    "EndpointUnavailable",
    "InferenceServicer",
    "InsecureBindError",
    "InvalidRequest",
    "ModelFailed",
    "QueueFull",
    "ReadWatch",
    "RequestTimedOut",
    "ServedSession",
    "ServingEndpoint",
    "ServingFault",
    "ServingHandle",
    "add_servicer",
    "decode_tensor",
    "endpoint_memory",
    "start_serving",
]
