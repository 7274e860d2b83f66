"""The context an attempt's child process runs in: reports go to the control plane over REST.

Logs and metrics are buffered and flushed by a background thread twice a second. Each flush also tells the
child whether the control plane wants it to stop (cancel or preemption), so ``should_stop`` reacts within
about a second even when the worker's own poll is slower.
"""

from __future__ import annotations

import logging
import math
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.runtime.client import transfers
from components.runtime.client.client import ApiError, ControlPlaneClient, storable_text
from components.runtime.contract.context import (
    Children,
    Context,
    DeviceHandle,
    Endpoint,
    Identity,
    LocalContext,
    Rendezvous,
)

log = logging.getLogger(__name__)


@dataclass
class RemoteContext(Context):
    client: ControlPlaneClient | None = None
    node_id: str = ""
    token: str = ""
    address: str = ""  # the address this node registered (where a rank's listeners bind)
    flush_seconds: float = 0.5
    _logs: list = field(default_factory=list, repr=False)
    _metrics: list = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # One flush at a time, so that a flush returns only when what was reported before it reached the control plane
    # (a checkpoint's upload flushes first: the steps it holds are on record before it, for the lost-work record).
    _flushing: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)
    stale: bool = False
    _endpoint: str | None = field(default=None, repr=False)
    _reports: dict = field(default_factory=dict, repr=False)  # plugin -> latest payload, until sent
    _sources: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    # The attempt credential's expiry (unix s; 0: none to renew) and when it was issued: renewed half-way.
    credential_expires: float = 0.0
    _credential_issued: float = field(default_factory=time.time, repr=False)

    def parts(self) -> tuple[Children, Rendezvous, Identity, Endpoint]:
        return RemoteChildren(self), RemoteRendezvous(self), RemoteIdentity(self), RemoteEndpoint(self)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._flush_loop, name="strata-report", daemon=True)
        self._thread.start()

    def _path(self, suffix: str) -> str:
        return f"node/attempts/{self.attempt_id}/{suffix}"

    def _auth(self) -> dict:
        return {"node": self.node_id, "token": self.token}

    def log(self, message: str, level: str = "info") -> None:
        if self.world_size > 1:
            message = f"[rank {self.rank}] {message}"
        with self._lock:
            self._logs.append({"level": storable_text(str(level))[:16], "message": storable_text(str(message))})

    def metrics(self, values: dict[str, float], step: int) -> None:
        points = [{"name": storable_text(str(name)), "step": int(step), "value": float(value)}
                  for name, value in values.items()]
        bad = [point["name"] for point in points if not math.isfinite(point["value"])]
        with self._lock:
            self._metrics.extend(point for point in points if math.isfinite(point["value"]))
            if bad:  # JSON has no NaN or infinity: say so in the log rather than lose the whole report
                self._logs.append({"level": "warning",
                                   "message": f"step {int(step)}: {', '.join(bad)} not finite; not recorded"})

    def flush(self) -> None:
        with self._flushing:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            logs, metrics, reports = self._logs, self._metrics, self._reports
            self._logs, self._metrics, self._reports = [], [], {}
            endpoint = {"endpoint": self._endpoint} if self._endpoint else {}
        extra = {**endpoint, **({"reports": reports} if reports else {})}
        try:
            answer = self.client.post(self._path("report/"), {**self._auth(), "logs": logs, "metrics": metrics,
                                                              **extra})
        except ApiError as error:
            if error.status == 409:  # this attempt was ended by the control plane: stop at once
                self.stale = True
                self.request_stop()
                return
            if error.status == 400:  # the control plane will never take this batch: drop it, keep running
                log.warning("report refused, %d log lines and %d metrics dropped: %s", len(logs), len(metrics), error)
                return
            with self._lock:  # keep them for the next flush (a newer report of a plugin wins)
                self._logs[:0], self._metrics[:0] = logs, metrics
                self._reports = {**reports, **self._reports}
            log.warning("report failed, will retry: %s", error)
            return
        if answer and answer.get("stop"):
            self.request_stop()

    def renew_credential(self) -> None:
        """Swap the attempt credential for a fresh one (``POST renew/``). A failure is logged and tried again on the
        next flush; a 409 (the attempt ended) stops the attempt."""
        try:
            answer = self.client.post(self._path("renew/"), self._auth(), retries=1)
        except ApiError as error:
            if error.status == 409:
                self.stale = True
                self.request_stop()
            log.warning("the attempt credential was not renewed, will retry: %s", error)
            return
        self.client.session.headers["Authorization"] = f"Bearer {answer['credential']}"
        self._credential_issued, self.credential_expires = time.time(), float(answer["expires"])

    def _renew_due(self) -> bool:
        if not self.credential_expires:
            return False
        return time.time() >= self._credential_issued + (self.credential_expires - self._credential_issued) / 2

    def _flush_loop(self) -> None:
        while not self._closed.wait(self.flush_seconds):
            if self._renew_due():
                self.renew_credential()
            self.flush()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
        if self._sources is not None:
            self._sources.cleanup()

    def report(self, plugin: str, payload: dict[str, Any]) -> None:
        with self._lock:
            self._reports[str(plugin)] = payload

    def source_artifact(self, name: str = "model.pt") -> Path:
        if self._sources is None:
            self._sources = tempfile.TemporaryDirectory(prefix="strata-source-")
        target = Path(self._sources.name) / name
        if not target.exists() and not transfers.download(self.client, self._path(f"sources/{name}/"),
                                                          self._auth(), target):
            raise FileNotFoundError(f"the source job has no artifact {name!r}")
        return target

    def artifact(self, path: str | Path, name: str | None = None, kind: str = "artifact") -> None:
        source = Path(path)
        transfers.upload(self.client, self._path(""), self._auth(), source, name or source.name, kind,
                         progress=self.log)

    def _save_checkpoint_bytes(self, data: bytes) -> None:
        self.flush()
        transfers.upload_bytes(self.client, self._path(""), self._auth(), data, "checkpoint.pt", "checkpoint")

    def _save_checkpoint_file(self, path: Path) -> None:
        self.flush()
        transfers.upload(self.client, self._path(""), self._auth(), Path(path), "checkpoint.pt", "checkpoint",
                         progress=self.log)

    def _load_checkpoint_bytes(self) -> bytes | None:
        with tempfile.TemporaryDirectory(prefix="strata-checkpoint-") as directory:
            target = Path(directory) / "checkpoint"
            return target.read_bytes() if self._load_checkpoint_file(target) else None

    def _load_checkpoint_file(self, target: Path) -> bool:
        return transfers.download(self.client, self._path("checkpoint/"), self._auth(), Path(target))


class RemoteChildren(Children):
    """Child jobs through the attempt's ``children/`` routes."""

    ctx: RemoteContext

    def _post(self, suffix: str, body: dict[str, Any] | None = None) -> Any:
        ctx = self.ctx
        return ctx.client.post(ctx._path(f"children/{suffix}"), {**ctx._auth(), **(body or {})})

    def submit(self, job: dict[str, Any], idempotency_key: str | None = None, *, nested: bool = False,
               checkpoint_from: str | None = None) -> dict[str, Any]:
        try:
            return self._post("", {"job": job, "idempotency_key": idempotency_key, "nested": bool(nested),
                                   "checkpoint_from": checkpoint_from})
        except ApiError as error:
            if error.status == 400:
                raise ValueError(f"the child job was refused: {error}") from None
            raise

    def list(self) -> list[dict[str, Any]]:
        return self.ctx.client.get(self.ctx._path("children/"), params=self.ctx._auth())

    def cancel(self, job_id: str, reason: str = "") -> dict[str, Any]:
        return self._post(f"{job_id}/cancel/", {"reason": reason[:300]})

    def hold(self, job_id: str, reason: str = "") -> dict[str, Any]:
        return self._post(f"{job_id}/hold/", {"reason": reason})

    def release(self, job_id: str, reason: str = "") -> dict[str, Any]:
        return self._post(f"{job_id}/release/", {"reason": reason})

    def resize(self, job_id: str, resources: dict[str, Any], reason: str = "") -> dict[str, Any]:
        try:
            return self._post(f"{job_id}/resize/", {"resources": resources, "reason": reason})
        except ApiError as error:
            if error.status == 400:
                raise ValueError(f"the resize was refused: {error}") from None
            raise

    def metrics(self, job_id: str, after: int = 0) -> dict[str, Any]:
        ctx = self.ctx
        return ctx.client.get(ctx._path(f"children/{job_id}/metrics/"), params={**ctx._auth(), "after": after})

    def metrics_of(self, after: dict[str, int]) -> dict[str, dict[str, Any]]:
        if not after:
            return {}
        return self._post("metrics/", {"after": after})["children"]

    def batch(self, *, submit: list[dict[str, Any]] | None = None, start: list[str] | None = None,
              metrics: dict[str, list[dict[str, Any]]] | None = None,
              logs: dict[str, list[dict[str, Any]]] | None = None, end: dict[str, dict[str, str]] | None = None,
              watch: list[str] | None = None) -> dict[str, Any]:
        body = {"submit": submit or [], "start": start or [], "metrics": metrics or {}, "logs": logs or {},
                "end": end or {}, "watch": watch or []}
        try:
            return self._post("batch/", body)
        except ApiError as error:
            if error.status == 400:
                raise ValueError(f"the children's batch was refused: {error}") from None
            raise

    def put_file(self, job_id: str, name: str, data: bytes, kind: str = "artifact") -> None:
        ctx = self.ctx
        ctx.client.request("PUT", ctx._path(f"children/{job_id}/files/{name}/"), data=data,
                           params={**ctx._auth(), "kind": kind},
                           headers={"Content-Type": "application/octet-stream"}, timeout=600)

    def checkpoint_of(self, job_id: str) -> bytes | None:
        with tempfile.TemporaryDirectory(prefix="strata-child-checkpoint-") as directory:
            target = Path(directory) / "checkpoint"
            found = transfers.download(self.ctx.client, self.ctx._path(f"children/{job_id}/checkpoint/"),
                                       self.ctx._auth(), target)
            return target.read_bytes() if found else None


class RemoteRendezvous(Rendezvous):
    """The attempt's ``rendezvous/`` route: rank 0 publishes, the others poll."""

    ctx: RemoteContext

    def node_address(self) -> str | None:
        return self.ctx.address or None

    def publish(self, port: int, suffix: str = "") -> str:
        ctx = self.ctx
        answer = ctx.client.post(ctx._path("rendezvous/"), {**ctx._auth(), "port": int(port),
                                                             **({"suffix": suffix} if suffix else {})})
        return str(answer["address"])

    def nodes(self) -> list[str]:
        ctx = self.ctx
        try:
            answer = ctx.client.request("GET", ctx._path("rendezvous/"), params=ctx._auth(), timeout=30)
        except ApiError:
            return []
        return [str(name) for name in answer.get("nodes") or []]

    def address(self, timeout: float = 300.0) -> str:
        ctx = self.ctx
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            try:
                answer = ctx.client.request("GET", ctx._path("rendezvous/"), params=ctx._auth(), timeout=30)
            except ApiError as error:
                if error.status in (404, 409):  # the attempt ended: its ranks stop waiting
                    raise RuntimeError(f"no rendezvous: {error}") from error
                answer = {}
            if answer.get("address"):
                return str(answer["address"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not publish its address in {timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)


class RemoteIdentity(Identity):
    """The job's tokens and credentials from the attempt's ``tokens/`` and ``credential/`` routes."""

    ctx: RemoteContext

    def token_digests(self) -> list[str]:
        ctx = self.ctx
        answer = ctx.client.request("GET", ctx._path("tokens/"), params=ctx._auth(), timeout=30)
        return [str(digest) for digest in answer.get("digests", [])]

    def credential(self, subject: str) -> dict[str, Any]:
        ctx = self.ctx
        try:
            return ctx.client.post(ctx._path("credential/"), {**ctx._auth(), "subject": subject})
        except ApiError as error:
            if error.status == 400:
                raise ValueError(f"no credential for {subject[:40]!r}: {error}") from None
            raise


class RemoteEndpoint(Endpoint):
    """Sent with every report, so the control plane learns it on the next flush (and again after a failed one)."""

    ctx: RemoteContext

    def publish(self, address: str) -> None:
        with self.ctx._lock:
            self.address = self.ctx._endpoint = address
        self.ctx.log(f"listening on {address}")


def context_from_payload(payload: dict[str, Any], *, narrowed: bool = True, local_root: str | Path | None = None,
                         start: bool = True) -> Context:
    """The Context of one attempt rank, from its payload (the claim, with its attempt ``credential``, plus
    ``server``, ``node``, ``fencing_token``, ``rank``, ``device`` and, for a rank given several devices,
    ``devices``): the one place both execution paths build it.

    ``narrowed``: ``CUDA_VISIBLE_DEVICES`` was narrowed to the granted device (a child process), so a CUDA
    device is ``cuda:0`` here; a host that sees every device (``narrowed=False``) keeps its index.
    ``local_root`` (tests): a :class:`LocalContext` under ``local_root/<attempt>`` instead of the control plane,
    with ``payload["sources"]`` (name -> local path) as the source job's artifacts. A remote context's report
    thread is started unless ``start`` is False.
    """
    granted = payload.get("devices") or ([payload["device"]] if payload.get("device") else [])
    devices, cuda = [], 0
    for device in granted:
        index = int(device["index"])
        if narrowed and device["kind"] == "cuda":  # renumbered from 0 in CUDA_VISIBLE_DEVICES' order
            index, cuda = cuda, cuda + 1
        devices.append(DeviceHandle(kind=device["kind"], index=index, memory=int(device["memory"]),
                                    share=float(device["share"])))
    common = {"job_id": payload["job"], "attempt_id": payload["attempt"], "spec": payload["spec"],
              "devices": devices, "rank": int(payload.get("rank", 0)), "world_size": int(payload.get("world_size", 1))}
    if local_root is not None:
        return LocalContext(**common, workdir=Path(local_root) / str(payload["attempt"]),
                            sources={name: Path(path) for name, path in (payload.get("sources") or {}).items()})
    # The attempt credential (never the node's token): it opens this attempt's own routes only, and is renewed.
    credential = payload["credential"]
    client = ControlPlaneClient(payload["server"], credential["credential"], retries=5)
    context = RemoteContext(**common, client=client, node_id=payload["node"], token=payload["fencing_token"],
                            address=payload.get("node_address") or "",
                            credential_expires=float(credential.get("expires") or 0))
    if start:
        context.start()
    return context
