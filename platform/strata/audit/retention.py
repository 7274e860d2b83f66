"""The audit log's retention: entries older than ``STRATA_AUDIT_RETENTION_DAYS`` are deleted by the scheduler
leader's beat (``strata.audit.tasks.retention_task``); nothing else deletes an entry (strata.audit.models)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from strata.audit.models import AuditEntry

BATCH = 5000  # rows per transaction, so a first run over a long history holds no lock for long


def audit_prune(*, now: datetime | None = None, days: float | None = None) -> int:
    """Delete the entries older than ``days`` (default ``STRATA_AUDIT_RETENTION_DAYS``; 0 or None: keep every
    entry); returns how many went."""
    days = settings.STRATA_AUDIT_RETENTION_DAYS if days is None else days
    if not days:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted = 0
    while True:
        ids = list(AuditEntry.objects.filter(time__lt=cutoff).order_by("time", "id").values_list("id", flat=True)[:BATCH])
        if ids:
            deleted += entries_delete(AuditEntry.objects.filter(id__in=ids, time__lt=cutoff))
        if len(ids) < BATCH:
            return deleted


def entries_delete(entries) -> int:
    """Delete ``entries`` (a queryset of AuditEntry) in one transaction, past the database's guard: the retention's
    way only (and the tests')."""
    postgres = connection.vendor == "postgresql"
    with transaction.atomic():
        if postgres:  # the one way past the trigger, for this transaction only
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('strata.audit_retention', 'on', true)")
        deleted = entries._retention_delete()
        if postgres:  # and closed again at once, should the caller's transaction go on
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('strata.audit_retention', '', true)")
        return deleted
