"""The context an attempt runs in, and its local twin for tests and local runs."""

from __future__ import annotations

import abc
import io
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.runtime.contract.distributed import check_rendezvous_suffix

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class DeviceHandle:
    """A device granted to an attempt: a CUDA device, or a virtual GPU backed by the CPU."""

    kind: str  # "cuda" or "virtual"
    index: int
    memory: int  # bytes the attempt may use on it
    share: float = 1.0  # fraction of the device granted

    @property
    def virtual(self) -> bool:
        return self.kind != "cuda"

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"


class Facet:
    """One part of a :class:`Context`: ``ctx.children``, ``ctx.gang``, ``ctx.identity`` or ``ctx.endpoint``.

    A facet holds its context (``self.ctx``). The base classes answer as a context without that part does (an
    empty list, or ``NotImplementedError``); each kind of context composes its own twins: :class:`LocalContext`'s
    here, the node's in :mod:`components.runtime.client.remote`, a volunteer's in :mod:`components.runtime.client.participant`.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def _none(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self.ctx).__name__} has no {what}")


# The parts of Children.batch (aliases: inside the class, ``list`` is its method).
_Items = list[dict[str, Any]]
_Ids = list[str]
_ById = dict[str, list[dict[str, Any]]]


class Children(Facet):
    """``ctx.children``: the job's child jobs (a sweep's trials, a deployment's replicas), jobs of the same team
    under the same checks and quota."""

    def submit(self, job: dict[str, Any], idempotency_key: str | None = None, *, nested: bool = False,
               checkpoint_from: str | None = None) -> dict[str, Any]:
        """Submit a child job (the body ``POST /api/v1/jobs/`` takes, without ``team``); returns its summary
        ``{"id", "name", "kind", "state", "reason", "parent", "nested", "held", "resources", "failures"}``. A bad
        body raises ``ValueError`` naming the fields. ``nested``: it runs inside this attempt's own allocation
        (admitted without the team's quota, placed only on the devices this attempt holds). ``checkpoint_from``
        (another child's id): the new child starts from a copy of that child's latest checkpoint; ``ValueError``
        when it has none yet."""
        raise self._none("child jobs")

    def list(self) -> list[dict[str, Any]]:
        """This job's child jobs, oldest first (their summaries, with the current state)."""
        raise self._none("child jobs")

    def cancel(self, job_id: str, reason: str = "") -> dict[str, Any]:
        """Cancel one of this job's child jobs; returns its summary. ``reason`` (at most 300 characters) is what
        the child's page and ``strata jobs`` show, e.g. why the parent stopped it; without one they say "cancelled
        by its parent <id>"."""
        raise self._none("child jobs")

    def hold(self, job_id: str, reason: str = "") -> dict[str, Any]:
        """Hold a child: it is never placed until released (a running one stops at a checkpoint first)."""
        raise self._none("child jobs")

    def release(self, job_id: str, reason: str = "") -> dict[str, Any]:
        """Let a held child be placed again."""
        raise self._none("child jobs")

    def resize(self, job_id: str, resources: dict[str, Any], reason: str = "") -> dict[str, Any]:
        """Give a child new resources (a running one stops at a checkpoint and is placed again with them). Bad
        resources raise ``ValueError`` naming the fields."""
        raise self._none("child jobs")

    def metrics(self, job_id: str, after: int = 0) -> dict[str, Any]:
        """A child's summary with its metric points after cursor ``after``: ``{..., "points": [{"id", "name",
        "step", "value", "time", "attempt"}], "cursor"}`` (pass ``cursor`` back as ``after`` for the next ones)."""
        raise self._none("child jobs")

    def metrics_of(self, after: dict[str, int]) -> dict[str, dict[str, Any]]:
        """:meth:`metrics` of many children at once (``{child id: cursor}`` -> ``{child id: answer}``; a job that is
        not a child is left out). The node's twin asks the control plane once."""
        return {job_id: self.metrics(job_id, after=cursor) for job_id, cursor in after.items()}

    # -- children this job runs itself, in processes it already holds (warm workers) -----------------------
    def batch(self, *, submit: _Items | None = None, start: _Ids | None = None, metrics: _ById | None = None,
              logs: _ById | None = None, end: dict[str, dict[str, str]] | None = None,
              watch: _Ids | None = None) -> dict[str, Any]:
        """One round trip about children this job runs *itself*, inside its own allocation (they are recorded,
        visible and cancellable like any job, but never placed by the scheduler):

        - ``submit``: ``[{"job": body, "idempotency_key": key, "start": bool}]``, each a nested child run by this
          job (``start``: running from now on); answered in order in ``"submitted"`` (their summaries);
        - ``start``: ids of such children it starts running now (QUEUED -> RUNNING);
        - ``metrics``/``logs``: ``{id: [{"name", "step", "value"}]}`` / ``{id: [{"message", "level"}]}``, what
          they reported;
        - ``end``: ``{id: {"state", "reason"}}``, SUCCEEDED, FAILED, CANCELLED, or QUEUED (paused at a checkpoint,
          started again later);
        - ``watch``: more ids whose state to answer.

        Answers ``{"submitted": [summary], "started": [id], "ended": [id], "states": {id: {"state", "reason"}}}``
        with the state of every child named, so a cancellation through the API is learnt in the same call.
        Reports about a child that is no longer running are dropped."""
        raise self._none("children it runs itself")

    def put_file(self, job_id: str, name: str, data: bytes, kind: str = "artifact") -> None:
        """Store ``data`` as artifact ``name`` (``kind="checkpoint"``: the checkpoint) of a child this job runs
        itself."""
        raise self._none("children it runs itself")

    def checkpoint_of(self, job_id: str) -> bytes | None:
        """The latest checkpoint of one of this job's children, or None when it has none."""
        raise self._none("children it runs itself")


class Rendezvous(Facet):
    """``ctx.gang``: how the ranks of one attempt find each other (:func:`components.runtime.node.gang.init_gang`)."""

    def node_address(self) -> str | None:
        """The address this rank's node registered with the control plane (where its listeners should bind)."""
        return None

    def publish(self, port: int, suffix: str = "") -> str:
        """Rank 0: announce that this attempt's store listens on ``port`` of this node; returns ``host:port``
        as the other ranks will read it (the host is the address rank 0's node registered). ``suffix``
        (:data:`RENDEZVOUS_SUFFIX`, e.g. ``/p2p/<peer id>`` for a libp2p listener) is appended as given."""
        raise self._none("rendezvous")

    def address(self, timeout: float = 300.0) -> str:
        """Every other rank: wait for rank 0's ``host:port``; TimeoutError after ``timeout`` seconds."""
        raise self._none("rendezvous")

    def nodes(self) -> list[str]:
        """The name of the node running each rank (index = rank), when known; empty otherwise."""
        return []


class Identity(Facet):
    """``ctx.identity``: what the job's workers and callers prove themselves with."""

    def token_digests(self) -> list[str]:
        """SHA-256 hex digests of the job's working access tokens (issued, neither revoked nor expired), for a
        kind whose ``KindSpec.accepts_tokens`` is true to check its callers against
        (:class:`components.runtime.shared.tokens.TokenGate`). None issued: an empty list."""
        return []

    def credential(self, subject: str) -> dict[str, Any]:
        """A short-lived credential, signed with the job's key, that this worker may act as ``subject`` (an
        identity it holds, e.g. ``p2p:<peer id>``; ``components.runtime.shared.credentials.SUBJECT_PATTERN``) in this job:
        ``{"credential", "public_key", "expires", "issued"}``. Other workers of the job check it with
        ``components.runtime.shared.credentials.verify(credential, public_key, job=..., subject=...)``; ask again before
        ``expires``."""
        raise self._none("job credentials")


class Endpoint(Facet):
    """``ctx.endpoint``: where this attempt serves requests (the job's ``endpoint`` field)."""

    address: str | None = None

    def publish(self, address: str) -> None:
        """Publish the ``host:port`` where this attempt serves requests."""
        self.address = address


@dataclass
class Context(abc.ABC):
    """What a component sees while it runs one attempt.

    ``spec`` is the normalized spec of the job's kind; ``devices`` the devices granted to this worker;
    ``rank``/``world_size`` place this worker in a gang. Reporting methods never raise on transport problems:
    they buffer and retry, so a flaky network cannot kill a training run.

    The context is composed (like Determined's ``core.Context``): reporting, checkpoints and stopping are its own
    methods, and the rest are its parts, each with a local twin in :class:`LocalContext` --

    * ``ctx.children`` (:class:`Children`): submit, list, hold, release, resize and cancel child jobs;
    * ``ctx.gang`` (:class:`Rendezvous`): the ranks of one attempt find each other;
    * ``ctx.identity`` (:class:`Identity`): the job's access-token digests and signed job credentials;
    * ``ctx.endpoint`` (:class:`Endpoint`): where the attempt serves requests.

    **Threads.** Any thread of the attempt may call the reporting methods (:meth:`log`, :meth:`metrics`,
    :meth:`report`, :meth:`artifact`), :meth:`should_stop` and every part: they hold their own locks, or only
    send a request. :meth:`checkpoint` and :meth:`restore` are called by one thread at a time (the one that owns
    the training state); :meth:`close` once, by the runtime, when the attempt ends.
    """

    job_id: str
    attempt_id: str
    spec: dict[str, Any]
    devices: list[DeviceHandle] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    children: Children = field(init=False, repr=False)
    gang: Rendezvous = field(init=False, repr=False)
    identity: Identity = field(init=False, repr=False)
    endpoint: Endpoint = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.children, self.gang, self.identity, self.endpoint = self.parts()

    def parts(self) -> tuple[Children, Rendezvous, Identity, Endpoint]:
        """The context's parts (each kind of context composes its own twins)."""
        return Children(self), Rendezvous(self), Identity(self), Endpoint(self)

    @property
    def torch_device(self) -> str:
        """The torch device string for this worker's first device ("cuda:N" or "cpu")."""
        return self.devices[0].torch_device if self.devices else "cpu"

    # -- reporting -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def log(self, message: str, level: str = "info") -> None:
        """Append a log line to the job."""

    @abc.abstractmethod
    def metrics(self, values: dict[str, float], step: int) -> None:
        """Record several named metric values at ``step``."""

    def metric(self, name: str, value: float, step: int) -> None:
        self.metrics({name: value}, step)

    @abc.abstractmethod
    def artifact(self, path: str | Path, name: str | None = None) -> None:
        """Store the file at ``path`` as a job artifact named ``name`` (default: its file name)."""

    # -- inputs from other jobs and served endpoints ------------------------------------------------------
    def source_artifact(self, name: str = "model.pt") -> Path:
        """A local copy of artifact ``name`` of the job this one reads from (the source job its kind's
        ``KindSpec.sources()`` names). Raises :class:`FileNotFoundError` when that job has no such artifact."""
        raise FileNotFoundError(f"{type(self).__name__} has no source job to read {name!r} from")

    def report(self, plugin: str, payload: dict[str, Any]) -> None:  # noqa: B027 -- optional hook
        """Publish this attempt's latest report for ``plugin`` (the generic report channel, checked by the
        plugin's ``ReportSchema.attempt``; read back by panels and routes through ``PanelData.reports``). Only the
        latest payload per plugin is kept and sent with the next flush."""

    # -- checkpoints -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def _save_checkpoint_bytes(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def _load_checkpoint_bytes(self) -> bytes | None: ...

    def _save_checkpoint_file(self, path: Path) -> None:
        """Store the file ``path`` as the checkpoint (contexts that can stream a large file override this)."""
        self._save_checkpoint_bytes(Path(path).read_bytes())

    def _load_checkpoint_file(self, target: Path) -> bool:
        """Write the latest checkpoint to ``target``; False when there is none."""
        data = self._load_checkpoint_bytes()
        if data is None:
            return False
        Path(target).write_bytes(data)
        return True

    def checkpoint(self, state: dict[str, Any]) -> None:
        """Persist ``state`` (tensors allowed) so a later attempt of this job can :meth:`restore` it."""
        import torch

        buffer = io.BytesIO()
        torch.save(state, buffer)
        self._save_checkpoint_bytes(buffer.getvalue())

    def restore(self, *, weights_only: bool = False) -> dict[str, Any] | None:
        """Return the job's latest checkpoint, or None when the job has none yet. ``weights_only``: load it with
        ``torch.load(weights_only=True)`` (tensors, numbers, strings, lists and dicts only; no code runs)."""
        data = self._load_checkpoint_bytes()
        if data is None:
            return None
        import torch

        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)

    # -- stopping --------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    def should_stop(self) -> bool:
        """True once the attempt was cancelled or preempted: checkpoint and return."""
        return self._stop.is_set()

    def flush(self) -> None:  # noqa: B027 -- optional hook, deliberately not abstract
        """Push buffered reports out; called by the runtime when ``run`` returns."""

    def close(self) -> None:
        """Flush, and release what the context holds (threads, downloaded files); once, when the attempt ends."""
        self.flush()

@dataclass
class LocalContext(Context):
    """The in-process twin of the node's remote context: keeps everything in memory and under ``workdir``.

    Used by tests and by local runs; a checkpoint survives across LocalContexts sharing a ``workdir``.
    """

    workdir: Path = field(default_factory=lambda: Path("."))
    logs: list[tuple[float, str, str]] = field(default_factory=list)
    metric_points: list[tuple[str, float, int]] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)
    sources: dict[str, Path] = field(default_factory=dict)  # artifacts of the source job, by name
    echo: bool = False
    child_jobs: list[dict[str, Any]] = field(default_factory=list)  # what ctx.children.submit recorded
    reports: dict[str, Any] = field(default_factory=dict)  # the latest report per plugin
    tokens: list[str] = field(default_factory=list)  # digests of the job's working access tokens

    def __post_init__(self) -> None:
        super().__post_init__()
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def parts(self) -> tuple[Children, Rendezvous, Identity, Endpoint]:
        return LocalChildren(self), LocalRendezvous(self), LocalIdentity(self), LocalEndpoint(self)

    def log(self, message: str, level: str = "info") -> None:
        self.logs.append((time.time(), level, message))
        if self.echo:
            print(f"[{level}] {message}", flush=True)

    def metrics(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.metric_points.append((name, float(value), int(step)))
        if self.echo:
            print(f"step {step}: {json.dumps(values)}", flush=True)

    def artifact(self, path: str | Path, name: str | None = None) -> None:
        source = Path(path)
        target = self.workdir / "artifacts" / (name or source.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        self.artifacts[target.name] = target

    def source_artifact(self, name: str = "model.pt") -> Path:
        if name not in self.sources:
            raise FileNotFoundError(f"the source job has no artifact {name!r}")
        return Path(self.sources[name])

    def report(self, plugin: str, payload: dict[str, Any]) -> None:
        self.reports[plugin] = payload

    def _checkpoint_path(self) -> Path:
        return self.workdir / "checkpoint.pt"

    def _save_checkpoint_bytes(self, data: bytes) -> None:
        temporary = self._checkpoint_path().with_suffix(".tmp")
        temporary.write_bytes(data)
        temporary.replace(self._checkpoint_path())

    def _load_checkpoint_bytes(self) -> bytes | None:
        path = self._checkpoint_path()
        return path.read_bytes() if path.exists() else None


class LocalChildren(Children):
    """Child jobs recorded in memory, in ``ctx.child_jobs`` (nothing runs them)."""

    ctx: LocalContext

    def submit(self, job: dict[str, Any], idempotency_key: str | None = None, *, nested: bool = False,
               checkpoint_from: str | None = None) -> dict[str, Any]:
        if not isinstance(job, dict) or not job.get("kind"):
            raise ValueError("the child job was refused: kind: required")
        recorded = self.ctx.child_jobs
        for existing in recorded:
            if idempotency_key and existing["idempotency_key"] == idempotency_key:
                return existing["summary"]
        if checkpoint_from is not None and all(e["summary"]["id"] != checkpoint_from for e in recorded):
            raise ValueError("the child job was refused: checkpoint_from: not a child job of this job")
        import uuid

        summary = {"id": str(uuid.uuid4()), "name": job.get("name", ""), "kind": job["kind"], "state": "QUEUED",
                   "reason": "", "parent": self.ctx.job_id, "nested": bool(nested), "held": False,
                   "resources": dict(job.get("resources") or {}), "failures": 0}
        recorded.append({"summary": summary, "job": dict(job), "idempotency_key": idempotency_key,
                         "checkpoint_from": checkpoint_from})
        return summary

    def list(self) -> list[dict[str, Any]]:
        return [dict(entry["summary"]) for entry in self.ctx.child_jobs]

    def _child(self, job_id: str) -> dict[str, Any]:
        for entry in self.ctx.child_jobs:
            if entry["summary"]["id"] == job_id:
                return entry
        raise LookupError(f"no child job {job_id}")

    def cancel(self, job_id: str, reason: str = "") -> dict[str, Any]:
        summary = self._child(job_id)["summary"]
        summary["state"], summary["reason"] = "CANCELLED", reason or f"cancelled by its parent {self.ctx.job_id}"
        return dict(summary)

    def hold(self, job_id: str, reason: str = "") -> dict[str, Any]:
        summary = self._child(job_id)["summary"]
        summary["held"] = True
        return dict(summary)

    def release(self, job_id: str, reason: str = "") -> dict[str, Any]:
        summary = self._child(job_id)["summary"]
        summary["held"] = False
        return dict(summary)

    def resize(self, job_id: str, resources: dict[str, Any], reason: str = "") -> dict[str, Any]:
        summary = self._child(job_id)["summary"]
        summary["resources"] = dict(resources)
        return dict(summary)

    def metrics(self, job_id: str, after: int = 0) -> dict[str, Any]:
        return {**self._child(job_id)["summary"], "points": [], "cursor": after}

    def batch(self, *, submit: _Items | None = None, start: _Ids | None = None, metrics: _ById | None = None,
              logs: _ById | None = None, end: dict[str, dict[str, str]] | None = None,
              watch: _Ids | None = None) -> dict[str, Any]:
        """In memory: children run by this job keep their points (``entry["points"]``), lines and files."""
        submitted = []
        for item in submit or []:
            summary = self.submit(item["job"], item.get("idempotency_key"), nested=True)
            entry = self._child(summary["id"])
            if not entry.get("by_parent"):
                entry.update(by_parent=True, points=[], lines=[], files={})
                summary.update(held=True, reason="waiting for its parent to run it")
            submitted.append(summary)
            if item.get("start"):
                start = [*(start or []), summary["id"]]
        started, ended, named = [], [], set(watch or [])
        for job_id in start or []:
            named.add(job_id)
            summary = self._child(job_id)["summary"]
            if summary["state"] in {"QUEUED", "PREEMPTED"}:
                summary["state"] = "RUNNING"
                started.append(job_id)
        for job_id, points in (metrics or {}).items():
            named.add(job_id)
            entry = self._child(job_id)
            if entry["summary"]["state"] == "RUNNING":
                entry.setdefault("points", []).extend(points)
        for job_id, lines in (logs or {}).items():
            named.add(job_id)
            self._child(job_id).setdefault("lines", []).extend(lines)
        for job_id, item in (end or {}).items():
            named.add(job_id)
            summary = self._child(job_id)["summary"]
            if summary["state"] == "RUNNING":
                summary["state"], summary["reason"] = item["state"], item.get("reason", "")
                ended.append(job_id)
        states = {job_id: {"state": self._child(job_id)["summary"]["state"],
                           "reason": self._child(job_id)["summary"]["reason"]} for job_id in named}
        submitted = [dict(summary) for summary in submitted]
        return {"submitted": submitted, "started": started, "ended": ended, "states": states}

    def put_file(self, job_id: str, name: str, data: bytes, kind: str = "artifact") -> None:
        self._child(job_id).setdefault("files", {})[(kind, name)] = bytes(data)

    def checkpoint_of(self, job_id: str) -> bytes | None:
        return self._child(job_id).get("files", {}).get(("checkpoint", "checkpoint.pt"))


class LocalRendezvous(Rendezvous):
    """Rendezvous through a file in ``workdir``: the ranks of a local run share one workdir."""

    ctx: LocalContext

    def node_address(self) -> str | None:
        return "127.0.0.1"

    def _path(self) -> Path:
        return self.ctx.workdir / "rendezvous.json"

    def publish(self, port: int, suffix: str = "") -> str:
        address = f"127.0.0.1:{int(port)}{check_rendezvous_suffix(suffix)}"
        temporary = self._path().with_suffix(f".{self.ctx.rank}.tmp")
        temporary.write_text(json.dumps({"attempt": self.ctx.attempt_id, "address": address}))
        temporary.replace(self._path())
        return address

    def address(self, timeout: float = 300.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = json.loads(self._path().read_text())
                if found.get("attempt") == self.ctx.attempt_id:
                    return str(found["address"])
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not publish its address in {timeout:g} s")
            time.sleep(0.05)


class LocalIdentity(Identity):
    """``ctx.tokens`` as the working tokens, and job credentials signed with a key kept in ``workdir``: the ranks of
    a local run (sharing one workdir) share it."""

    ctx: LocalContext
    CREDENTIAL_TTL_S = 60.0

    def token_digests(self) -> list[str]:
        return list(self.ctx.tokens)

    def _seed(self) -> bytes:
        import os
        import secrets

        path = self.ctx.workdir / "credential.key"
        if not path.exists():
            temporary = path.with_suffix(f".{os.getpid()}.{secrets.token_hex(4)}.tmp")
            temporary.write_text(secrets.token_hex(32))
            try:
                os.link(temporary, path)  # atomic, and never replaces a key another rank made first
            except FileExistsError:
                pass
            finally:
                temporary.unlink()
        return bytes.fromhex(path.read_text().strip())

    def credential(self, subject: str) -> dict[str, Any]:
        from components.runtime.shared.credentials import sign_with

        ctx = self.ctx
        return sign_with(self._seed(), job=ctx.job_id, subject=subject,
                         holder=f"attempt {ctx.attempt_id} rank {ctx.rank} (local)", ttl_s=self.CREDENTIAL_TTL_S)

    def public_key(self) -> str:
        """The public key (hex) this local run's credentials are signed with."""
        from components.runtime.shared.credentials import public_key_hex

        return public_key_hex(self._seed())


class LocalEndpoint(Endpoint):
    """Records the address (``ctx.endpoint.address``) and logs it."""

    def publish(self, address: str) -> None:
        self.address = address
        self.ctx.log(f"listening on {address}")
