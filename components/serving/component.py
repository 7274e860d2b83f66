"""The node side of the ``serve`` kind in a child process of its own (a whole GPU, or no sharing service).

On a GPU share the device's sharing service runs the same :func:`~components.serving.endpoint.start_serving`
on its shared executor instead; this component is the path where the attempt has the device to itself.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from typing import Any, ClassVar

from components.runtime.component import Component
from components.runtime.context import Context
from components.serving.spec import ServeSpec

log = logging.getLogger(__name__)

HOST_ENV = "STRATA_SERVING_HOST"  # interface the endpoint binds: a loopback address unless INSECURE_BIND_ENV
ADVERTISE_ENV = "STRATA_SERVING_ADVERTISE_HOST"  # host published in the job's endpoint
# The endpoint has no authentication yet: binding a non-loopback interface is an operator's explicit choice.
INSECURE_BIND_ENV = "STRATA_SERVING_INSECURE_BIND"
DEFAULT_HOST = "127.0.0.1"
WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]"}
_TRUE = {"1", "true", "yes", "on"}


class InsecureBindError(ValueError):
    """The endpoint was asked to bind a non-loopback interface without the explicit opt-in."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and the loopback addresses (127.0.0.0/8, ::1, also as ``[::1]`` or IPv4-mapped)."""
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # another host name: it could resolve to anything
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def insecure_bind_allowed() -> bool:
    """Whether the node's operator opted in to a non-loopback bind (``STRATA_SERVING_INSECURE_BIND=1``)."""
    return os.environ.get(INSECURE_BIND_ENV, "").strip().lower() in _TRUE


def check_bind_host(host: str, *, insecure: bool | None = None, source: str = "") -> None:
    """Refuse to serve on ``host`` unless it is a loopback address or ``insecure`` (default: the environment's
    opt-in) allows it: the endpoint has no authentication yet, so anyone who can reach the port could call
    the model. Raises :class:`InsecureBindError` naming the fix."""
    if is_loopback(host):
        return
    if insecure is None:
        insecure = insecure_bind_allowed()
    if insecure:
        log.warning("the serving endpoint binds %r, which is not a loopback address, and has no authentication: "
                    "any process that can reach the port can call the model (%s is set)", host, INSECURE_BIND_ENV)
        return
    origin = f" (from {source})" if source else ""
    raise InsecureBindError(
        f"the serving endpoint will not bind {host!r}{origin}: it has no authentication yet, so it listens on a "
        f"loopback address only (127.0.0.1, ::1 or localhost). Set {INSECURE_BIND_ENV}=1 on the node to bind "
        f"{host!r} anyway; then any process that can reach the port can call the model"
    )


def serving_hosts() -> tuple[str, str]:
    """``(bind host, advertised host)`` from ``STRATA_SERVING_HOST`` / ``STRATA_SERVING_ADVERTISE_HOST``.

    The bind host must be a loopback address unless ``STRATA_SERVING_INSECURE_BIND=1`` (raises
    :class:`InsecureBindError`). A wildcard bind host is published as this machine's host name: a client
    cannot dial 0.0.0.0.
    """
    host = os.environ.get(HOST_ENV, "").strip() or DEFAULT_HOST
    check_bind_host(host, source=HOST_ENV)
    advertised = os.environ.get(ADVERTISE_ENV, "").strip()
    if not advertised:
        advertised = socket.gethostname() if host in WILDCARD_HOSTS else host
    return host, advertised


class ServeComponent(Component):
    """Runs one attempt of a ``serve`` job: the ``model.pt`` of a finished train job, served over gRPC.

    ``run`` rebuilds the model from ``ctx.source_artifact("model.pt")``, registers it in a private
    :class:`~components.gpushare.executor.DeviceExecutor` on the attempt's device (its memory budget is the
    device's grant), starts the gRPC endpoint (:func:`~components.serving.endpoint.start_serving`),
    publishes its address with ``ctx.set_endpoint`` and serves until ``ctx.should_stop()``, reporting
    ``requests``, ``errors``, ``p50_ms`` and ``p99_ms`` every ``metrics_every_s`` seconds. Then calls in
    flight get ``stop_grace_s`` to finish, and ``run`` returns: a cancelled serve job has done its work.
    If the model stops serving on its own (it failed on the device), ``run`` raises, so the attempt fails.
    There is nothing to checkpoint: a new attempt serves the same model again.
    """

    kind: ClassVar[str] = ServeSpec.kind
    hostable: ClassVar[bool] = True
    metrics_every_s: ClassVar[float] = 2.0
    stop_poll_s: ClassVar[float] = 0.1
    stop_grace_s: ClassVar[float] = 2.0

    def run(self, ctx: Context) -> None:
        spec: dict[str, Any] = ServeSpec().validate(ctx.spec)
        ctx.spec = spec
        host, advertised = serving_hosts()  # a refused bind fails the attempt before anything is loaded
        from components.train.component import torch_threads

        threads = torch_threads()
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        import torch

        from components.gpushare.executor import DeviceExecutor
        from components.serving.endpoint import start_serving
        from components.serving.model import load_served_model

        torch.set_num_threads(threads)
        source = spec["model"]["job"]
        served = load_served_model(ctx.source_artifact("model.pt"))
        budget = (ctx.devices[0].memory or None) if ctx.devices else None
        label = f"{ctx.devices[0].kind}:{ctx.devices[0].index}" if ctx.devices else None
        # FIFO: the endpoint is the executor's only job, so the policy never has a choice to make.
        executor = DeviceExecutor(ctx.torch_device, memory_budget=budget, policy="fifo", name=label)
        try:
            handle = start_serving(
                executor, f"serve-{ctx.attempt_id}", served, host=host, port=spec["port"],
                request_timeout_s=spec["request_timeout_s"], max_rows=spec["max_rows"], source_job=source,
                advertise_host=advertised,
            )
            try:
                ctx.set_endpoint(handle.address)
                ctx.log(
                    f"serving {served.workload} of job {source} on {handle.address} ({ctx.torch_device}): rows of "
                    f"{list(served.input_shape)} {served.input_dtype} -> {list(served.output_shape)}, up to "
                    f"{spec['max_rows']} rows per request"
                )
                self._serve_until_stopped(ctx, handle)
            finally:
                handle.stop(self.stop_grace_s)
            stats = handle.stats()
            ctx.log(f"stopped serving after {stats['requests']} requests ({stats['errors']} errors)")
        finally:
            executor.shutdown(cancel=True, timeout=self.stop_grace_s + 5.0)

    def _serve_until_stopped(self, ctx: Context, handle) -> None:
        step = 0
        last_report = time.monotonic()
        while not ctx.should_stop():
            time.sleep(self.stop_poll_s)
            if time.monotonic() - last_report < self.metrics_every_s:
                continue
            last_report = time.monotonic()
            problem = handle.failed()
            if problem is not None:
                raise RuntimeError(f"the served model stopped: {problem}")
            step += 1
            ctx.metrics(self._metrics(handle.stats()), step)
        ctx.metrics(self._metrics(handle.stats()), step + 1)

    @staticmethod
    def _metrics(stats: dict[str, Any]) -> dict[str, float]:
        values = {"requests": float(stats["requests"]), "errors": float(stats["errors"])}
        for name in ("p50_ms", "p99_ms"):
            if stats[name] is not None:
                values[name] = float(stats[name])
        return values
