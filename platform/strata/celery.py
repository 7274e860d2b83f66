"""The control plane's one Celery app: scheduler tasks on the ``control`` queue, node dispatch by name.

It is also the leaf every layer asks for a scheduling pass through (:func:`request_pass`): the pass is sent by
task name, so jobs, quotas and cluster never import the scheduler that sits above them.
"""

from __future__ import annotations

import logging
import os

from celery import Celery

from components.runtime.shared.broker import COMMON_CELERY_SETTINGS

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")

app = Celery("strata")
log = logging.getLogger(__name__)
SCHEDULE_PASS_TASK = "strata.scheduling.pass"  # strata.scheduling.tasks registers it
EXPIRE_UPLOADS_TASK = "strata.scheduling.expire_uploads"  # likewise
UPLOAD_EXPIRY_SECONDS = 600.0  # how often the beat looks for expired uploads
RETENTION_TASK = "strata.scheduling.retention"  # likewise: the collector of stored bytes no policy keeps


def _configure() -> None:
    from django.conf import settings

    app.conf.update(
        **COMMON_CELERY_SETTINGS,
        **settings.CELERY_BROKER_OPTIONS,
        task_default_queue="control",
        beat_schedule={
            "scheduler-tick": {
                "task": "strata.scheduling.tick",
                "schedule": settings.STRATA_SCHEDULER_TICK_SECONDS,
                "options": {"queue": "control", "expires": settings.STRATA_SCHEDULER_TICK_SECONDS * 5},
            },
            "telemetry-rollup": {
                "task": "strata.telemetry.rollup",
                "schedule": 60.0,
                "options": {"queue": "control", "expires": 120},
            },
            "telemetry-retention": {
                "task": "strata.telemetry.retention",
                "schedule": 3600.0,
                "options": {"queue": "control"},
            },
            "data-uploads-expiry": {  # uploads not completed within STRATA_UPLOAD_EXPIRY_HOURS, with their chunks
                "task": EXPIRE_UPLOADS_TASK,
                "schedule": UPLOAD_EXPIRY_SECONDS,
                "options": {"queue": "control", "expires": UPLOAD_EXPIRY_SECONDS},
            },
            "notify-sweep": {  # deliveries whose message was lost, queued again (strata.notify.services.sweep)
                "task": "strata.notify.sweep",
                "schedule": 60.0,
                "options": {"queue": "notify", "expires": 60},
            },
            "storage-retention": {  # checkpoints, artifacts and unused code bundles no keep policy keeps
                "task": RETENTION_TASK,
                "schedule": settings.STRATA_RETENTION_INTERVAL_SECONDS,
                "options": {"queue": "control", "expires": settings.STRATA_RETENTION_INTERVAL_SECONDS},
            },
            "tracking-mirror": {  # jobs mirrored to their team's MLflow server (strata.tracking)
                "task": "strata.tracking.mirror",
                "schedule": settings.STRATA_MLFLOW_SYNC_SECONDS,
                "options": {"queue": "control", "expires": settings.STRATA_MLFLOW_SYNC_SECONDS},
            },
            "eta-refresh": {  # the waiting jobs' start-time estimates (strata.scheduling.eta), on the leader
                "task": "strata.scheduling.eta",
                "schedule": max(settings.STRATA_ETA_SECONDS, 1.0),
                "options": {"queue": "control", "expires": max(settings.STRATA_ETA_SECONDS, 1.0)},
            },
            "audit-retention": {  # audit log entries older than STRATA_AUDIT_RETENTION_DAYS (strata.audit)
                "task": "strata.audit.retention",
                "schedule": 3600.0,
                "options": {"queue": "control", "expires": 3600},
            },
        },
    )


app.on_configure.connect(lambda **_: _configure(), weak=False)
app.autodiscover_tasks(["strata.scheduling", "strata.telemetry", "strata.audit", "strata.notify", "strata.tracking"])


def request_pass() -> None:
    """Ask for a scheduling pass soon: send the pass task, by name, to the control queue. With
    STRATA_SCHEDULE_INLINE (set by the test suite only) the registered task runs here and now instead, still
    found by name. A pass that cannot be sent is logged: the beat tick runs one anyway."""
    from django.conf import settings

    if settings.STRATA_SCHEDULE_INLINE:
        if SCHEDULE_PASS_TASK not in app.tasks:  # outside a worker the tasks are discovered on first use
            app.loader.import_default_modules()
        app.tasks[SCHEDULE_PASS_TASK]()
        return
    try:
        app.send_task(SCHEDULE_PASS_TASK, queue="control")
    except Exception:
        log.exception("could not request a scheduling pass; the next tick will run one")
