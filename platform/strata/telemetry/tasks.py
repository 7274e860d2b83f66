from celery import shared_task


@shared_task(name="strata.telemetry.retention", ignore_result=True)
def retention_task() -> None:
    from strata.telemetry.services import samples_prune

    samples_prune()
