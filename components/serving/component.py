"""The node side of the ``serve`` kind in a child process of its own (a whole GPU, or no sharing service).

On a GPU share the device's sharing service runs the same :func:`~components.serving.endpoint.start_serving`
on its shared executor instead; this component is the path where the attempt has the device to itself.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, ClassVar

from components.runtime.component import Component
from components.runtime.context import Context
from components.serving.spec import ServeSpec

HOST_ENV = "STRATA_SERVING_HOST"  # interface the endpoint binds; 0.0.0.0 to serve other machines
ADVERTISE_ENV = "STRATA_SERVING_ADVERTISE_HOST"  # host published in the job's endpoint
DEFAULT_HOST = "127.0.0.1"
WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]"}


def serving_hosts() -> tuple[str, str]:
    """``(bind host, advertised host)`` from ``STRATA_SERVING_HOST`` / ``STRATA_SERVING_ADVERTISE_HOST``.

    A wildcard bind host is published as this machine's host name: a client cannot dial 0.0.0.0.
    """
    host = os.environ.get(HOST_ENV, "").strip() or DEFAULT_HOST
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
    metrics_every_s: ClassVar[float] = 2.0
    stop_poll_s: ClassVar[float] = 0.1
    stop_grace_s: ClassVar[float] = 2.0

    def run(self, ctx: Context) -> None:
        spec: dict[str, Any] = ServeSpec().validate(ctx.spec)
        ctx.spec = spec
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
            host, advertised = serving_hosts()
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
