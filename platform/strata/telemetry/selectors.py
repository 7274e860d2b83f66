"""Reading device telemetry as evenly spaced buckets, aggregated by the database from the cheapest tier.

:func:`device_grid` answers "utilization and memory of these devices over this range" with at most
``points`` buckets per device, all the same width, so a chart needs only the first bucket's time and the
width (plotly's ``x0``/``dx``) instead of a timestamp per point.

Which tier is read depends on the length of the range:

======================  ==========================  =========================================
range                   tier                        rows read per device (worst case)
======================  ==========================  =========================================
up to 2 hours           raw samples (~3 s)          2,400
up to 2 days            minute rollups              2,880
longer                  hour rollups                24 per day (720 for 30 days)
======================  ==========================  =========================================

Rollups lag behind the present (minutes until the next beat run, hours until the hour is complete), so the
part of the range after a tier's watermark is read from the next finer tier: the latest bucket of a 30-day
chart is as current as the raw samples.

Bucket widths are "nice" multiples of the tier's resolution (15 s, 1 min, 10 min, 1 h, 4 h, ...) and buckets
are aligned to multiples of their width in Unix time, so consecutive polls of a live chart show the same
buckets, and a rollup never straddles two buckets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Count, F, Max, Sum

from strata.telemetry.expressions import EpochBucket
from strata.telemetry.models import DeviceRollup, DeviceSample
from strata.telemetry.services import HOUR, MINUTE, watermark

RAW = 0
SOURCE_NAMES = {RAW: "raw", MINUTE: "minute", HOUR: "hour"}
RAW_MAX_SPAN = timedelta(hours=2)
MINUTE_MAX_SPAN = timedelta(days=2)
DEFAULT_POINTS = 240
NICE_STEPS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 14400,
              21600, 43200, 86400, 2 * 86400, 7 * 86400)


@dataclass
class DeviceGrid:
    """Telemetry of several devices on one grid of ``count`` buckets of ``step`` seconds from ``start``.

    Each series is a list of ``count`` values, None where a device reported nothing in that bucket.
    """

    start: datetime
    step: int
    count: int
    source: str
    utilization: dict[int, list[float | None]] = field(default_factory=dict)
    utilization_max: dict[int, list[float | None]] = field(default_factory=dict)
    memory_used: dict[int, list[float | None]] = field(default_factory=dict)
    rows_read: int = 0

    @property
    def end(self) -> datetime:
        return self.start + timedelta(seconds=self.step * self.count)

    def center(self, index: int) -> float:
        """Unix time of the middle of bucket ``index``."""
        return self.start.timestamp() + (index + 0.5) * self.step


def series_source(span: timedelta) -> int:
    """The tier for a range of this length: RAW (0), MINUTE (60) or HOUR (3600)."""
    if span <= RAW_MAX_SPAN:
        return RAW
    if span <= MINUTE_MAX_SPAN:
        return MINUTE
    return HOUR


def grid_layout(since: datetime, until: datetime, resolution: int, points: int) -> tuple[int, int, int]:
    """(origin in Unix seconds, step in seconds, bucket count) of the coarsest-needed grid over
    ``[since, until]``: the smallest nice step (a multiple of ``resolution``, at least a heartbeat for raw
    samples) for which the aligned grid has at most ``points`` buckets."""
    points = max(1, int(points))
    first, last = since.timestamp(), max(until.timestamp(), since.timestamp() + 1)
    floor_step = max(resolution, math.ceil(settings.STRATA_HEARTBEAT_SECONDS)) if resolution == RAW else resolution
    candidates = [step for step in NICE_STEPS if step >= floor_step and step % max(resolution, 1) == 0]
    for step in candidates:
        origin = int(first // step) * step
        count = math.ceil((last - origin) / step)
        if count <= points:
            return origin, step, count
    step = candidates[-1]
    while True:  # ranges beyond the table: keep doubling
        step *= 2
        origin = int(first // step) * step
        count = math.ceil((last - origin) / step)
        if count <= points:
            return origin, step, count


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


class _Accumulator:
    """Per device, per bucket: weighted utilization sum, peak, weighted memory sum and sample count, in flat
    lists indexed by bucket (no per-cell objects: a 100-device, 240-bucket grid is 24,000 cells)."""

    def __init__(self, count: int):
        self.count = count
        self.devices: dict[int, tuple[list[float], list[float], list[float], list[int]]] = {}
        self.rows = 0

    def add(self, rows: Iterable[tuple]) -> None:
        count, devices = self.count, self.devices
        for device_id, bucket, utilization, peak, memory, samples in rows:
            self.rows += 1
            if not samples or not 0 <= bucket < count:
                continue
            series = devices.get(device_id)
            if series is None:
                series = devices[device_id] = ([0.0] * count, [0.0] * count, [0.0] * count, [0] * count)
            # float(): PostgreSQL sums integers as numeric, which arrives as Decimal.
            series[0][bucket] += float(utilization)
            peak = float(peak)
            if peak > series[1][bucket]:
                series[1][bucket] = peak
            series[2][bucket] += float(memory)
            series[3][bucket] += int(samples)


def _read_raw(acc: _Accumulator, ids, lo: datetime, hi: datetime, origin: int, step: int) -> None:
    rows = (DeviceSample.objects.filter(device_id__in=ids, time__gte=lo, time__lt=hi).order_by()
            .annotate(bucket=EpochBucket("time", origin, step)).values("device_id", "bucket")
            .annotate(u=Sum("utilization"), peak=Max("utilization"), m=Sum("memory_used"), n=Count("id"))
            .values_list("device_id", "bucket", "u", "peak", "m", "n"))
    acc.add(rows)


def _read_rollups(acc: _Accumulator, resolution: int, ids, lo: datetime, hi: datetime, origin: int,
                  step: int) -> None:
    rows = (DeviceRollup.objects.filter(resolution=resolution, device_id__in=ids, time__gte=lo, time__lt=hi)
            .order_by().annotate(bucket=EpochBucket("time", origin, step)).values("device_id", "bucket")
            .annotate(u=Sum(F("utilization_mean") * F("samples")), peak=Max("utilization_max"),
                      m=Sum(F("memory_used_mean") * F("samples")), n=Sum("samples"))
            .values_list("device_id", "bucket", "u", "peak", "m", "n"))
    acc.add(rows)


def _collect(acc: _Accumulator, resolution: int, ids, lo: datetime, hi: datetime, origin: int, step: int) -> None:
    """Read ``[lo, hi)`` from the ``resolution`` tier up to its watermark and the rest from finer tiers."""
    if lo >= hi:
        return
    if resolution == RAW:
        _read_raw(acc, ids, lo, hi, origin, step)
        return
    done = watermark(resolution)
    covered = min(hi, done) if done is not None else lo
    if covered > lo:
        _read_rollups(acc, resolution, ids, lo, covered, origin, step)
    _collect(acc, MINUTE if resolution == HOUR else RAW, ids, max(lo, covered), hi, origin, step)


def device_grid(device_ids, since: datetime, until: datetime, points: int = DEFAULT_POINTS) -> DeviceGrid:
    """Mean utilization (%), peak utilization (%) and mean memory used (bytes) of ``device_ids`` in at most
    ``points`` evenly spaced buckets covering ``[since, until]``; see the module docstring for the tiers."""
    ids = list(device_ids)
    resolution = series_source(until - since)
    origin, step, count = grid_layout(since, until, resolution, points)
    grid = DeviceGrid(start=_when(origin), step=step, count=count, source=SOURCE_NAMES[resolution])
    if not ids:
        return grid
    acc = _Accumulator(count)
    _collect(acc, resolution, ids, _when(origin), _when(origin + step * count), origin, step)
    empty = [None] * count
    for device_id in ids:
        series = acc.devices.get(device_id)
        if series is None:
            grid.utilization[device_id], grid.utilization_max[device_id] = list(empty), list(empty)
            grid.memory_used[device_id] = list(empty)
            continue
        sums, peaks, memory, samples = series
        grid.utilization[device_id] = [sums[i] / n if n else None for i, n in enumerate(samples)]
        grid.utilization_max[device_id] = [peaks[i] if n else None for i, n in enumerate(samples)]
        grid.memory_used[device_id] = [memory[i] / n if n else None for i, n in enumerate(samples)]
    grid.rows_read = acc.rows
    return grid


def device_series(device_ids, since: datetime, until: datetime, points: int = DEFAULT_POINTS) -> dict[int, list[dict]]:
    """The same data as :func:`device_grid`, as ``{device id: [{"time", "utilization", "memory_used"}, ...]}``
    with one entry per non-empty bucket (``time`` is the bucket's middle, Unix seconds)."""
    grid = device_grid(device_ids, since, until, points)
    series = {}
    for device_id, values in grid.utilization.items():
        memory = grid.memory_used[device_id]
        points_ = [{"time": grid.center(i), "utilization": value, "memory_used": memory[i]}
                   for i, value in enumerate(values) if value is not None]
        if points_:
            series[device_id] = points_
    return series
