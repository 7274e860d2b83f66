"""Recording, rolling up and pruning device telemetry.

Rollups (:func:`rollups_update`) summarize completed time buckets so long chart ranges read few rows:
minute rollups from raw samples, hour rollups from minute rollups. Each resolution has a watermark
(:class:`~strata.telemetry.models.RollupWatermark`): every bucket that starts before it is done. A run
aggregates the buckets between the watermark and the last completed bucket in SQL (``GROUP BY`` device and
:class:`~strata.telemetry.expressions.EpochBucket`), upserts them with ``bulk_create(update_conflicts=True)``
(recomputing a bucket replaces it, so runs are idempotent), then moves the watermark.

Choices:

* A bucket counts as completed ``ROLLUP_GRACE`` after it ends, so a heartbeat stamped just before the end
  of a minute but committed just after it is still included.
* A long backlog (the first run, or after the beat was down) is processed in chunks of ``MINUTE_CHUNK`` /
  ``HOUR_CHUNK`` so memory stays bounded; each chunk moves the watermark, so an interrupted run resumes.
* Means are weighted by sample count when minutes are combined into hours, so an hour with a gap is the
  mean of the samples it has, not of per-minute means.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, F, Max, Min, Sum
from django.utils import timezone

from strata.telemetry.expressions import EpochBucket
from strata.telemetry.models import DeviceRollup, DeviceSample, ReportSeries, RollupWatermark

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

MINUTE = DeviceRollup.Resolution.MINUTE
HOUR = DeviceRollup.Resolution.HOUR
ROLLUP_GRACE = timedelta(seconds=10)
MINUTE_CHUNK = timedelta(hours=6)
HOUR_CHUNK = timedelta(days=4)
MINUTE_ROLLUP_DAYS = 8  # minute rollups back ranges up to 2 days; kept longer so a late look still works


def samples_record(rows: list[tuple[int, float, int]], now=None) -> None:
    """Store (device id, utilization %, memory bytes) samples taken at ``now``."""
    now = now or timezone.now()
    DeviceSample.objects.bulk_create(
        [DeviceSample(device_id=device_id, time=now, utilization=utilization, memory_used=memory)
         for device_id, utilization, memory in rows]
    )


def _floor(moment: datetime, seconds: int) -> datetime:
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _from_epoch(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def watermark(resolution: int) -> datetime | None:
    """Rollups of ``resolution`` are complete for buckets starting before this time (None: never run)."""
    return RollupWatermark.objects.filter(resolution=resolution).values_list("until", flat=True).first()


def _set_watermark(resolution: int, until: datetime) -> None:
    RollupWatermark.objects.update_or_create(resolution=resolution, defaults={"until": until})


def _upsert(rollups: list[DeviceRollup]) -> None:
    if rollups:
        DeviceRollup.objects.bulk_create(
            rollups, batch_size=2000, update_conflicts=True, unique_fields=["device", "resolution", "time"],
            update_fields=["utilization_mean", "utilization_max", "memory_used_mean", "samples"])


def _minute_rows(start: datetime, end: datetime) -> list[DeviceRollup]:
    rows = (DeviceSample.objects.filter(time__gte=start, time__lt=end).order_by()
            .annotate(bucket=EpochBucket("time", 0, MINUTE)).values("device_id", "bucket")
            .annotate(mean=Avg("utilization"), peak=Max("utilization"), memory=Avg("memory_used"), n=Count("id")))
    return [DeviceRollup(device_id=row["device_id"], resolution=MINUTE, time=_from_epoch(row["bucket"] * MINUTE),
                         utilization_mean=row["mean"], utilization_max=row["peak"],
                         memory_used_mean=round(row["memory"]), samples=row["n"]) for row in rows]


def _hour_rows(start: datetime, end: datetime) -> list[DeviceRollup]:
    rows = (DeviceRollup.objects.filter(resolution=MINUTE, time__gte=start, time__lt=end).order_by()
            .annotate(bucket=EpochBucket("time", 0, HOUR)).values("device_id", "bucket")
            .annotate(weighted=Sum(F("utilization_mean") * F("samples")), peak=Max("utilization_max"),
                      memory=Sum(F("memory_used_mean") * F("samples")), n=Sum("samples")))
    return [DeviceRollup(device_id=row["device_id"], resolution=HOUR, time=_from_epoch(row["bucket"] * HOUR),
                         utilization_mean=float(row["weighted"]) / row["n"], utilization_max=row["peak"],
                         memory_used_mean=round(float(row["memory"]) / row["n"]), samples=row["n"])
            for row in rows if row["n"]]


def _roll(resolution: int, source, end: datetime, chunk: timedelta, build) -> int:
    """Roll up ``source`` rows (a queryset with a ``time`` field) into ``resolution`` buckets up to ``end``."""
    start = watermark(resolution)
    pending = source.filter(time__gte=start) if start is not None else source
    first = pending.filter(time__lt=end).aggregate(first=Min("time"))["first"]
    if first is None:  # nothing new: the buckets up to ``end`` are complete (and empty)
        if start is None or start < end:
            _set_watermark(resolution, end)
        return 0
    cursor = _floor(first, resolution)
    written = 0
    while cursor < end:
        stop = min(end, cursor + chunk)
        with transaction.atomic():
            rollups = build(cursor, stop)
            _upsert(rollups)
            _set_watermark(resolution, stop)
        written += len(rollups)
        cursor = stop
    return written


def rollups_update(now=None) -> dict[str, int]:
    """Aggregate every completed minute and hour bucket since the watermarks; returns rows written per
    resolution. Safe to run concurrently with heartbeats and to run twice (the second run writes nothing)."""
    now = now or timezone.now()
    minute_end = _floor(now - ROLLUP_GRACE, MINUTE)
    minutes = _roll(MINUTE, DeviceSample.objects.all(), minute_end, MINUTE_CHUNK, _minute_rows)
    # An hour is complete once all of its minutes are.
    hour_end = _floor(watermark(MINUTE) or minute_end, HOUR)
    hours = _roll(HOUR, DeviceRollup.objects.filter(resolution=MINUTE), hour_end, HOUR_CHUNK, _hour_rows)
    return {"minute": minutes, "hour": hours}


def rollups_rebuild(since: datetime, now=None) -> dict[str, int]:
    """Recompute every rollup bucket from ``since`` on (for example after importing late samples)."""
    for resolution in (MINUTE, HOUR):
        current = watermark(resolution)
        if current is not None and current > since:
            _set_watermark(resolution, _floor(since, resolution))
    return rollups_update(now)


def telemetry_prune(now=None) -> dict[str, int]:
    """Delete raw samples after STRATA_TELEMETRY_RAW_DAYS, minute rollups after MINUTE_ROLLUP_DAYS and hour
    rollups after STRATA_TELEMETRY_RETENTION_DAYS; the plugins' report series (never rolled up) after
    STRATA_TELEMETRY_RAW_DAYS. Returns rows deleted per tier."""
    now = now or timezone.now()
    raw_cutoff = now - timedelta(days=settings.STRATA_TELEMETRY_RAW_DAYS)
    report_series, _ = ReportSeries.objects.filter(start__lt=raw_cutoff).delete()
    minute_cutoff = now - timedelta(days=MINUTE_ROLLUP_DAYS)
    # Never drop what the next tier has not summarized yet (the beat may have been down for a while, or have
    # never run: without a watermark nothing is summarized, so nothing of that tier may go).
    raw_cutoff = min(raw_cutoff, watermark(MINUTE) or EPOCH)
    minute_cutoff = min(minute_cutoff, watermark(HOUR) or EPOCH)
    raw, _ = DeviceSample.objects.filter(time__lt=raw_cutoff).delete()
    minute, _ = DeviceRollup.objects.filter(resolution=MINUTE, time__lt=minute_cutoff).delete()
    hour, _ = DeviceRollup.objects.filter(
        resolution=HOUR, time__lt=now - timedelta(days=settings.STRATA_TELEMETRY_RETENTION_DAYS)).delete()
    return {"raw": raw, "minute": minute, "hour": hour, "report_series": report_series}
