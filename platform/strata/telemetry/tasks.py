"""Celery adapters over telemetry.services, run by the beat on the ``control`` queue."""

from celery import shared_task


@shared_task(name="strata.telemetry.rollup", ignore_result=True)
def rollup_task() -> None:
    from strata.telemetry.services import rollups_update

    rollups_update()


@shared_task(name="strata.telemetry.retention", ignore_result=True)
def retention_task() -> None:
    from strata.telemetry.services import telemetry_prune

    telemetry_prune()
