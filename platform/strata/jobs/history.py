"""The operation history: one JSON line per committed change of a job or an attempt, appended to the file
``STRATA_HISTORY_LOG`` names (off when it is empty), by every control-plane process (web, scheduler) at once.

It is what the chaos suite's checker (:mod:`benchmarks.core.history_check`) reads, Jepsen-style, next to the client's
own log of what it asked and what it was told; an operator can also keep it as an audit trail. Each line::

    {"op": "dispatch", "time": 1732700000.123, "pid": 4242, "job": "<uuid>", "attempt": "<uuid>",
     "number": 2, "token": "<12 hex>", ...}

``op`` is one of:

=============  ==========================================================================================
``submit``     a job was recorded, PENDING (``kind``, ``team``, ``max_attempts``, ``parent``)
``state``      a job moved ``source`` -> ``target`` (the compare-and-set won; ``reason``)
``dispatch``   the scheduler placed an attempt (``number``, ``share`` in GPUs, ``dispatched_at``, ``nodes``)
``start``      a node claimed the attempt (``node``, ``started_at``; again on a redelivered claim)
``heartbeat``  the attempt's node reported on it (logs, metrics, reports)
``finish``     the attempt ended (``outcome``, ``reason``, ``ended_at``, ``share``)
``cancel``     a cancel was asked for (``by``)
``rejected``   a node's call for an attempt was refused as stale (fencing token, node or ended attempt: 409)
=============  ==========================================================================================

``token`` is the first 12 hex digits of the SHA-256 of the attempt's fencing token, never the token itself: the
history may be read by people who must not act as a node. Lines are written after the transaction commits (a
rolled-back change is never recorded; ``rejected`` is written at once), each with one ``write(2)`` to a file
opened with ``O_APPEND``, so lines of concurrent processes never interleave. Times are Unix seconds; the
``*_at`` fields are the database's own timestamps of the change.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from components.runtime.shared.tokens import token_digest as full_digest

_lock = threading.Lock()
_open: dict[str, int] = {}  # path -> file descriptor (reopened after a fork: keyed by pid too)


def enabled() -> bool:
    return bool(settings.STRATA_HISTORY_LOG)


def token_digest(token: str | None) -> str:
    """What the history says of a fencing token: enough to tell two apart, useless to present to the API."""
    return full_digest(token)[:12] if token else ""


def timestamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _descriptor(path: str) -> int:
    key = f"{os.getpid()}:{path}"
    with _lock:
        fd = _open.get(key)
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            _open[key] = fd
        return fd


def _write(line: dict[str, Any]) -> None:
    path = settings.STRATA_HISTORY_LOG
    data = (json.dumps({**line, "time": time.time()}, default=str, separators=(",", ":")) + "\n").encode()
    os.write(_descriptor(path), data)


def record(op: str, *, job=None, attempt=None, token: str | None = None, now: bool = False, **fields: Any) -> None:
    """Append one line for ``op`` once the current transaction commits (``now``: at once). ``job`` and ``attempt``
    are objects or ids; ``token`` the attempt's fencing token (only its digest is written)."""
    if not settings.STRATA_HISTORY_LOG:
        return
    line = {"op": op, "pid": os.getpid(),
            "job": str(getattr(job, "pk", job)) if job is not None else None,
            "attempt": str(getattr(attempt, "pk", attempt)) if attempt is not None else None,
            "token": token_digest(token), **fields}
    if now:
        _write(line)
    else:
        transaction.on_commit(lambda: _write(line))
