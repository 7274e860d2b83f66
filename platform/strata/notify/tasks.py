"""Celery tasks of notifications, on the ``notify`` queue (``strata notifier`` consumes it, never the scheduler):
one try of one delivery per message; a failed try sends the next, delayed by the backoff."""

from __future__ import annotations

from celery import shared_task

from strata.notify.services import DELIVER_TASK, SWEEP_TASK


@shared_task(name=DELIVER_TASK, ignore_result=True)
def deliver_task(delivery_id: int) -> None:
    from strata.notify.services import attempt, send

    delay = attempt(delivery_id)
    if delay is not None:
        send(delivery_id, countdown=delay)


@shared_task(name=SWEEP_TASK, ignore_result=True)
def sweep_task() -> int:
    from strata.notify.services import sweep

    return sweep()
