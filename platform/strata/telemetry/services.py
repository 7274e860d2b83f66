"""Recording and pruning device telemetry."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from strata.telemetry.models import DeviceSample


def samples_record(rows: list[tuple[int, float, int]], now=None) -> None:
    """Store (device id, utilization %, memory bytes) samples taken at ``now``."""
    now = now or timezone.now()
    DeviceSample.objects.bulk_create(
        [DeviceSample(device_id=device_id, time=now, utilization=utilization, memory_used=memory)
         for device_id, utilization, memory in rows]
    )


def samples_prune(now=None) -> int:
    cutoff = (now or timezone.now()) - timedelta(days=settings.STRATA_TELEMETRY_RETENTION_DAYS)
    deleted, _ = DeviceSample.objects.filter(time__lt=cutoff).delete()
    return deleted
