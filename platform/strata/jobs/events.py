"""Delivering lifecycle events (:mod:`components.runtime.contract.events`) to their subscribers: the plugins'
(their manifests' ``subscribers``, every event) and the control plane's own apps (:func:`subscribe`, in an app's
``ready()``, for the event names they ask for: e.g. ``strata.notify``).

``emit(event)`` schedules delivery for after the current transaction commits (at once outside one): an event of
a rolled-back transaction is never seen. Delivery is synchronous and at most once, in the committing process;
each subscriber is isolated: one that raises is logged and the others still get the event. Chosen over a Celery
task so that events cost no broker round trip on every transition and keep their order per job; a subscriber
that needs durability or slow work starts its own task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.db import transaction

from components.runtime.contract.events import Event

log = logging.getLogger(__name__)

# The control plane's own subscribers: (callable, the event names it wants, or None for every event).
_core: list[tuple[Callable[[Event], Any], frozenset[str] | None]] = []


def subscribe(subscriber: Callable[[Event], Any], events: Iterable[str] | None = None) -> None:
    """Register a control-plane subscriber (once; again is a no-op) for the events named ``events`` (their
    ``Event.name``: "job.transitioned", "quota.reached"...), or every event. Called from an app's ``ready()``."""
    if any(existing == subscriber for existing, _ in _core):  # == : a bound method is a new object each time
        return
    _core.append((subscriber, frozenset(events) if events is not None else None))


def unsubscribe(subscriber: Callable[[Event], Any]) -> None:
    _core[:] = [(existing, names) for existing, names in _core if existing != subscriber]


def subscribers(name: str | None = None) -> list[Any]:
    """Every subscriber of an event named ``name`` (with None: of any event): the core's, then the plugins'."""
    from components.runtime.contract import registry

    core = [subscriber for subscriber, names in _core if names is None or name is None or name in names]
    return [*core, *registry.subscribers()]


def deliver(event: Event) -> None:
    """Call every subscriber of ``event`` now, isolating each."""
    for subscriber in subscribers(event.name):
        try:
            subscriber(event)
        except Exception:  # noqa: BLE001 - a subscriber must never break a transition
            log.exception("lifecycle subscriber %r failed on %s", subscriber, event.name)


def emit(event: Event) -> None:
    """Deliver ``event`` once the current transaction commits."""
    if not subscribers(event.name):
        return  # nothing to do: no on_commit hook on the hot path of a platform without subscribers
    transaction.on_commit(lambda: deliver(event))


def emit_many(events: list[Event]) -> None:
    """Deliver several events, in order, once the current transaction commits (the scheduler's bulk moves)."""
    events = [event for event in events if subscribers(event.name)]
    if not events:
        return

    def run() -> None:
        for event in events:
            deliver(event)

    transaction.on_commit(run)
