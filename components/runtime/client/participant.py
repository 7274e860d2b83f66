"""A participant: a process on a machine outside the cluster that joined a running job (a volunteer's peer).

:class:`ParticipantSession` joins with one of the job's access tokens (``POST /api/v1/participants/``), keeps the
participant in with a heartbeat thread, and leaves when it closes::

    with ParticipantSession(url, job_id, token, name="lab-box", gpus=1) as ctx:
        while not ctx.should_stop():
            ...                                   # work, with what the job's kind handed over: ctx.payload
            ctx.metrics(loss=loss, samples=n)     # sent with the next heartbeat
            proof = ctx.identity.credential("p2p:" + peer_id)["credential"]  # a job credential for this identity

:class:`ParticipantContext` is the :class:`~components.runtime.contract.context.Context` such a process runs with:

- ``metrics`` keeps the latest value of each name (at most 64) and sends them with the next heartbeat, where they
  replace what the control plane shows for the participant (no history is kept); ``log`` prints to stdout with
  the participant's name; ``set_info``/``ctx.endpoint.publish`` change what it says about itself.
- ``should_stop`` is true once a heartbeat answered stop (the job ended, the token was revoked, the participant
  was evicted or lost), once no heartbeat got through for a whole lease, or after :meth:`ParticipantContext.stop`;
  ``reason`` says why.
- ``ctx.identity.credential(subject)`` returns a job credential for ``subject``: the first call for a subject asks at once
  (one heartbeat, blocking), then the heartbeat thread renews it before half its life is gone.
- ``checkpoint``/``restore`` keep the state in the local ``workdir`` (pass the same one to resume); artifacts are
  kept there too (``workdir/artifacts``): the control plane stores only its attempts' artifacts.
- A participant has no rendezvous (``ctx.gang``) or child jobs (``ctx.children``): those calls raise
  NotImplementedError; it has no access-token digests.
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

from components.runtime.client.client import ApiError, ParticipantClient, participant_join
from components.runtime.contract.context import (
    Children,
    Context,
    Endpoint,
    Identity,
    LocalContext,
    Rendezvous,
)

log = logging.getLogger(__name__)

MAX_METRICS = 64
MAX_METRIC_NAME = 64


@dataclass
class ParticipantContext(Context):
    """The context of a participant process (see the module docstring). ``attempt_id`` is the participant's id."""

    client: ParticipantClient | None = None
    name: str = ""
    public_key: str = ""  # the job's credential key (hex)
    payload: dict[str, Any] = field(default_factory=dict)  # what the job's kind handed over at the join
    heartbeat_s: float = 10.0
    lease_s: float = 30.0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="strata-participant-")))
    echo: bool = True
    reason: str = ""  # why it stops (empty while it runs)
    _latest: dict[str, float] = field(default_factory=dict, repr=False)
    _info: dict[str, Any] | None = field(default=None, repr=False)  # what to send with the next heartbeat
    _changed: int = field(default=0, repr=False)  # metrics changes, and how many the control plane has
    _sent: int = field(default=0, repr=False)
    _credentials: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _beating: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one heartbeat at a time
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _last_ok: float = field(default_factory=time.monotonic, repr=False)
    _local: LocalContext | None = field(default=None, repr=False)

    @classmethod
    def from_join(cls, url: str, answer: dict[str, Any], *, workdir: str | Path | None = None,
                  echo: bool = True, client: ParticipantClient | None = None) -> ParticipantContext:
        """The context of the participant a join answered (``client.participant_join``)."""
        heartbeat_s = float(answer.get("heartbeat_s") or 10.0)
        client = client or ParticipantClient(url, answer["id"], answer["secret"], retries=0,
                                             timeout=max(2.0, heartbeat_s))
        extra = {"workdir": Path(workdir)} if workdir is not None else {}
        return cls(job_id=str(answer["job"]["id"]), attempt_id=str(answer["id"]), spec=dict(answer["job"]["spec"]),
                   client=client, name=str(answer.get("name") or ""), public_key=str(answer.get("public_key") or ""),
                   payload=dict(answer.get("payload") or {}), heartbeat_s=heartbeat_s,
                   lease_s=float(answer.get("lease_s") or 3 * heartbeat_s), echo=echo, **extra)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def parts(self) -> tuple[Children, Rendezvous, Identity, Endpoint]:
        """No child jobs, rendezvous or token digests: a participant's identity and endpoint only."""
        return Children(self), Rendezvous(self), ParticipantIdentity(self), ParticipantEndpoint(self)

    @property
    def participant_id(self) -> str:
        return self.attempt_id

    # -- reporting ---------------------------------------------------------------------------------------------
    def log(self, message: str, level: str = "info") -> None:
        if self.echo:
            prefix = f"[participant {self.name}]" + (f" [{level}]" if level != "info" else "")
            print(f"{prefix} {message}", flush=True)

    def metrics(self, values: dict[str, float] | None = None, step: int | None = None, **named: float) -> None:
        """Keep the latest value of each metric, for the next heartbeat: ``metrics(loss=0.5)`` or, as every
        context takes them, ``metrics({"loss": 0.5}, step)`` (``step`` is kept as the metric ``step``)."""
        given = {**(values or {}), **named}
        if step is not None:
            given["step"] = step
        dropped = []
        with self._lock:
            for name, value in given.items():
                number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
                fits = name in self._latest or len(self._latest) < MAX_METRICS
                if (not isinstance(name, str) or not 1 <= len(name) <= MAX_METRIC_NAME or number is None
                        or not math.isfinite(number) or not fits):
                    dropped.append(str(name))
                    continue
                self._latest[name] = float(number)
            self._changed += 1
        if dropped:
            self.log(f"metrics not kept (a finite number, names of 1 to {MAX_METRIC_NAME} characters, at most "
                     f"{MAX_METRICS} names): {', '.join(dropped)}", "warning")

    def latest_metrics(self) -> dict[str, float]:
        with self._lock:
            return dict(self._latest)

    def set_info(self, values: dict[str, Any]) -> None:
        """Change what this participant says about itself (merged into what it said; sent with the next
        heartbeat, at most 8 KiB of JSON)."""
        with self._lock:
            self._info = {**(self._info or {}), **values}

    def artifact(self, path: str | Path, name: str | None = None) -> None:
        """Keep the file as an artifact in ``workdir/artifacts`` (a participant's artifacts stay on its
        machine)."""
        self._storage().artifact(path, name)
        self.log(f"artifact {name or Path(path).name} kept in {self.workdir / 'artifacts'}")

    # -- local state -------------------------------------------------------------------------------------------
    def _storage(self) -> LocalContext:
        if self._local is None:
            self._local = LocalContext(job_id=self.job_id, attempt_id=self.attempt_id, spec=self.spec,
                                       workdir=self.workdir)
        return self._local

    def _save_checkpoint_bytes(self, data: bytes) -> None:
        self._storage()._save_checkpoint_bytes(data)

    def _load_checkpoint_bytes(self) -> bytes | None:
        return self._storage()._load_checkpoint_bytes()

    # -- heartbeats ----------------------------------------------------------------------------------------------
    def _halt(self, reason: str) -> None:
        with self._lock:
            first = not self.reason
            if first:
                self.reason = reason
        if first:
            self.log(f"stopping: {reason}", "warning")
        self.request_stop()

    def stop(self, reason: str = "stopped by its process") -> None:
        """Stop on our own: ``should_stop`` becomes true (the session leaves when it closes)."""
        self._halt(reason)

    def _renewal_due(self) -> str | None:
        """The subject whose credential should be renewed next (less than half its life left), or None."""
        now = time.time()
        due = []
        with self._lock:
            for subject, answer in self._credentials.items():
                expires, issued = float(answer.get("expires") or 0), float(answer.get("issued") or 0)
                if expires - now < max(1.0, (expires - issued) / 2):
                    due.append((expires, subject))
        return min(due)[1] if due else None

    def beat(self, subject: str | None = None) -> dict[str, Any]:
        """One heartbeat now, with the changed metrics and info and ``subject`` (or a credential due for renewal):
        the control plane's answer. Raises :class:`ApiError` when it failed (after the lease without a heartbeat
        that got through, ``should_stop`` is true)."""
        with self._beating:
            with self._lock:
                changed = self._changed
                metrics = dict(self._latest) if changed != self._sent and self._latest else None
                info = self._info
            subject = subject or self._renewal_due()
            try:
                answer = self.client.heartbeat(metrics=metrics, info=info, subject=subject)
            except ApiError as error:
                if error.status in (401, 404):
                    self._halt(f"the control plane no longer knows this participant ({error})")
                elif error.status == 400:  # never accepted: do not send it again
                    log.warning("heartbeat refused, metrics and info dropped: %s", error)
                    with self._lock:
                        self._sent = changed
                        if self._info is info:
                            self._info = None
                elif time.monotonic() - self._last_ok > self.lease_s:
                    self._halt(f"no heartbeat got through for {self.lease_s:g} s (the lease): {error}")
                raise
            self._last_ok = time.monotonic()
            with self._lock:
                self._sent = changed
                if self._info is info:
                    self._info = None
                if subject and isinstance(answer.get("credential"), dict):
                    self._credentials[subject] = answer["credential"]
            if answer.get("state") == "stop":
                self._halt(str(answer.get("reason") or "the control plane said stop"))
            return answer

    def start(self) -> None:
        """Heartbeat every ``heartbeat_s`` on a daemon thread until :meth:`close` or a stop."""
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=f"participant-{self.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed.wait(self.heartbeat_s):
            if self.should_stop():
                return
            try:
                self.beat()
            except ApiError as error:
                log.warning("participant %s: heartbeat failed, will retry: %s", self.name, error)
            except Exception:  # noqa: BLE001 - a bug here must not end the heartbeats silently
                log.exception("participant %s: heartbeat failed", self.name)
            if not self.should_stop() and time.monotonic() - self._last_ok > self.lease_s:
                self._halt(f"no heartbeat got through for {self.lease_s:g} s (the lease)")

    def flush(self) -> None:
        """Send the latest metrics and info now, when there are new ones and the participant still runs."""
        with self._lock:
            pending = (self._changed != self._sent and self._latest) or self._info is not None
        if pending and not self.should_stop():
            try:
                self.beat()
            except ApiError as error:
                log.warning("participant %s: last metrics not sent: %s", self.name, error)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.heartbeat_s + 5.0)
        self.flush()


class ParticipantIdentity(Identity):
    """A participant's job credentials, from its heartbeats."""

    ctx: ParticipantContext

    def credential(self, subject: str) -> dict[str, Any]:
        """The latest job credential for ``subject`` (``{"credential", "public_key", "expires", "issued"}``); the
        first call for a subject asks for one at once (retrying for up to a lease), later ones return what the
        heartbeat thread keeps fresh. RuntimeError once the participant stops."""
        ctx = self.ctx
        deadline = time.monotonic() + ctx.lease_s
        delay = 0.2
        while True:
            with ctx._lock:
                current = ctx._credentials.get(subject)
            if current is not None and float(current.get("expires") or 0) > time.time() + 1.0:
                return dict(current)
            if ctx.should_stop():
                raise RuntimeError(f"no credential for {subject[:40]!r}: the participant stops ({ctx.reason})")
            try:
                ctx.beat(subject)
            except ApiError as error:
                if error.status == 400:
                    raise ValueError(f"no credential for {subject[:40]!r}: {error}") from None
                if time.monotonic() > deadline or ctx.should_stop():
                    raise RuntimeError(f"no credential for {subject[:40]!r}: {error}") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)


class ParticipantEndpoint(Endpoint):
    """Said with the next heartbeat (the participant's ``info.endpoint``)."""

    ctx: ParticipantContext

    def publish(self, address: str) -> None:
        self.address = address
        self.ctx.set_info({"endpoint": address})
        self.ctx.log(f"listening on {address}")


class ParticipantSession:
    """Join running job ``job_id`` as a participant (with one of its access tokens), keep it in, and leave on
    exit: ``with ParticipantSession(...) as ctx:`` gives the :class:`ParticipantContext`. ``heartbeat=False``
    starts no heartbeat thread (call ``ctx.beat()`` yourself). The join's errors are :class:`ApiError` with the
    API's message (401 bad token, 400 a kind that takes no participants, 409 not running or no quota)."""

    def __init__(self, url: str, job_id: str, token: str, *, name: str = "", gpus: float = 0.0,
                 info: dict[str, Any] | None = None, workdir: str | Path | None = None, echo: bool = True,
                 heartbeat: bool = True, client: ParticipantClient | None = None):
        self.url, self.job_id, self.token = url, str(job_id), token
        self.name, self.gpus, self.info = name, float(gpus), dict(info or {})
        self.workdir, self.echo, self.heartbeat, self.client = workdir, echo, heartbeat, client
        self.answer: dict[str, Any] | None = None
        self.context: ParticipantContext | None = None

    def open(self) -> ParticipantContext:
        self.answer = participant_join(self.url, self.job_id, self.token, name=self.name, gpus=self.gpus,
                                       info=self.info)
        self.context = ParticipantContext.from_join(self.url, self.answer, workdir=self.workdir, echo=self.echo,
                                                    client=self.client)
        self.context.log(f"joined job {self.job_id} as {self.context.participant_id} (heartbeat every "
                         f"{self.context.heartbeat_s:g} s)")
        if self.heartbeat:
            self.context.start()
        return self.context

    def close(self) -> None:
        context = self.context
        if context is None:
            return
        context.close()
        try:
            left = context.client.leave()
            context.log(f"left job {self.job_id} ({left.get('state')})")
        except ApiError as error:  # it will be marked lost after its lease
            log.warning("participant %s could not leave: %s", context.name, error)

    def __enter__(self) -> ParticipantContext:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["ParticipantContext", "ParticipantSession"]
