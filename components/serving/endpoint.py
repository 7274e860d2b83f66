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

from components.gpushare.executor import DeviceExecutor, ExecutorClosed
from components.gpushare.lanes import Admission, MemoryRequest
from components.gpushare.stages import InferenceSession
from components.runtime.benchkit import percentile
from components.serving import serving_pb2, serving_pb2_grpc
from components.serving.component import InsecureBindError, check_bind_host
from components.serving.model import ServedModel

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 2**20
MAX_DIMS = 8  # most dimensions a request tensor may have (the built-in models take 2 or 4)
MAX_DETAILS = 1000  # longest status message sent back (one line; gRPC carries it in a header)
DEFAULT_MAX_CONCURRENT_RPCS = 64
DEFAULT_WORKERS = 8
LATENCY_WINDOW = 1000  # latest successful requests the percentiles are taken over
# gRPC reports "no deadline" as a remaining time of about 2**63 ns rather than None.
NO_DEADLINE_S = 10**7
PROFILE_ROWS = 16  # the larger of the two batches endpoint_memory() measures
STOP_FLUSH_S = 0.5  # after stop() answered every call: time for the replies to go out

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


class AdmissionRejected(ValueError):
    """The executor can never fit the model next to its budget: nothing was started."""


# How close to its deadline a call that gRPC ends counts as timed out rather than cancelled (clock rounding).
DEADLINE_SLACK_S = 0.05


class _Abandoned(Exception):
    """Raised on the execution thread instead of running a request whose caller is gone."""


@dataclass(eq=False)  # identity: calls in flight are kept in a set
class _Call:
    """What travels through :meth:`DeviceExecutor.infer`: the inputs and how long anyone waits for them.

    The gRPC handler waits on ``answer``, not on the executor's future: :meth:`ServingEndpoint.abandon` can
    then answer a call that is still queued without touching a future the execution thread will set.
    """

    inputs: torch.Tensor
    deadline: float  # time.monotonic()
    abandoned: threading.Event = field(default_factory=threading.Event)
    answer: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def relay(self, future: concurrent.futures.Future) -> None:
        """Copy the executor's outcome into ``answer`` (a done-callback, on the execution thread)."""
        error = future.exception()
        self.settle(None if error is not None else future.result(), error)

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


class ServedSession(InferenceSession):
    """The executor session of an endpoint: skips requests nobody waits for, returns outputs on the CPU."""

    def run(self, call: _Call) -> torch.Tensor:
        if call.abandoned.is_set():
            raise _Abandoned("the call ended before its turn")
        if time.monotonic() >= call.deadline:
            raise _Abandoned("the deadline passed before the request's turn")
        # Copied to the CPU here, on the execution thread: on CUDA this is the synchronization point, so the
        # unit's end on the timeline is when the answer exists.
        return super().run(call.inputs).detach().to("cpu")


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
                 max_rows: int = 1024, source_job: str = ""):
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
        if inputs.dim() == 0 or tuple(inputs.shape[1:]) != served.input_shape:
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
                try:
                    self.executor.infer(self.name, call).add_done_callback(call.relay)
                except (KeyError, ExecutorClosed) as error:
                    raise EndpointUnavailable(f"endpoint {self.name!r} is not serving: {error}") from error
                try:
                    output = call.answer.result(timeout)
                except concurrent.futures.TimeoutError:
                    raise RequestTimedOut(f"no answer within {timeout:.3g} s (the device is busy)") from None
                except _Abandoned as error:
                    raise RequestTimedOut(str(error)) from None
                except ExecutorClosed as error:
                    raise EndpointUnavailable(f"endpoint {self.name!r} stopped: {error}") from error
                except ServingFault:
                    raise
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


def add_servicer(servicer: InferenceServicer, server: grpc.Server) -> None:
    """``serving_pb2_grpc.add_InferenceServicer_to_server``, but with request parsers that never raise."""
    handlers = {
        "Predict": grpc.unary_unary_rpc_method_handler(
            servicer.Predict, request_deserializer=_tolerant_parser(serving_pb2.PredictRequest),
            response_serializer=serving_pb2.PredictReply.SerializeToString),
        "Describe": grpc.unary_unary_rpc_method_handler(
            servicer.Describe, request_deserializer=_tolerant_parser(serving_pb2.DescribeRequest),
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

    def __init__(self, endpoint: ServingEndpoint):
        self.endpoint = endpoint

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
            # Every handler has its answer now: the short grace only lets those replies go out.
            self._server.stop(STOP_FLUSH_S).wait(STOP_FLUSH_S + 1.0)
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
    max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS,
    workers: int = DEFAULT_WORKERS,
    insecure_bind: bool | None = None,
) -> ServingHandle:
    """Register ``served`` in ``executor`` as endpoint ``name`` and serve it over gRPC on ``host:port``.

    ``port`` 0 picks a free port. ``memory_request`` defaults to :func:`endpoint_memory` (weights plus a
    ``max_rows`` forward pass). Raises :class:`AdmissionRejected` when the executor can never fit it,
    ``ValueError`` when ``name`` is taken, :class:`~components.gpushare.executor.ExecutorClosed` when the
    executor is shutting down, ``OSError`` when the port cannot be bound, and
    :class:`~components.serving.component.InsecureBindError` when ``host`` is not a loopback address (the
    endpoint has no authentication yet) and ``insecure_bind`` (default: ``STRATA_SERVING_INSECURE_BIND=1`` in
    the environment) does not allow it; nothing is left running then.
    An admission that has to wait for memory is accepted: requests queue (within their deadlines) until the
    executor admits the endpoint. ``advertise_host`` is the host put in ``address`` (default ``host``).
    """
    check_bind_host(host, insecure=insecure_bind)
    endpoint = ServingEndpoint(executor, name, served, request_timeout_s=request_timeout_s, max_rows=max_rows,
                               source_job=source_job)
    request = memory_request if memory_request is not None else endpoint_memory(served, max_rows)
    admission = executor.serve(name, ServedSession(served.module, sample=served.sample), request, priority)
    if admission.status == "rejected":
        raise AdmissionRejected(f"endpoint {name!r} cannot fit the device: {admission.reason}")
    if not admission.admitted:
        log.warning("endpoint %s waits for device memory (position %s); requests queue until it is admitted",
                    name, admission.position)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=f"serving-{name}")
    server = grpc.server(
        pool,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC sets SO_REUSEPORT by default, and then a second server on a busy port binds silently.
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=max(1, max_concurrent_rpcs),
    )
    add_servicer(InferenceServicer(endpoint), server)
    try:
        try:
            bound = server.add_insecure_port(_dial_address(host, port))
        except RuntimeError as error:
            raise OSError(f"cannot bind {_dial_address(host, port)}: {error}") from error
        if not bound:
            raise OSError(f"cannot bind {_dial_address(host, port)}")
        server.start()
    except BaseException:
        endpoint.close()
        server.stop(None)
        pool.shutdown(wait=False)
        executor.cancel(name)
        raise
    address = _dial_address(advertise_host or host, bound)
    log.info("endpoint %s serves %s on %s", name, served.workload, address)
    return ServingHandle(endpoint=endpoint, server=server, pool=pool, address=address, port=bound, admission=admission)


__all__ = [
    "AdmissionRejected",
    "CallCancelled",
    "EndpointUnavailable",
    "InferenceServicer",
    "InsecureBindError",
    "InvalidRequest",
    "ModelFailed",
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
