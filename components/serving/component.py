"""The node side of the ``serve`` kind: :class:`ServeSession`, run in a child process of its own (a whole GPU,
or no sharing service) by :class:`ServeComponent` or hosted by a device's sharing service on a GPU share.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, ClassVar

from components.runtime.contract.component import Component, Progress, Session, never
from components.runtime.contract.context import Context
from components.serving.bind import check_bind_host
from components.serving.spec import ServeSpec

HOST_ENV = "STRATA_SERVING_HOST"  # interface the endpoint binds: a loopback address unless the insecure-bind opt-in
ADVERTISE_ENV = "STRATA_SERVING_ADVERTISE_HOST"  # host published in the job's endpoint
TLS_CERT_ENV = "STRATA_SERVING_TLS_CERT"  # PEM certificate chain: the endpoint serves TLS (with TLS_KEY_ENV)
TLS_KEY_ENV = "STRATA_SERVING_TLS_KEY"
DEFAULT_HOST = "127.0.0.1"
WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]"}


def serving_hosts(authenticated: bool = False) -> tuple[str, str]:
    """``(bind host, advertised host)`` from ``STRATA_SERVING_HOST`` / ``STRATA_SERVING_ADVERTISE_HOST``.

    Without authentication the bind host must be a loopback address unless ``STRATA_SERVING_INSECURE_BIND=1``
    (raises :class:`~components.serving.bind.InsecureBindError`). A wildcard bind host is published as this
    machine's host name: a client cannot dial 0.0.0.0.
    """
    host = os.environ.get(HOST_ENV, "").strip() or DEFAULT_HOST
    if not authenticated:
        check_bind_host(host, source=HOST_ENV)
    advertised = os.environ.get(ADVERTISE_ENV, "").strip()
    if not advertised:
        advertised = socket.gethostname() if host in WILDCARD_HOSTS else host
    return host, advertised


def serving_tls() -> tuple[bytes, bytes] | None:
    """``(certificate chain, private key)`` PEM from ``STRATA_SERVING_TLS_CERT`` / ``STRATA_SERVING_TLS_KEY`` on
    the node; None when neither is set. One without the other, or an unreadable file, is a ValueError."""
    cert, key = (os.environ.get(name, "").strip() for name in (TLS_CERT_ENV, TLS_KEY_ENV))
    if not cert and not key:
        return None
    if not cert or not key:
        raise ValueError(f"TLS needs both {TLS_CERT_ENV} and {TLS_KEY_ENV} set on the node")
    try:
        return open(cert, "rb").read(), open(key, "rb").read()
    except OSError as error:
        raise ValueError(f"cannot read the serving TLS files: {error}") from error


class ServeSession(Session):
    """One ``serve`` attempt as a session: the same code in a child process and inside a device's sharing
    service. It is not stepped: :meth:`attach` registers the model as an inference endpoint of an executor (a
    lane of its own) and starts its gRPC server; it then answers ``Predict`` calls until it is stopped.

    - :meth:`prepare` loads the source job's ``model.pt`` (a download, off the device thread);
    - :meth:`attach` starts serving and publishes the address (``ctx.endpoint.publish``); hosted, it also starts a
      thread running :meth:`serve_until_stopped`;
    - :meth:`serve_until_stopped` reports ``requests``, ``errors``, ``p50_ms``, ``p99_ms``, ``slo_attainment``,
      ``queue_depth``, ``mean_batch``, ``throughput_rps``, ``dropped_early`` and ``batches`` every
      ``metrics_every_s`` seconds until ``ctx.should_stop()`` (or the model stops serving on its own:
      :attr:`problem`), then stops the endpoint;
    - :meth:`interrupt` (the host was told to stop it) and :meth:`settle` stop the endpoint (calls in flight
      get ``stop_grace_s``), and :meth:`settle` logs what it served. A stopped serve attempt has done its work.
    """

    def __init__(self, ctx: Context, spec: dict[str, Any], *, hosted: bool = False, metrics_every_s: float = 2.0,
                 stop_poll_s: float = 0.1, stop_grace_s: float = 2.0):
        self.ctx = ctx
        self.spec = spec
        self.hosted = hosted
        self.metrics_every_s = metrics_every_s
        self.stop_poll_s = stop_poll_s
        self.stop_grace_s = stop_grace_s
        # A refused bind fails the attempt before anything loads.
        self.host, self.advertised = serving_hosts(authenticated=spec.get("auth", "token") == "token")
        self.tls = serving_tls()
        self.gate: Any = None
        self.served: Any = None
        self.handle: Any = None
        self.problem: str | None = None  # why the model stopped serving on its own
        self._asked_to_stop = False
        self._reporter: threading.Thread | None = None
        self.controller: Any = None  # a ReplicaController, for a deployment of several replicas
        self._controller: threading.Thread | None = None
        self._settled = False

    def prepare(self) -> None:
        if self.served is None:
            from components.serving.model import load_served_model, load_user_model

            entrypoint = (self.spec.get("model") or {}).get("entrypoint")
            path = self.ctx.source_artifact("model.pt")
            if entrypoint:
                self.served = load_user_model(path, entrypoint)
                return
            try:
                # A team's exported program is its code: loaded only in a process of this job's own (a child
                # process, in the node's sandbox), never in the GPU-sharing service next to other teams' jobs.
                self.served = load_served_model(path, allow_program=not self.hosted)
            except ValueError as error:
                if self.hosted:
                    raise
                from components.runtime.contract.project import UserError

                raise UserError(f"the model of job {self.spec['model']['job']} cannot be served: {error}") from None

    def step(self, should_yield=never) -> Progress:
        raise RuntimeError("a ServeSession serves through its executor once attached; it has no step()")

    def attach(self, executor: Any, name: str, *, priority: int = 0, weight: float = 1.0) -> Any:
        from components.serving.endpoint import Batching, start_serving

        self.prepare()
        source = self.spec["model"]["job"]
        batching = Batching.from_spec(self.spec["batching"])
        if self.spec.get("auth", "token") == "token" and self.gate is None:
            from components.runtime.shared.tokens import TokenGate

            self.gate = TokenGate(self.ctx.identity.token_digests, name=f"serve-{self.ctx.attempt_id[:8]}").start()
        try:
            self.handle = start_serving(
                executor, name, self.served, host=self.host, port=self.spec["port"],
                request_timeout_s=ServeSpec.default_deadline_s(self.spec), max_rows=self.spec["max_rows"],
                source_job=source, advertise_host=self.advertised, priority=priority, batching=batching,
                gate=self.gate, tls=self.tls, emoe=self.spec.get("emoe"),
            )
        except BaseException:
            self._stop_gate()
            raise
        served = self.served
        self.ctx.endpoint.publish(self.handle.address)
        length = " (or shorter, variable length)" if served.variable_length else ""
        security = ("callers need a deployment token (strata job-token create " + self.ctx.job_id + ")"
                    if self.gate is not None else "no authentication (auth: none)")
        security += ", TLS" if self.tls else ", plaintext"
        self.ctx.log(
            f"serving {served.workload} of job {source} on {self.handle.address} ({executor.device}): rows of "
            f"{list(served.input_shape)}{length} {served.input_dtype} -> {list(served.output_shape)}, up to "
            f"{self.spec['max_rows']} rows per request; {batching.policy} batching of up to {batching.max_batch} "
            f"requests, {batching.max_queue} queued at most; {security}"
        )
        if self.spec.get("replicas", 1) > 1 or self.spec.get("autoscale"):
            self._start_controller()
        if self.hosted:
            self._reporter = threading.Thread(target=self.serve_until_stopped, daemon=True,
                                              name=f"serve-{self.ctx.attempt_id[:8]}")
            self._reporter.start()
        return self.handle.admission

    def replica_job(self) -> dict[str, Any]:
        """The child job of one more replica: this job's spec (one replica) on a device like this one's."""
        device = self.ctx.devices[0] if self.ctx.devices else None
        if device is not None and device.share > 0:
            resources: dict[str, Any] = {"gpus": float(device.share)}
        elif device is not None:
            resources = {"gpus": 0, "gpu_memory": int(device.memory)}
        else:
            resources = {"gpus": 1.0}
        return {"name": f"replica-of-{self.ctx.job_id[:8]}", "kind": "serve", "resources": resources,
                "spec": ServeSpec.replica_spec(self.spec), "max_attempts": 3}

    def _start_controller(self) -> None:
        from components.serving.replicas import ReplicaController

        self.controller = ReplicaController(self.ctx, self.spec, self.handle.endpoint.stats, self.replica_job)
        self._controller = threading.Thread(
            target=self.controller.run, args=(lambda: self.ctx.should_stop() or self.handle.stopped,),
            daemon=True, name=f"serve-replicas-{self.ctx.attempt_id[:8]}")
        self._controller.start()

    def serve_until_stopped(self) -> None:
        """Report the endpoint's figures until the attempt is asked to stop, then stop the endpoint. Returns
        early, with :attr:`problem` set, when the model stops serving on its own."""
        step = 0
        last_report = time.monotonic()
        handle = self.handle
        while not self.ctx.should_stop() and not handle.stopped:
            time.sleep(self.stop_poll_s)
            if time.monotonic() - last_report < self.metrics_every_s:
                continue
            last_report = time.monotonic()
            problem = handle.failed()
            if problem is not None:
                self.problem = problem
                return
            step += 1
            self.ctx.metrics(self._metrics(handle.stats()), step)
        self.ctx.metrics(self._metrics(handle.stats()), step + 1)
        handle.stop(self.stop_grace_s)

    def _stop_gate(self) -> None:
        if self.gate is not None:
            self.gate.stop()
            self.gate = None

    def interrupt(self, hard: bool = False) -> None:
        self._asked_to_stop = True
        if self.handle is not None:
            self.handle.stop(self.stop_grace_s)

    def stopped_on_request(self) -> bool:
        return self._asked_to_stop or self.ctx.should_stop()

    def settle(self, timeout: float | None = None) -> None:
        if self.handle is None or self._settled:
            return
        self._settled = True
        self.handle.stop(self.stop_grace_s)
        self._stop_gate()
        for thread in (self._reporter, self._controller):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout if timeout is not None else self.stop_grace_s + 10.0)
        stats = self.handle.stats()
        self.ctx.log(f"stopped serving after {stats['requests']} requests ({stats['errors']} errors)")

    @staticmethod
    def _metrics(stats: dict[str, Any]) -> dict[str, float]:
        statuses = stats.get("errors_by_status", {})
        values = {"requests": float(stats["requests"]), "errors": float(stats["errors"]),
                  # Cumulative: a deployment's controller takes differences over its windows.
                  "answered_ok": float(stats["requests"] - stats["errors"]),
                  "missed": float(statuses.get("DEADLINE_EXCEEDED", 0) + statuses.get("RESOURCE_EXHAUSTED", 0))}
        for name in ("p50_ms", "p99_ms", "slo_attainment", "queue_depth", "mean_batch", "throughput_rps",
                     "dropped_early", "batches"):
            if stats.get(name) is not None:
                values[name] = float(stats[name])
        for name, value in (stats.get("emoe") or {}).items():
            if name in ("resident_bytes", "resident_experts", "hit_rate", "loads", "perplexity", "resident_fraction"):
                if value is not None:
                    values[f"emoe_{name}"] = float(value)
        return values


class ServeComponent(Component):
    """Runs one attempt of a ``serve`` job: the ``model.pt`` of a finished train job, served over gRPC.

    Both paths run a :class:`ServeSession`. In a child process (a whole GPU, or no sharing service),
    :meth:`run` attaches it to a private :class:`~components.gpushare.executor.DeviceExecutor` on the attempt's
    device (its memory budget is the device's grant) and serves until ``ctx.should_stop()``; then calls in
    flight get ``stop_grace_s`` to finish, and ``run`` returns: a cancelled serve job has done its work. If
    the model stops serving on its own (it failed on the device), ``run`` raises, so the attempt fails. On a
    GPU share the device's sharing service takes the session from :meth:`session` (``hosted=True``) and
    attaches it to the device's shared executor, next to training jobs. There is nothing to checkpoint: a new
    attempt serves the same model again.
    """

    kind: ClassVar[str] = ServeSpec.kind
    hostable: ClassVar[bool] = True
    metrics_every_s: ClassVar[float] = 2.0
    stop_poll_s: ClassVar[float] = 0.1
    stop_grace_s: ClassVar[float] = 2.0

    def session(self, ctx: Context, *, hosted: bool = False) -> ServeSession:
        spec: dict[str, Any] = ServeSpec().validate(ctx.spec)
        ctx.spec = spec
        return ServeSession(ctx, spec, hosted=hosted, metrics_every_s=self.metrics_every_s,
                            stop_poll_s=self.stop_poll_s, stop_grace_s=self.stop_grace_s)

    def run(self, ctx: Context) -> None:
        session = self.session(ctx)
        from components.runtime.contract.component import torch_threads

        threads = torch_threads()
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        import torch

        from components.gpushare.executor import DeviceExecutor

        torch.set_num_threads(threads)
        session.prepare()
        budget = (ctx.devices[0].memory or None) if ctx.devices else None
        label = f"{ctx.devices[0].kind}:{ctx.devices[0].index}" if ctx.devices else None
        # FIFO: the endpoint is the executor's only job, so the policy never has a choice to make.
        executor = DeviceExecutor(ctx.torch_device, memory_budget=budget, policy="fifo", name=label)
        try:
            session.attach(executor, f"serve-{ctx.attempt_id}")
            try:
                session.serve_until_stopped()
            finally:
                session.settle()
            if session.problem is not None:
                raise RuntimeError(f"the served model stopped: {session.problem}")
        finally:
            executor.shutdown(cancel=True, timeout=self.stop_grace_s + 5.0)
