"""Telemetry rollups (minute from raw, hour from minutes), the watermark, pruning, and the tiered reader."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from strata.cluster.models import Device
from strata.telemetry.models import DeviceRollup, DeviceSample, RollupWatermark
from strata.telemetry.selectors import device_grid, device_series, grid_layout, series_source
from strata.telemetry.services import (
    HOUR,
    MINUTE,
    rollups_rebuild,
    rollups_update,
    telemetry_prune,
    watermark,
)

T0 = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)  # an hour boundary
GIB = 2**30


@pytest.fixture
def devices(make_node):
    make_node("n1", gpus=2)
    return list(Device.objects.order_by("index"))


def sample(device, at, utilization, memory=GIB):
    DeviceSample.objects.create(device=device, time=at, utilization=utilization, memory_used=memory)


def rollup(device, resolution, at):
    return DeviceRollup.objects.get(device=device, resolution=resolution, time=at)


def test_minute_and_hour_rollups_have_the_right_means_peaks_and_counts(devices):
    a, b = devices
    # minute 10:00: a = 10, 20, 60 (three samples); b = 50 (one sample)
    for second, value in ((0, 10), (20, 20), (59.9, 60)):
        sample(a, T0 + timedelta(seconds=second), value, memory=value * GIB)
    sample(b, T0 + timedelta(seconds=30), 50, memory=2 * GIB)
    # minute 10:01: a = 40 (one sample)
    sample(a, T0 + timedelta(seconds=61), 40, memory=4 * GIB)
    # minute 11:00 starts the next hour: a = 90
    sample(a, T0 + timedelta(hours=1, seconds=5), 90)

    written = rollups_update(now=T0 + timedelta(hours=1, minutes=2))
    assert written == {"minute": 4, "hour": 2}

    first = rollup(a, MINUTE, T0)
    assert first.utilization_mean == pytest.approx(30.0)
    assert first.utilization_max == pytest.approx(60.0)
    assert first.memory_used_mean == 30 * GIB
    assert first.samples == 3
    second = rollup(a, MINUTE, T0 + timedelta(minutes=1))
    assert (second.utilization_mean, second.samples) == (40.0, 1)
    assert rollup(b, MINUTE, T0).utilization_mean == 50.0

    # The hour is weighted by samples: (10 + 20 + 60 + 40) / 4, not the mean of minute means.
    hour = rollup(a, HOUR, T0)
    assert hour.utilization_mean == pytest.approx(32.5)
    assert hour.utilization_max == 60.0
    assert hour.samples == 4
    assert hour.memory_used_mean == round((10 + 20 + 60 + 4) / 4 * GIB)
    assert rollup(b, HOUR, T0).samples == 1
    # 11:00 is rolled up as a minute but its hour is not complete yet.
    assert rollup(a, MINUTE, T0 + timedelta(hours=1)).utilization_mean == 90.0
    assert not DeviceRollup.objects.filter(resolution=HOUR, time=T0 + timedelta(hours=1)).exists()
    assert watermark(MINUTE) == T0 + timedelta(hours=1, minutes=1)
    assert watermark(HOUR) == T0 + timedelta(hours=1)


def test_rollups_are_idempotent_and_move_with_the_watermark(devices):
    a = devices[0]
    sample(a, T0 + timedelta(seconds=5), 10)
    now = T0 + timedelta(minutes=5)
    assert rollups_update(now=now)["minute"] == 1
    assert rollups_update(now=now) == {"minute": 0, "hour": 0}
    assert DeviceRollup.objects.filter(resolution=MINUTE).count() == 1

    # A bucket still within the grace period (or in progress) is not rolled up yet.
    sample(a, T0 + timedelta(minutes=5, seconds=1), 70)
    assert rollups_update(now=T0 + timedelta(minutes=6, seconds=5))["minute"] == 0
    assert rollups_update(now=T0 + timedelta(minutes=6, seconds=15))["minute"] == 1
    assert watermark(MINUTE) == T0 + timedelta(minutes=6)
    # Only the new bucket was aggregated: the old one is untouched.
    assert DeviceRollup.objects.filter(resolution=MINUTE).count() == 2

    # Recomputing replaces the bucket instead of duplicating it.
    sample(a, T0 + timedelta(seconds=30), 30)
    assert rollups_update(now=T0 + timedelta(minutes=7))["minute"] == 0  # behind the watermark: not seen
    rollups_rebuild(T0, now=T0 + timedelta(minutes=7))
    assert DeviceRollup.objects.filter(resolution=MINUTE).count() == 2
    replaced = rollup(a, MINUTE, T0)
    assert (replaced.utilization_mean, replaced.samples) == (20.0, 2)


def test_a_long_backlog_is_processed_in_chunks(devices):
    a = devices[0]
    for hour in range(20):  # 20 hours, more than one MINUTE_CHUNK
        sample(a, T0 + timedelta(hours=hour, minutes=1), hour)
    written = rollups_update(now=T0 + timedelta(hours=20, minutes=5))
    assert written == {"minute": 20, "hour": 20}
    assert [r.utilization_mean for r in DeviceRollup.objects.filter(resolution=HOUR).order_by("time")] == list(range(20))


def test_heartbeats_feed_rollups(make_node):
    from strata.cluster.services import node_heartbeat

    node = make_node("n1", gpus=2)
    node_heartbeat(node, str(node.session), [{"index": 0, "utilization": 42.0, "memory_used": GIB}], [])
    rollups_update(now=datetime.now(UTC) + timedelta(minutes=2))
    assert DeviceRollup.objects.get(resolution=MINUTE, device__index=0).utilization_mean == 42.0


def test_pruning_deletes_by_age(devices, settings):
    settings.STRATA_TELEMETRY_RAW_DAYS = 2
    settings.STRATA_TELEMETRY_RETENTION_DAYS = 35
    a = devices[0]
    now = T0 + timedelta(days=40)
    sample(a, now - timedelta(days=3), 1)
    sample(a, now - timedelta(days=1), 2)
    common = {"device": a, "utilization_mean": 1, "utilization_max": 1, "memory_used_mean": 0, "samples": 1}
    DeviceRollup.objects.create(resolution=MINUTE, time=now - timedelta(days=9), **common)
    DeviceRollup.objects.create(resolution=MINUTE, time=now - timedelta(days=7), **common)
    DeviceRollup.objects.create(resolution=HOUR, time=now - timedelta(days=36), **common)
    DeviceRollup.objects.create(resolution=HOUR, time=now - timedelta(days=30), **common)
    RollupWatermark.objects.create(resolution=MINUTE, until=now)
    RollupWatermark.objects.create(resolution=HOUR, until=now)

    assert telemetry_prune(now=now) == {"raw": 1, "minute": 1, "hour": 1, "report_series": 0}
    assert list(DeviceSample.objects.values_list("utilization", flat=True)) == [2]
    assert DeviceRollup.objects.filter(resolution=MINUTE).count() == 1
    assert DeviceRollup.objects.filter(resolution=HOUR).count() == 1
    assert telemetry_prune(now=now) == {"raw": 0, "minute": 0, "hour": 0, "report_series": 0}


def test_pruning_keeps_what_is_not_rolled_up_yet(devices):
    a = devices[0]
    now = T0 + timedelta(days=10)
    sample(a, now - timedelta(days=5), 1)
    RollupWatermark.objects.create(resolution=MINUTE, until=now - timedelta(days=6))
    assert telemetry_prune(now=now)["raw"] == 0


def test_source_is_picked_by_range():
    assert series_source(timedelta(hours=1)) == 0
    assert series_source(timedelta(hours=2)) == 0
    assert series_source(timedelta(hours=24)) == MINUTE
    assert series_source(timedelta(days=2)) == MINUTE
    assert series_source(timedelta(days=7)) == HOUR
    assert series_source(timedelta(days=30)) == HOUR


@pytest.mark.parametrize("span", [timedelta(minutes=5), timedelta(hours=1), timedelta(hours=24),
                                  timedelta(days=7), timedelta(days=30), timedelta(days=400)])
@pytest.mark.parametrize("points", [240, 50])
def test_grid_is_aligned_and_bounded(span, points):
    until = T0 + timedelta(seconds=1234.5)
    resolution = series_source(span)
    origin, step, count = grid_layout(until - span, until, resolution, points)
    assert count <= points
    assert origin % step == 0 and step % max(resolution, 1) == 0
    assert origin <= (until - span).timestamp() and origin + step * count >= until.timestamp()


def _rollups(device, resolution, start, count, value):
    DeviceRollup.objects.bulk_create([
        DeviceRollup(device=device, resolution=resolution, time=start + timedelta(seconds=i * resolution),
                     utilization_mean=value, utilization_max=value + 5, memory_used_mean=GIB, samples=20)
        for i in range(count)])


def test_device_grid_reads_the_right_tier(devices):
    a, b = devices
    now = T0 + timedelta(days=30)
    # Distinct values per tier show which one a range reads: raw 10 %, minutes 20 %, hours 30 %.
    for i in range(120 * 20):
        sample(a, now - timedelta(seconds=3 * i + 1), 10)
    _rollups(a, MINUTE, now - timedelta(days=2), 2 * 24 * 60, 20)
    _rollups(a, HOUR, now - timedelta(days=30), 30 * 24, 30)
    RollupWatermark.objects.create(resolution=MINUTE, until=now)
    RollupWatermark.objects.create(resolution=HOUR, until=now)

    expectations = {timedelta(hours=1): ("raw", 10), timedelta(hours=24): ("minute", 20),
                    timedelta(days=7): ("hour", 30), timedelta(days=30): ("hour", 30)}
    for span, (source, value) in expectations.items():
        grid = device_grid([a.pk, b.pk], now - span, now, points=240)
        assert grid.source == source
        assert grid.count <= 240 and len(grid.utilization[a.pk]) == grid.count
        values = [v for v in grid.utilization[a.pk] if v is not None]
        assert values and all(v == pytest.approx(value) for v in values), (span, set(values))
        assert {v for v in grid.utilization_max[a.pk] if v is not None} <= {value, value + 5}
        assert all(v is None for v in grid.utilization[b.pk])  # a device with no data: all gaps
        # Few rows come back from the database, whatever the range.
        assert grid.rows_read <= 2 * grid.count
    assert device_grid([a.pk], now - timedelta(days=30), now, points=50).count <= 50


def test_the_tail_after_a_watermark_comes_from_the_finer_tier(devices):
    a = devices[0]
    now = T0 + timedelta(days=10)
    _rollups(a, HOUR, now - timedelta(days=7), 7 * 24 - 3, 30)  # hours complete until 3 h ago
    RollupWatermark.objects.create(resolution=HOUR, until=now - timedelta(hours=3))
    _rollups(a, MINUTE, now - timedelta(hours=3), 170, 50)  # minutes complete until 10 min ago
    RollupWatermark.objects.create(resolution=MINUTE, until=now - timedelta(minutes=10))
    for i in range(100):
        sample(a, now - timedelta(seconds=3 * i + 1), 70)
    grid = device_grid([a.pk], now - timedelta(days=7), now, points=240)
    values = grid.utilization[a.pk]
    assert grid.source == "hour"
    assert values[0] == pytest.approx(30)
    filled = [v for v in values if v is not None]
    # The last bucket mixes minute rollups (weight 20 each) and raw samples; the series reaches "now".
    assert any(v > 30 for v in filled[-2:])
    assert values[-1] is not None


def test_device_series_keeps_its_point_list_shape(devices):
    a = devices[0]
    now = T0 + timedelta(hours=1)
    sample(a, now - timedelta(minutes=30), 40, memory=GIB)
    series = device_series([a.pk], now - timedelta(hours=1), now, points=60)
    assert len(series[a.pk]) == 1
    point = series[a.pk][0]
    assert point["utilization"] == 40 and point["memory_used"] == GIB
    assert abs(point["time"] - (now - timedelta(minutes=30)).timestamp()) <= 60


def test_the_beat_runs_rollups_every_minute():
    from strata.celery import app
    from strata.telemetry import tasks

    app.loader.import_default_modules()
    schedule = app.conf.beat_schedule
    assert schedule["telemetry-rollup"]["task"] == tasks.rollup_task.name == "strata.telemetry.rollup"
    assert schedule["telemetry-rollup"]["schedule"] == 60.0
    assert schedule["telemetry-retention"]["task"] == tasks.retention_task.name


def test_pruning_without_any_rollup_yet_keeps_raw_samples(devices):
    # An upgrade from a version without rollups: retention may run before the first rollup pass.
    a = devices[0]
    now = T0 + timedelta(days=10)
    sample(a, now - timedelta(days=5), 1)
    assert telemetry_prune(now=now)["raw"] == 0
    assert DeviceSample.objects.count() == 1
