"""The protocol between the node's worker and a node service that hosts attempts, and how attempts end.

Light on purpose (standard library only): the node's worker, hosting services (such as a device's sharing
service) and the control plane all import it.

**Transport.** A host listens on a unix socket (:mod:`multiprocessing.connection`, authenticated with a key
kept in a 0600 file); :class:`HostAddress` names both. Every request is a dict with an ``op``
(:class:`Op`) and gets exactly one reply dict (``{"ok": True, ...}`` or ``{"ok": False, "reason": ...}``).

- ``run`` ``{"payload": <the attempt payload>}`` (see :func:`components.runtime.client.remote.context_from_payload`):
  reply ``{"ok": True, "pid", "attempt", "admission": {...}}`` when the host took the attempt, or
  ``{"ok": False, "reason"}`` when it declined (the worker then runs it in child processes). When a taken
  attempt ends, the host sends one more message on the same connection: :func:`done_event`. If that
  connection closes first (the worker died), the host asks the attempt to stop.
- ``cancel`` ``{"attempt", "hard": False}``: stop at the next step boundary (checkpoint), or at once (``hard``).
- ``status``, ``timeline``, ``report``, ``policy``, ``ping``, ``shutdown``: the host's own views and settings.

**Outcomes as data.** :class:`End` is how one attempt's run ended on the node (a child's exit code or a host's
``done`` event); :class:`Outcome` is what the worker reports with ``finish`` (``outcome`` on the wire) and
how the control plane treats it (:attr:`Outcome.counts_as_failure`, :attr:`Outcome.requeue`).
:func:`finish_for` maps one to the other, for both execution paths.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any


# -- transport ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostAddress:
    """Where a hosting node service listens: a unix socket and the file holding its key (hex)."""

    path: str
    authkey_file: str
    label: str = "the node service"  # how messages name the host ("the GPU-sharing service of device 0")

    def connect(self) -> Connection:
        return connect(self.path, read_authkey(self.authkey_file))

    def call(self, message: dict, timeout: float = 5.0) -> dict:
        return call(self.path, read_authkey(self.authkey_file), message, timeout)


def socket_path(directory: str | Path, name: str | int) -> str:
    """The socket of host ``name`` (a device index, say) in ``directory``: ``device-<name>.sock``."""
    return str(Path(directory) / f"device-{name}.sock")


def read_authkey(path: str | Path) -> bytes:
    return bytes.fromhex(Path(path).read_text().strip())


def connect(path: str, authkey: bytes) -> Connection:
    """A connection to the host listening on ``path`` (raises OSError when none is listening)."""
    return Client(path, family="AF_UNIX", authkey=authkey)


def call(path: str, authkey: bytes, message: dict, timeout: float = 5.0) -> dict:
    """One request, one reply, on a fresh connection. Raises OSError/EOFError/TimeoutError."""
    conn = connect(path, authkey)
    try:
        conn.send(message)
        if not conn.poll(timeout):
            raise TimeoutError(f"no answer to {message.get('op')!r} in {timeout:g} s")
        return conn.recv()
    finally:
        conn.close()


# -- operations -----------------------------------------------------------------------------------------------
class Op(enum.StrEnum):
    RUN = "run"
    CANCEL = "cancel"
    STATUS = "status"
    TIMELINE = "timeline"
    REPORT = "report"
    POLICY = "policy"
    PING = "ping"
    SHUTDOWN = "shutdown"


DONE_EVENT = "done"


def run_message(payload: dict[str, Any]) -> dict[str, Any]:
    return {"op": Op.RUN.value, "payload": payload}


def cancel_message(attempt: str, hard: bool = False) -> dict[str, Any]:
    return {"op": Op.CANCEL.value, "attempt": attempt, "hard": bool(hard)}


# -- how an attempt ended -------------------------------------------------------------------------------------
class End(enum.StrEnum):
    """How one run of an attempt ended on the node, in a child process or inside a host."""

    SUCCEEDED = "succeeded"  # the component returned / the session finished
    STOPPED = "stopped"  # it stopped early because it was asked to (a checkpoint was taken)
    FAILED = "failed"  # it raised
    CANCELLED = "cancelled"  # the host dropped it at once, without a checkpoint
    LOST = "lost"  # the host died (or crashed) under it: not the attempt's fault
    USER_ERROR = "user_error"  # a deterministic error of the job itself (project.UserError): retrying cannot help


# A child's exit codes (components.runtime.node.child).
EXIT_OK, EXIT_FAILED, EXIT_STOPPED, EXIT_USER_ERROR = 0, 1, 3, 4
_EXIT_ENDS = {EXIT_OK: End.SUCCEEDED, EXIT_STOPPED: End.STOPPED, EXIT_USER_ERROR: End.USER_ERROR}


def end_of_exit_code(code: int) -> End:
    return _EXIT_ENDS.get(code, End.FAILED)


def done_event(attempt: str, end: End | str, *, error: str | None = None, steps: int = 0,
               result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The host's last message about a taken attempt. ``lost`` is kept for readers of the older event."""
    end = End(end)
    return {"event": DONE_EVENT, "attempt": attempt, "state": end.value, "error": error, "steps": int(steps),
            "result": result, "lost": end is End.LOST}


def end_of_event(event: dict[str, Any]) -> End:
    if event.get("lost"):
        return End.LOST
    try:
        return End(str(event.get("state")))
    except ValueError:
        return End.FAILED


@dataclass(frozen=True)
class Outcome:
    """What the worker reports with ``finish`` and what the control plane does with it.

    ``counts_as_failure``: the attempt uses up one of the job's ``max_attempts``. ``requeue``: the job goes back
    to the queue without counting a failure (like a lost node), up to :data:`LOST_LIMIT` times per job.
    ``final``: the job ends now whatever its attempts left (a time limit)."""

    name: str
    counts_as_failure: bool
    requeue: bool = False
    final: bool = False
    description: str = ""

    def __str__(self) -> str:
        return self.name


SUCCEEDED = Outcome("succeeded", counts_as_failure=False, description="the attempt finished its work")
FAILED = Outcome("failed", counts_as_failure=True, description="the attempt failed, or was stopped on request")
TIME_LIMIT = Outcome("time_limit", counts_as_failure=True, final=True,
                     description="the job's time limit was exceeded")
SERVICE_LOST = Outcome("service_lost", counts_as_failure=False, requeue=True,
                       description="the node service hosting the attempt died under it")
USER_ERROR = Outcome("user_error", counts_as_failure=True, final=True,
                     description="a deterministic error of the job (a failed environment build, an import error, a "
                                 "missing program or file): the job fails at once, without retries")

OUTCOMES: dict[str, Outcome] = {o.name: o for o in (SUCCEEDED, FAILED, TIME_LIMIT, SERVICE_LOST, USER_ERROR)}
FINISH_OUTCOMES: tuple[str, ...] = tuple(OUTCOMES)  # the ``finish`` call's accepted ``outcome`` values
LOST_LIMIT = 3  # the LOST_LIMIT-th service_lost of one job fails it (no endless crash loop)
# How the control plane words the end of a service_lost attempt (its exit_reason starts with this); kept as the
# control plane has always written it.
LOST_REASON = "GPU-sharing service died"
STOPPED_REASON = "stopped at the control plane's request"


def outcome(name: str) -> Outcome:
    """The :class:`Outcome` called ``name``; raises KeyError for an unknown one."""
    return OUTCOMES[name]


def finish_for(end: End, *, stop_reason: str = "", time_limit: float = 0.0, detail: str = "",
               where: str = "") -> tuple[Outcome, str]:
    """``(outcome, reason)`` to ``finish`` an attempt with, from how its run ended.

    ``stop_reason`` is why the worker stopped it ("time_limit", "stopped" or ""), which decides first;
    ``detail`` the last line of its error or output; ``where`` names the host for messages ("" for a child)."""
    if stop_reason == "time_limit":
        return TIME_LIMIT, f"time limit of {time_limit:g} s exceeded"
    if stop_reason:
        return FAILED, STOPPED_REASON
    if end is End.SUCCEEDED:
        return SUCCEEDED, ""
    if end is End.LOST:
        return SERVICE_LOST, (f"{where or 'the node service'} died under the attempt" +
                              (f": {detail}" if detail else ""))[:500]
    if end is End.STOPPED:  # its own context was told to stop (e.g. by a report answer)
        return FAILED, STOPPED_REASON
    if end is End.CANCELLED:
        return FAILED, f"dropped by {where or 'its host'}"
    if end is End.USER_ERROR:
        return USER_ERROR, detail[:500] or "the job's own error"
    if where:
        return FAILED, f"failed in {where}: {detail or end.value}"[:500]
    return FAILED, detail[:500] or "failed"
