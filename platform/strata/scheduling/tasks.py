"""Celery tasks of the scheduler: thin wrappers over scheduling.services. Other layers ask for a pass with
:func:`strata.celery.request_pass`, by task name."""

from __future__ import annotations

from celery import shared_task

from strata.celery import EXPIRE_UPLOADS_TASK, RETENTION_TASK, SCHEDULE_PASS_TASK


@shared_task(name=SCHEDULE_PASS_TASK, ignore_result=True)
def schedule_pass_task() -> None:
    from strata.scheduling.services import schedule_pass

    schedule_pass()


@shared_task(name="strata.scheduling.tick", ignore_result=True)
def tick_task() -> None:
    from strata.scheduling.services import tick

    tick()


@shared_task(name="strata.scheduling.eta", ignore_result=True)
def eta_task() -> int:
    """Refresh the waiting jobs' start-time estimates (``strata.scheduling.eta``): on the leader only (every
    scheduler replica runs a beat), every STRATA_ETA_SECONDS, apart from the passes so a long simulation never
    delays one. It also records the lost work of interrupted attempts whose event was missed."""
    from datetime import timedelta

    from django.utils import timezone

    from strata.scheduling.eta import refresh_due
    from strata.scheduling.leader import lease_acquire
    from strata.scheduling.lost_work import record_missing

    if lease_acquire() is None:
        return 0
    # The lost-work records whose attempt.ended event was missed (it is delivered at most once): the last day's.
    record_missing(since=timezone.now() - timedelta(days=1))
    return refresh_due()


@shared_task(name=EXPIRE_UPLOADS_TASK, ignore_result=True)
def expire_uploads_task() -> int:
    """Delete the data uploads not completed within STRATA_UPLOAD_EXPIRY_HOURS, with their chunks, and abort the
    direct uploads begun as long ago (their parts go): on the leader only (every scheduler replica runs a beat)."""
    from strata.jobs.data import uploads_expire
    from strata.jobs.transfers import abandoned_uploads_abort
    from strata.scheduling.leader import lease_acquire

    if lease_acquire() is None:
        return 0
    return uploads_expire() + abandoned_uploads_abort()


@shared_task(name=RETENTION_TASK, ignore_result=True)
def retention_task() -> dict:
    """Delete the checkpoints, artifacts and unused code bundles no retention policy keeps
    (``strata.quotas.retention``): on the leader only (every scheduler replica runs a beat)."""
    from strata.quotas.retention import retention_collect
    from strata.scheduling.leader import lease_acquire

    if lease_acquire() is None:
        return {}
    return retention_collect().as_dict()
