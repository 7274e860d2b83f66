"""Celery tasks of the scheduler: thin wrappers over scheduling.services."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

log = logging.getLogger(__name__)


@shared_task(name="strata.scheduling.pass", ignore_result=True)
def schedule_pass_task() -> None:
    from strata.scheduling.services import schedule_pass

    schedule_pass()


@shared_task(name="strata.scheduling.tick", ignore_result=True)
def tick_task() -> None:
    from strata.scheduling.services import tick

    tick()


def request_pass() -> None:
    """Ask for a scheduling pass soon. Inline when STRATA_SCHEDULE_INLINE is set (tests, benchmarks)."""
    if getattr(settings, "STRATA_SCHEDULE_INLINE", False):
        from strata.scheduling.services import schedule_pass

        schedule_pass()
        return
    from strata.celery import app  # the configured app: a bare shared_task would use Celery's default broker

    try:
        app.send_task("strata.scheduling.pass", queue="control")
    except Exception:  # the beat tick runs a pass anyway
        log.exception("could not request a scheduling pass; the next tick will run one")
