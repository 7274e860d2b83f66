"""The scheduler's leader lease: of several ``strata scheduler`` replicas, exactly one is the leader at a time.

A lease is one row (:class:`~strata.scheduling.models.Lease`) taken and renewed with one conditional UPDATE::

    UPDATE lease SET holder = me, expires_at = now + ttl,
                     epoch = CASE WHEN holder = me THEN epoch ELSE epoch + 1 END
     WHERE name = 'scheduler' AND (holder = me OR expires_at <= now)

(an INSERT the first time a name is used). PostgreSQL re-checks the WHERE clause of a row another transaction
just changed (READ COMMITTED), and SQLite serializes writers, so two replicas can never both succeed while the
lease is valid. Time is the database's clock on PostgreSQL (``clock_timestamp()``), so the hosts' clocks may
disagree. The leader runs what must not run twice at once (the reaper, the reconciler, telemetry rollups and
retention); scheduling passes run on any replica, serialized by the pass's own lock.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from strata.scheduling.models import Lease

SCHEDULER = "scheduler"  # the lease the scheduler replicas compete for
_identity: tuple[int, str] | None = None


def holder_id() -> str:
    """This process's identity as a lease holder: ``host:pid:random`` (new after a fork)."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        _identity = (pid, f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}")
    return _identity[1]


def database_now() -> datetime:
    """Now, by the database's clock on PostgreSQL (one clock for every host); this host's clock on SQLite (one
    machine anyway)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]
    return timezone.now()


def lease_acquire(name: str = SCHEDULER, holder: str | None = None, ttl: float | None = None,
                  now: datetime | None = None) -> Lease | None:
    """Take or renew lease ``name`` for ``holder`` (this process by default) for ``ttl`` seconds
    (``STRATA_LEADER_LEASE_SECONDS``). Returns the lease row when ``holder`` holds it now, ``None`` when another
    holder's lease is still valid."""
    holder = holder or holder_id()
    ttl = settings.STRATA_LEADER_LEASE_SECONDS if ttl is None else ttl
    now = now or database_now()
    expires = now + timedelta(seconds=ttl)
    taken = Lease.objects.filter(Q(holder=holder) | Q(expires_at__lte=now), name=name).update(
        epoch=Case(When(holder=holder, then=F("epoch")), default=F("epoch") + 1),
        acquired_at=Case(When(holder=holder, then=F("acquired_at")), default=Value(now)),
        holder=holder, renewed_at=now, expires_at=expires)
    if not taken:
        try:
            with transaction.atomic():
                Lease.objects.create(name=name, holder=holder, epoch=1, acquired_at=now, renewed_at=now,
                                     expires_at=expires)
        except IntegrityError:
            return None  # the row exists and another holder's lease is valid (or it was just created)
    return Lease.objects.get(name=name)


def lease_release(name: str = SCHEDULER, holder: str | None = None) -> bool:
    """Give lease ``name`` up now if ``holder`` holds it (a clean shutdown: the next replica need not wait)."""
    holder = holder or holder_id()
    return bool(Lease.objects.filter(name=name, holder=holder).update(holder="", expires_at=database_now()))


def leader_status(name: str = SCHEDULER, now: datetime | None = None) -> dict:
    """Who leads, for metrics and operators: ``{"name", "leader" (whether this process holds the lease now),
    "holder", "epoch", "expires_at"}``; holder is ``None`` while nobody holds a valid lease."""
    lease = Lease.objects.filter(name=name).first()
    now = now or database_now()
    valid = lease is not None and bool(lease.holder) and lease.expires_at > now
    return {"name": name, "leader": valid and lease.holder == holder_id(),
            "holder": lease.holder if valid else None, "epoch": lease.epoch if lease else 0,
            "expires_at": lease.expires_at if valid else None}


def is_leader(name: str = SCHEDULER) -> bool:
    """Whether this process holds lease ``name`` now (one read)."""
    return leader_status(name)["leader"]
