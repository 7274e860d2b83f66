"""The plugin's lifecycle subscriber: logs every state change of a ``primes`` job on the control plane."""

from __future__ import annotations

import logging

from components.runtime.contract.events import Event, JobTransitioned

log = logging.getLogger("strata_primes")


def on_event(event: Event) -> None:
    if isinstance(event, JobTransitioned) and event.kind == "primes":
        log.info("primes job %s: %s -> %s%s", event.job_id, event.source or "new", event.target,
                 f" ({event.reason})" if event.reason else "")
