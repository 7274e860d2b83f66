"""A thin client of a ``serve`` job's gRPC endpoint (numpy in, numpy out; no torch).

Usage::

    from components.serving.client import describe, predict

    describe("127.0.0.1:50051")["input_shape"]  # [64] for mlp-digits
    labels = predict("127.0.0.1:50051", digits.data[:8] / 16).argmax(axis=1)
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from components.serving import serving_pb2, serving_pb2_grpc

MAX_MESSAGE_BYTES = 64 * 2**20  # the server's limit too
TOKEN_ENV = "STRATA_SERVING_TOKEN"  # the deployment token sent when a call names none
TLS_CA_ENV = "STRATA_SERVING_TLS_CA"  # a PEM file: dial over TLS, trusting this certificate authority
_WIRE = {"float32": np.dtype("<f4"), "int64": np.dtype("<i8")}


class ServingError(Exception):
    """A call the endpoint answered with an error status (or could not be reached: ``UNAVAILABLE``).

    ``code`` is the :class:`grpc.StatusCode`, ``details`` the server's explanation, on one line (a malformed
    request is ``INVALID_ARGUMENT`` with details naming what is wrong).
    """

    def __init__(self, code: grpc.StatusCode, details: str):
        details = _one_line(details)
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _wire_dtype(array: np.ndarray, dtype: str | None) -> str:
    if dtype is not None:
        if dtype not in _WIRE:
            raise ValueError(f"dtype must be one of {', '.join(_WIRE)}, got {dtype!r}")
        return dtype
    # Python floats arrive as float64 and ints as the platform's integer: send what the models take.
    if array.dtype.kind == "f":
        return "float32"
    if array.dtype.kind in "iub":
        return "int64"
    raise ValueError(f"cannot send an array of dtype {array.dtype}; pass dtype='float32' or 'int64'")


def encode(array_like: Any, dtype: str | None = None) -> serving_pb2.Tensor:
    """``array_like`` as a wire tensor: cast to ``dtype`` ("float32" / "int64"), by default float32 for floats
    and int64 for integers. Raises ``ValueError`` (one line) when ``array_like`` is not a rectangular array of
    numbers of that type."""
    try:
        array = np.asarray(array_like)
    except (ValueError, TypeError, OverflowError) as error:  # ragged rows, say
        raise ValueError(f"the rows are not a rectangular array of numbers: {_one_line(error)}") from None
    name = _wire_dtype(array, dtype)
    try:
        data = np.ascontiguousarray(array, dtype=_WIRE[name]).tobytes()
    except (ValueError, TypeError, OverflowError) as error:  # "abc", or an integer past int64
        raise ValueError(f"the rows cannot be sent as {name}: {_one_line(error)}") from None
    return serving_pb2.Tensor(shape=list(array.shape), dtype=name, data=data)


def decode(message: serving_pb2.Tensor) -> np.ndarray:
    wire = _WIRE.get(message.dtype)
    if wire is None:
        raise ValueError(f"the server sent dtype {message.dtype!r}")
    return np.frombuffer(message.data, dtype=wire).reshape(tuple(message.shape)).astype(wire.newbyteorder("="))


_channels: dict[tuple[str, bytes | None], tuple[grpc.Channel, serving_pb2_grpc.InferenceStub]] = {}
_channels_lock = threading.Lock()


def _ca(tls_ca: bytes | str | Path | None) -> bytes | None:
    """The CA certificate to trust (PEM bytes, or a path to them); ``STRATA_SERVING_TLS_CA`` when None."""
    if tls_ca is None:
        tls_ca = os.environ.get(TLS_CA_ENV) or None
    if tls_ca is None or isinstance(tls_ca, bytes):
        return tls_ca
    return Path(tls_ca).read_bytes()


def _stub(address: str, tls_ca: bytes | None = None) -> serving_pb2_grpc.InferenceStub:
    """One channel per address (and CA) for the life of the process: a new channel per call costs a TCP and
    HTTP/2 handshake, about 1 ms of every request on loopback. Channels are thread-safe and reconnect by
    themselves."""
    key = (address, tls_ca)
    with _channels_lock:
        if key not in _channels:
            # A subchannel pool of the channel's own: with gRPC's global pool a fresh channel to the same address
            # would share the old one's connection, and its reconnect back-off (see _call).
            options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                       ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                       ("grpc.use_local_subchannel_pool", 1)]
            if tls_ca is not None:
                channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=tls_ca), options)
            else:
                channel = grpc.insecure_channel(address, options=options)
            _channels[key] = channel, serving_pb2_grpc.InferenceStub(channel)
        return _channels[key][1]


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    token = token if token is not None else os.environ.get(TOKEN_ENV, "").strip() or None
    return (("authorization", f"Bearer {token}"),) if token else ()


@atexit.register
def close_channels() -> None:
    """Close every cached channel (they are also closed when the process exits)."""
    with _channels_lock:
        channels = [channel for channel, _ in _channels.values()]
        _channels.clear()
    for channel in channels:
        channel.close()


def _forget(address: str, tls_ca: bytes | None) -> None:
    """Drop the cached channel to ``address`` (the next call opens a fresh one)."""
    with _channels_lock:
        entry = _channels.pop((address, tls_ca), None)
    if entry is not None:
        entry[0].close()


def _call(address: str, method: str, request: Any, timeout: float | None, token: str | None = None,
          tls_ca: bytes | str | Path | None = None) -> Any:
    ca = _ca(tls_ca)
    for attempt in range(2):
        try:
            return getattr(_stub(address, ca), method)(request, timeout=timeout, metadata=_metadata(token))
        except grpc.RpcError as error:
            details = error.details() or ""
            if attempt == 0 and error.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details:
                # The call never reached a server. A cached channel whose server went away backs off before it
                # reconnects (up to minutes), failing every call at once even when a new server (a replica
                # restarted on the same port) listens there now: try once more on a fresh channel.
                _forget(address, ca)
                continue
            raise ServingError(error.code(), details) from None
    raise AssertionError("unreachable")


def predict(address: str, array_like: Any, *, dtype: str | None = None, timeout: float | None = 10.0,
            token: str | None = None, tls_ca: bytes | str | Path | None = None) -> np.ndarray:
    """Run the model at ``address`` ("host:port") on a batch of rows; returns its output as a numpy array.

    ``timeout`` is the call's deadline in seconds (None: the deployment's SLO or ``request_timeout_s``).
    ``token`` is the deployment token (default ``$STRATA_SERVING_TOKEN``); ``tls_ca`` the CA certificate (PEM
    bytes or a path; default ``$STRATA_SERVING_TLS_CA``) of an endpoint that serves TLS. Raises
    :class:`ServingError` (``UNAUTHENTICATED`` for a missing, wrong or revoked token).
    """
    reply = _call(address, "Predict", serving_pb2.PredictRequest(input=encode(array_like, dtype)), timeout, token,
                  tls_ca)
    return decode(reply.output)


def predict_timed(address: str, array_like: Any, *, dtype: str | None = None, timeout: float | None = 10.0,
                  token: str | None = None, tls_ca: bytes | str | Path | None = None) -> tuple[np.ndarray, float]:
    """Like :func:`predict`, also returning the server's own time for the call (``server_ms``)."""
    reply = _call(address, "Predict", serving_pb2.PredictRequest(input=encode(array_like, dtype)), timeout, token,
                  tls_ca)
    return decode(reply.output), reply.server_ms


def describe(address: str, timeout: float | None = 5.0, *, token: str | None = None,
             tls_ca: bytes | str | Path | None = None) -> dict[str, Any]:
    """What the endpoint serves: ``workload``, ``source_job``, ``input_shape``, ``input_dtype``,
    ``output_shape``, ``output_dtype``, ``max_rows``, ``input_limit``."""
    info = _call(address, "Describe", serving_pb2.DescribeRequest(), timeout, token, tls_ca)
    return {
        "workload": info.workload,
        "source_job": info.source_job,
        "input_shape": list(info.input_shape),
        "input_dtype": info.input_dtype,
        "output_shape": list(info.output_shape),
        "output_dtype": info.output_dtype,
        "max_rows": info.max_rows,
        "input_limit": info.input_limit,
    }


class Balancer:
    """Calls a deployment's replicas, balanced by outstanding requests, failing over when one dies.

    ``endpoints`` is a list of ``host:port``, or a callable returning the current list (re-read every ``refresh_s``
    seconds: :meth:`for_job` reads ``GET /api/v1/jobs/{id}/replicas/``). Each call goes to the live replica with
    the fewest calls in flight from this client (ties: the one used least recently). A replica that answers
    ``UNAVAILABLE`` (unreachable, or stopping) is set aside for ``retry_after_s`` and the call goes to the next;
    inference is idempotent, so a retry cannot do harm. ``timeout`` bounds the whole call, retries included. Other
    statuses (``INVALID_ARGUMENT``, ``DEADLINE_EXCEEDED``...) are the caller's answer and raise at once.
    """

    def __init__(self, endpoints: list[str] | Any, *, token: str | None = None,
                 tls_ca: bytes | str | Path | None = None, refresh_s: float = 5.0, retry_after_s: float = 5.0):
        self._source = endpoints
        self.token = token
        self.tls_ca = _ca(tls_ca)
        self.refresh_s = refresh_s
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._endpoints: list[str] = [] if callable(endpoints) else list(endpoints)
        self._read_at = float("-inf")
        self._outstanding: dict[str, int] = {}
        self._down_until: dict[str, float] = {}
        self._used: dict[str, int] = {}
        self._calls = 0
        self.failovers = 0

    @classmethod
    def for_job(cls, api: Any, job_id: str, **options: Any) -> Balancer:
        """A balancer over the replicas of serve job ``job_id``, read through ``api`` (a
        :class:`~components.runtime.client.client.ControlPlaneClient`)."""
        return cls(lambda: api.get(f"jobs/{job_id}/replicas/")["endpoints"], **options)

    def endpoints(self) -> list[str]:
        """The replicas' addresses, re-read from the source when stale."""
        import time

        if callable(self._source) and time.monotonic() - self._read_at >= self.refresh_s:
            fresh = list(self._source())
            with self._lock:
                self._endpoints, self._read_at = fresh, time.monotonic()
        with self._lock:
            return list(self._endpoints)

    def _pick(self, tried: set[str]) -> str | None:
        import time

        now = time.monotonic()
        candidates = [address for address in self.endpoints() if address not in tried]
        with self._lock:
            up = [address for address in candidates if self._down_until.get(address, 0.0) <= now]
            pool = up or candidates  # every replica looked dead: try them anyway
            if not pool:
                return None
            address = min(pool, key=lambda a: (self._outstanding.get(a, 0), self._used.get(a, -1)))
            self._calls += 1
            self._used[address] = self._calls
            self._outstanding[address] = self._outstanding.get(address, 0) + 1
            return address

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        tried: set[str] = set()
        last: ServingError | None = None
        while True:
            address = self._pick(tried)
            if address is None:
                if last is not None:
                    raise last
                raise ServingError(grpc.StatusCode.UNAVAILABLE, "the deployment has no running replica")
            remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                return _call(address, method, request, remaining, self.token, self.tls_ca)
            except ServingError as error:
                if error.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                last = error
                tried.add(address)
                self.failovers += 1
                with self._lock:
                    self._down_until[address] = time.monotonic() + self.retry_after_s
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            finally:
                with self._lock:
                    self._outstanding[address] -= 1

    def predict(self, array_like: Any, *, dtype: str | None = None, timeout: float | None = 10.0) -> np.ndarray:
        """:func:`predict` on the least-loaded live replica."""
        request = serving_pb2.PredictRequest(input=encode(array_like, dtype))
        return decode(self._call("Predict", request, timeout).output)

    def describe(self, timeout: float | None = 5.0) -> dict[str, Any]:
        info = self._call("Describe", serving_pb2.DescribeRequest(), timeout)
        return {"workload": info.workload, "source_job": info.source_job, "input_shape": list(info.input_shape),
                "input_dtype": info.input_dtype, "output_shape": list(info.output_shape),
                "output_dtype": info.output_dtype, "max_rows": info.max_rows, "input_limit": info.input_limit}


__all__ = ["Balancer", "ServingError", "close_channels", "decode", "describe", "encode", "predict", "predict_timed"]
