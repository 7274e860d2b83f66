"""Celery tasks of the scheduler: thin wrappers over scheduling.services. Other layers ask for a pass with
:func:`strata.celery.request_pass`, by task name."""

from __future__ import annotations

from celery import shared_task

from strata.celery import SCHEDULE_PASS_TASK


@shared_task(name=SCHEDULE_PASS_TASK, ignore_result=True)
def schedule_pass_task() -> None:
    from strata.scheduling.services import schedule_pass

    schedule_pass()


@shared_task(name="strata.scheduling.tick", ignore_result=True)
def tick_task() -> None:
    from strata.scheduling.services import tick

    tick()

