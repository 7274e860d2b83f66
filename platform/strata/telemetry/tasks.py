"""Celery adapters over telemetry.services, run by the beat on the ``control`` queue. With several scheduler
replicas only the leader (scheduling.leader) runs them; the watermarks make a skipped run catch up later."""

import logging

from celery import shared_task

log = logging.getLogger(__name__)


def _leader() -> bool:
    """Renew (or take, if nobody holds it) the scheduler's leader lease: true on the leader only."""
    from strata.scheduling.leader import lease_acquire

    if lease_acquire() is not None:
        return True
    log.debug("not the scheduler leader: telemetry maintenance left to the leader")
    return False


@shared_task(name="strata.telemetry.rollup", ignore_result=True)
def rollup_task() -> None:
    from strata.telemetry.services import rollups_update

    if _leader():
        rollups_update()


@shared_task(name="strata.telemetry.retention", ignore_result=True)
def retention_task() -> None:
    from strata.telemetry.services import telemetry_prune

    if _leader():
        telemetry_prune()
