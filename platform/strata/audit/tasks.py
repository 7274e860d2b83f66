"""The audit log's Celery task, run by the beat on the ``control`` queue, on the scheduler leader only."""

from __future__ import annotations

from celery import shared_task

AUDIT_RETENTION_TASK = "strata.audit.retention"


@shared_task(name=AUDIT_RETENTION_TASK, ignore_result=True)
def retention_task() -> int:
    """Delete the audit entries older than STRATA_AUDIT_RETENTION_DAYS (``strata.audit.retention``)."""
    from strata.audit.retention import audit_prune
    from strata.scheduling.leader import lease_acquire

    if lease_acquire() is None:
        return 0
    return audit_prune()
