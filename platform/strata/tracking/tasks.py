"""Celery adapters over tracking.services. The beat's ``strata.tracking.mirror`` (on the ``control`` queue, run by
the scheduler leader only) is quick: it sends one ``strata.tracking.mirror_team`` per team whose server is due to
the ``tracking`` queue, whose worker (``strata tracker``, threads) does the HTTP: the scheduler's queue never
waits on a tracking server. A team's round is claimed (``TrackingServer.busy_until``) so that two workers never
mirror the same team at once. With STRATA_SCHEDULE_INLINE (the test suite) the rounds run here and now."""

import logging

from celery import shared_task

log = logging.getLogger(__name__)
MIRROR_TASK = "strata.tracking.mirror"
MIRROR_TEAM_TASK = "strata.tracking.mirror_team"
QUEUE = "tracking"


@shared_task(name=MIRROR_TASK, ignore_result=True)
def mirror_task() -> None:
    from django.conf import settings

    from strata.scheduling.leader import lease_acquire
    from strata.tracking.services import due_servers, mirror_all

    if lease_acquire() is None:
        log.debug("not the scheduler leader: MLflow mirroring left to the leader")
        return
    if settings.STRATA_SCHEDULE_INLINE:
        mirror_all()
        return
    from strata.celery import app

    for server in due_servers():
        try:
            app.send_task(MIRROR_TEAM_TASK, args=[server.pk], queue=QUEUE,
                          expires=settings.STRATA_MLFLOW_SYNC_SECONDS * 4)
        except Exception:
            log.exception("could not queue the MLflow round of team %s; the next beat tries again", server.team_id)


@shared_task(name=MIRROR_TEAM_TASK, ignore_result=True)
def mirror_team_task(server_id: int) -> None:
    from strata.tracking.services import mirror_claimed

    mirror_claimed(server_id)
