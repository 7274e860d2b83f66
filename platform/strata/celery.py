"""The control plane's one Celery app: scheduler tasks on the ``control`` queue, node dispatch by name."""

from __future__ import annotations

import os

from celery import Celery

from components.runtime.broker import COMMON_CELERY_SETTINGS

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")

app = Celery("strata")


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
        },
    )


app.on_configure.connect(lambda **_: _configure(), weak=False)
app.autodiscover_tasks(["strata.scheduling", "strata.telemetry"])
