"""Delivering lifecycle events (:mod:`components.runtime.contract.events`) to the plugins' subscribers.

``emit(event)`` schedules delivery for after the current transaction commits (at once outside one): an event of
a rolled-back transaction is never seen. Delivery is synchronous and at most once, in the committing process;
each subscriber is isolated: one that raises is logged and the others still get the event. Chosen over a Celery
task so that events cost no broker round trip on every transition and keep their order per job; a subscriber
that needs durability or slow work starts its own task.
"""

from __future__ import annotations

import logging

from django.db import transaction

from components.runtime.contract.events import Event

log = logging.getLogger(__name__)


def deliver(event: Event) -> None:
    """Call every registered subscriber with ``event`` now, isolating each."""
    from components.runtime.contract import registry

    for subscriber in registry.subscribers():
        try:
            subscriber(event)
        except Exception:  # noqa: BLE001 - a plugin's subscriber must never break a transition
            log.exception("lifecycle subscriber %r failed on %s", subscriber, event.name)


def emit(event: Event) -> None:
    """Deliver ``event`` once the current transaction commits."""
    from components.runtime.contract import registry

    if not registry.subscribers():
        return  # nothing to do: no on_commit hook on the hot path of a platform without subscribers
    transaction.on_commit(lambda: deliver(event))


def emit_many(events: list[Event]) -> None:
    """Deliver several events, in order, once the current transaction commits (the scheduler's bulk moves)."""
    from components.runtime.contract import registry

    if not events or not registry.subscribers():
        return

    def run() -> None:
        for event in events:
            deliver(event)

    transaction.on_commit(run)
