"""``strata bench dashboard``: how fast the cluster page renders over long telemetry ranges, how big its chart
payload is, and what the telemetry rollups cost.

In a throw-away STRATA_HOME on SQLite (and, when STRATA_DATABASE_URL points at PostgreSQL, in a scratch
database created on that server and dropped afterwards), a worker process (``python -m
benchmarks.core.dashboard worker``) builds a cluster of 25 nodes x 4 devices with 30 days of telemetry in the
three tiers the page reads (generated directly in bulk, with a diurnal load pattern per device):

* hour rollups for 30 days, minute rollups for the last 2 days, raw samples (every 3 s) for the last 2 hours;
* some running jobs sharing devices, placed by the real scheduler, so the tables have something to show.

It then measures, through Django's test client logged in as a cluster admin (server time: URL routing,
middleware, queries, figure building and template rendering, no network):

1. ``/cluster/?range=`` 1h, 24h, 7d and 30d, N times each: p50 and p95, page bytes and embedded figure bytes;
2. ``/cluster/charts/?range=`` (the live-refresh payload): time and bytes;
3. ``rollups_update``: a 2-hour backlog of raw samples (what the first beat after two hours of downtime
   sees), and one steady-state beat (one minute of new samples);
4. baselines, in the same run on the same data: the previous reader (fetch every row, bucket in Python) for
   the 1h and 24h ranges, and the naive 30-day chart (every minute-level point with its own timestamp, for a
   subset of devices, extrapolated linearly to the whole cluster since generating 4.3 million rows per
   run is not practical).

Targets: the 30-day page renders in under 1 s (p95) and its chart payload is under 1 MB.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks import benchkit
from benchmarks.benchkit import percentile
from benchmarks.stack import clean_env

RENDER_TARGET_S = 1.0
PAYLOAD_TARGET_BYTES = 1_000_000
GIB = 2**30
DEVICE_MEMORY = 80 * GIB
HEARTBEAT_S = 3
RANGES = ("1h", "24h", "7d", "30d")

FULL_SIZES = {"nodes": 25, "devices_per_node": 4, "days": 30, "minute_days": 2, "raw_hours": 2, "renders": 20,
              "jobs": 120, "baseline_devices": 10}
QUICK_SIZES = {"nodes": 3, "devices_per_node": 4, "days": 30, "minute_days": 2, "raw_hours": 2, "renders": 3,
               "jobs": 12, "baseline_devices": 2}


def _say(message: str) -> None:
    print(message, flush=True)


def _percentile(values: list[float], fraction: float) -> float:
    """The harness's percentile, NaN when there are no values."""
    value = percentile(values, fraction)
    return float("nan") if value is None else value


# --- synthetic telemetry ------------------------------------------------------------------------------------

class Profile:
    """One device's load: a diurnal curve (busiest mid-afternoon UTC) scaled per device, weekends quieter,
    and a few devices that are mostly idle."""

    def __init__(self, rng: random.Random):
        self.idle = rng.random() < 0.15
        self.base = rng.uniform(2, 10) if self.idle else rng.uniform(15, 45)
        self.amplitude = rng.uniform(0, 10) if self.idle else rng.uniform(25, 55)
        self.phase = rng.uniform(-2.0, 2.0)  # hours
        self.memory_floor = rng.uniform(0.02, 0.15)

    def utilization(self, unix: float) -> float:
        hours = unix / 3600.0
        day = math.cos(2 * math.pi * ((hours % 24) - 14 - self.phase) / 24)
        weekday = datetime.fromtimestamp(unix, tz=UTC).weekday()
        scale = 0.55 if weekday >= 5 else 1.0
        return max(0.0, min(100.0, self.base + self.amplitude * scale * max(0.0, day)))

    def memory(self, utilization: float) -> int:
        return int(DEVICE_MEMORY * min(0.98, self.memory_floor + 0.0075 * utilization))


def _clamp(value: float) -> float:
    return max(0.0, min(100.0, value))


def generate_telemetry(device_ids: list[int], now: datetime, sizes: dict, rng: random.Random) -> dict:
    """Insert hour rollups (``days``), minute rollups (``minute_days``, up to ``raw_hours`` ago) and raw samples
    (the last ``raw_hours``), and set the watermarks as if the beat had run until ``raw_hours`` ago."""
    from strata.scheduling.services import insert_rows
    from strata.telemetry.models import DeviceRollup, DeviceSample, RollupWatermark

    end = int(now.timestamp())
    raw_start = end - sizes["raw_hours"] * 3600
    minute_end = raw_start - raw_start % 60
    hour_end = raw_start - raw_start % 3600
    hour_start = hour_end - sizes["days"] * 86400
    minute_start = minute_end - sizes["minute_days"] * 86400
    profiles = {device_id: Profile(rng) for device_id in device_ids}
    fields = ["device", "resolution", "time", "utilization_mean", "utilization_max", "memory_used_mean", "samples"]
    counts = {"hour": 0, "minute": 0, "raw": 0}

    def when(seconds: int) -> datetime:
        return datetime.fromtimestamp(seconds, tz=UTC)

    started = time.perf_counter()
    for device_id, profile in profiles.items():
        rows = []
        for start in range(hour_start, hour_end, 3600):
            mean = _clamp(profile.utilization(start + 1800) + rng.gauss(0, 3))
            rows.append((device_id, 3600, when(start), mean, _clamp(mean + rng.uniform(5, 25)),
                         profile.memory(mean), 3600 // HEARTBEAT_S))
        insert_rows(DeviceRollup, fields, rows)
        counts["hour"] += len(rows)
        rows = []
        for start in range(minute_start, minute_end, 60):
            mean = _clamp(profile.utilization(start + 30) + rng.gauss(0, 4))
            rows.append((device_id, 60, when(start), mean, _clamp(mean + rng.uniform(0, 10)),
                         profile.memory(mean), 60 // HEARTBEAT_S))
        insert_rows(DeviceRollup, fields, rows)
        counts["minute"] += len(rows)
        rows = []
        for moment in range(raw_start, end, HEARTBEAT_S):
            value = _clamp(profile.utilization(moment) + rng.gauss(0, 6))
            rows.append((device_id, when(moment), value, profile.memory(value)))
        insert_rows(DeviceSample, ["device", "time", "utilization", "memory_used"], rows)
        counts["raw"] += len(rows)
    RollupWatermark.objects.update_or_create(resolution=60, defaults={"until": when(minute_end)})
    RollupWatermark.objects.update_or_create(resolution=3600, defaults={"until": when(hour_end)})
    counts["seconds"] = time.perf_counter() - started
    return counts


def populate(sizes: dict, now: datetime, rng: random.Random) -> dict:
    """Nodes, devices, a cluster admin, running jobs that share devices, and the telemetry."""
    from django.utils import timezone as dj_timezone

    from benchmarks.core.cp_shared import MIXED_REQUESTS, bench_job
    from strata.accounts import services as accounts
    from strata.cluster.models import Device, Node
    from strata.jobs.models import Job, JobState
    from strata.scheduling.services import schedule_pass

    admin = accounts.user_create("bench-admin", secrets.token_urlsafe(12), admin=True)
    teams = [accounts.team_create(slug) for slug in ("vision", "language", "speech")]
    lease = dj_timezone.now() + timedelta(hours=6)
    nodes = [Node(name=f"gpu-{index:02d}", hostname=f"gpu-{index:02d}.cluster.local", state=Node.State.UP,
                  labels={"rack": f"r{index // 8}", "gpu": "h100"}, lease_expires_at=lease)
             for index in range(sizes["nodes"])]
    Node.objects.bulk_create(nodes)
    Device.objects.bulk_create([
        Device(node=node, index=index, kind=Device.Kind.CUDA, name="NVIDIA H100 80GB HBM3",
               memory_total=DEVICE_MEMORY, utilization=rng.uniform(0, 100), memory_used=int(rng.uniform(0, 60) * GIB))
        for node in nodes for index in range(sizes["devices_per_node"])])
    kind, spec = bench_job()
    Job.objects.bulk_create([
        Job(team=teams[i % len(teams)], owner=admin, kind=kind, name=f"{teams[i % len(teams)].slug}-run-{i}",
            spec=spec, resources=dict(MIXED_REQUESTS[i % len(MIXED_REQUESTS)]),
            state=JobState.QUEUED, queued_at=dj_timezone.now() + timedelta(microseconds=i))
        for i in range(sizes["jobs"])])
    placed = schedule_pass(dispatch=False).placed
    device_ids = list(Device.objects.order_by("node__name", "index").values_list("id", flat=True))
    telemetry = generate_telemetry(device_ids, now, sizes, rng)
    return {"admin": admin, "device_ids": device_ids, "jobs_placed": placed, "telemetry": telemetry}


# --- measurements -------------------------------------------------------------------------------------------

_FIGURE_SCRIPT = re.compile(r'<script type="application/json" id="fig-[a-z]+">(.*?)</script>', re.S)


def _timed_get(client, url: str, renders: int) -> tuple[list[float], bytes]:
    client.get(url)  # warm-up: template compilation, connection set-up
    seconds, body = [], b""
    for _ in range(renders):
        begin = time.perf_counter()
        response = client.get(url)
        seconds.append(time.perf_counter() - begin)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
        body = response.content
    return seconds, body


def measure_pages(admin, renders: int) -> list[dict]:
    from django.test import Client

    client = Client()
    client.force_login(admin)
    results = []
    for range_key in RANGES:
        seconds, body = _timed_get(client, f"/cluster/?range={range_key}", renders)
        html = body.decode()
        embedded = sum(len(match.encode()) for match in _FIGURE_SCRIPT.findall(html))
        chart_seconds, chart_body = _timed_get(client, f"/cluster/charts/?range={range_key}", renders)
        charts = json.loads(chart_body)
        utilization = charts["figures"]["utilization"]["data"]
        values = sum(1 for trace in utilization for value in trace["y"] if value is not None)
        if not values:
            raise RuntimeError(f"the {range_key} utilization chart is empty")
        results.append({
            "range": range_key, "source": charts["grid"]["source"], "buckets": charts["grid"]["buckets"],
            "step_s": charts["grid"]["step"], "traces": len(utilization), "values": values,
            "page_p50_s": _percentile(seconds, 0.5), "page_p95_s": _percentile(seconds, 0.95),
            "page_bytes": len(body), "embedded_figure_bytes": embedded,
            "charts_p50_s": _percentile(chart_seconds, 0.5), "charts_p95_s": _percentile(chart_seconds, 0.95),
            "charts_bytes": len(chart_body)})
        _say(f"  /cluster/?range={range_key}: p50 {results[-1]['page_p50_s'] * 1000:.0f} ms, "
             f"p95 {results[-1]['page_p95_s'] * 1000:.0f} ms, figures {embedded / 1000:.0f} kB embedded, "
             f"charts endpoint {len(chart_body) / 1000:.0f} kB ({charts['grid']['source']} tier, "
             f"{charts['grid']['buckets']} buckets of {charts['grid']['step']} s)")
    return results


def measure_rollups(device_ids: list[int], now: datetime, rng: random.Random) -> dict:
    """The 2-hour backlog the generator left, then one beat's worth (a minute of samples from every device)."""
    from strata.scheduling.services import insert_rows
    from strata.telemetry.models import DeviceSample
    from strata.telemetry.services import rollups_update

    begin = time.perf_counter()
    backlog = rollups_update(now=now)
    backlog_seconds = time.perf_counter() - begin
    start = int(now.timestamp()) + 1
    rows = [(device_id, datetime.fromtimestamp(start + offset, tz=UTC), rng.uniform(0, 100), GIB)
            for device_id in device_ids for offset in range(0, 60, HEARTBEAT_S)]
    insert_rows(DeviceSample, ["device", "time", "utilization", "memory_used"], rows)
    begin = time.perf_counter()
    beat = rollups_update(now=now + timedelta(seconds=75))
    beat_seconds = time.perf_counter() - begin
    return {"backlog_seconds": backlog_seconds, "backlog_rows": backlog, "beat_seconds": beat_seconds,
            "beat_rows": beat, "beat_samples": len(rows)}


def _python_bucketing(model, device_ids, since, until, points, value_fields) -> dict:
    """The reader this replaces: fetch every row of the range and bucket it in Python."""
    span = max((until - since).total_seconds(), 1.0)
    width = span / points
    buckets: dict[int, dict[int, list[float]]] = {}
    rows = model.filter(device_id__in=device_ids, time__gte=since, time__lte=until)
    for device_id, moment, utilization, memory in rows.values_list("device_id", "time", *value_fields):
        slot = int((moment - since).total_seconds() // width)
        entry = buckets.setdefault(device_id, {}).setdefault(slot, [0.0, 0.0, 0])
        entry[0] += utilization
        entry[1] += memory
        entry[2] += 1
    return buckets


def measure_baselines(device_ids: list[int], now: datetime, sizes: dict, rng: random.Random) -> dict:
    from strata.cluster.models import Device, Node
    from strata.scheduling.services import insert_rows
    from strata.telemetry.models import DeviceRollup, DeviceSample
    from strata.telemetry.selectors import device_grid

    results = {}
    # 1. Previous reader vs the tiered, database-side one, on the same rows.
    for range_key, span, model, fields in (
            ("1h", timedelta(hours=1), DeviceSample.objects, ("utilization", "memory_used")),
            ("24h", timedelta(hours=24), DeviceRollup.objects.filter(resolution=60),
             ("utilization_mean", "memory_used_mean"))):
        old, new = [], []
        for _ in range(3):
            begin = time.perf_counter()
            _python_bucketing(model, device_ids, now - span, now, 240, fields)
            old.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            device_grid(device_ids, now - span, now, 240)
            new.append(time.perf_counter() - begin)
        results[f"reader_{range_key}"] = {"python_s": statistics.median(old), "tiered_s": statistics.median(new)}
        _say(f"  {range_key} series of {len(device_ids)} devices: fetch-and-bucket-in-Python "
             f"{statistics.median(old) * 1000:.0f} ms, tiered SQL aggregation {statistics.median(new) * 1000:.0f} ms")

    # 2. The naive 30-day chart: every minute-level point, each with its own timestamp, for a subset of devices.
    subset = sizes["baseline_devices"]
    node = Node.objects.create(name="baseline-only", state=Node.State.DOWN)
    devices = Device.objects.bulk_create([Device(node=node, index=i, kind=Device.Kind.CUDA, name="baseline",
                                                 memory_total=DEVICE_MEMORY) for i in range(subset)])
    end = int(now.timestamp()) // 60 * 60
    start = end - 30 * 86400
    fields = ["device", "resolution", "time", "utilization_mean", "utilization_max", "memory_used_mean", "samples"]
    for device in devices:
        profile = Profile(rng)
        insert_rows(DeviceRollup, fields, [
            (device.pk, 60, datetime.fromtimestamp(moment, tz=UTC), profile.utilization(moment),
             profile.utilization(moment), profile.memory(profile.utilization(moment)), 20)
            for moment in range(start, end, 60)])
    ids = [device.pk for device in devices]
    begin = time.perf_counter()
    series: dict[int, tuple[list, list]] = {device_id: ([], []) for device_id in ids}
    rows = DeviceRollup.objects.filter(resolution=60, device_id__in=ids, time__gte=now - timedelta(days=30))
    for device_id, moment, value in rows.order_by("device_id", "time").values_list("device_id", "time",
                                                                                    "utilization_mean"):
        xs, ys = series[device_id]
        xs.append(moment.isoformat())
        ys.append(value)
    figure = {"data": [{"type": "scatter", "mode": "lines", "name": f"baseline:gpu{i}", "x": xs, "y": ys}
                       for i, (xs, ys) in enumerate(series.values())], "layout": {}}
    payload = len(json.dumps(figure, separators=(",", ":")).encode())
    naive_seconds = time.perf_counter() - begin
    scale = len(device_ids) / subset
    results["naive_30d"] = {"devices_measured": subset, "points": sum(len(ys) for _, ys in series.values()),
                            "seconds": naive_seconds, "payload_bytes": payload,
                            "extrapolated_seconds": naive_seconds * scale,
                            "extrapolated_payload_bytes": int(payload * scale)}
    _say(f"  naive 30-day utilization chart from minute-level points, {subset} devices: "
         f"{naive_seconds * 1000:.0f} ms, {payload / 1e6:.1f} MB (x{scale:g} for {len(device_ids)} devices: "
         f"{naive_seconds * scale:.1f} s, {payload * scale / 1e6:.0f} MB)")
    return results


def measure(sizes: dict) -> dict:
    """Populate a freshly migrated database and run every measurement (Django must be set up)."""
    from django.db import connection
    from django.utils import timezone as dj_timezone

    rng = random.Random(20240601)
    now = dj_timezone.now()
    begin = time.perf_counter()
    world = populate(sizes, now, rng)
    telemetry = world["telemetry"]
    _say(f"  {len(world['device_ids'])} devices on {sizes['nodes']} nodes, {world['jobs_placed']} jobs placed; "
         f"telemetry rows: {telemetry['hour']:,} hour, {telemetry['minute']:,} minute, {telemetry['raw']:,} raw "
         f"(generated in {time.perf_counter() - begin:.1f} s)")
    rollups = measure_rollups(world["device_ids"], now, rng)
    _say(f"  rollups_update: 2 h backlog ({telemetry['raw']:,} raw samples) {rollups['backlog_seconds'] * 1000:.0f} ms "
         f"-> {rollups['backlog_rows']}; one beat ({rollups['beat_samples']:,} samples) "
         f"{rollups['beat_seconds'] * 1000:.0f} ms")
    pages = measure_pages(world["admin"], sizes["renders"])
    baselines = measure_baselines(world["device_ids"], now, sizes, rng)
    return {"database": connection.vendor, "devices": len(world["device_ids"]), "nodes": sizes["nodes"],
            "jobs_placed": world["jobs_placed"], "telemetry_rows": telemetry, "rollups": rollups, "pages": pages,
            "baselines": baselines}


def _worker(argv: list[str]) -> int:
    """``python -m benchmarks.core.dashboard worker [--quick]``: set Django up on this process's environment,
    migrate, measure, and print the results as JSON on the last line."""
    parser = argparse.ArgumentParser(prog="benchmarks.core.dashboard worker")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if "STRATA_HOME" not in os.environ:  # never the user's ~/.strata
        os.environ["STRATA_HOME"] = tempfile.mkdtemp(prefix="strata-bench-dashboard-")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
    os.environ.setdefault("STRATA_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    result = measure(QUICK_SIZES if args.quick else FULL_SIZES)
    print(json.dumps(result, default=str), flush=True)
    return 0


# --- the parent process: one worker per backend, then the report -------------------------------------------

def _scratch_database(url: str) -> tuple[str, str]:
    """Create an empty database on the PostgreSQL server of ``url``; returns (its URL, its name)."""
    import psycopg

    name = f"strata_bench_dashboard_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = url.partition("?")[0].rpartition("/")
    return f"{base}/{name}", name


def _drop_database(url: str, name: str) -> None:
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception as error:  # noqa: BLE001 - report and go on
        _say(f"  warning: could not drop scratch database {name}: {error}")


def run_worker(backend: str, quick: bool, database_url: str | None = None) -> dict:
    home = Path(tempfile.mkdtemp(prefix="strata-bench-dashboard-"))
    env = {**clean_env(), "STRATA_HOME": str(home), "STRATA_LOG_LEVEL": "WARNING"}
    if database_url:
        env["STRATA_DATABASE_URL"] = database_url
    command = [sys.executable, "-m", "benchmarks.core.dashboard", "worker"] + (["--quick"] if quick else [])
    try:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = []
        for line in process.stdout:
            lines.append(line)
            if not line.startswith("{"):
                _say(line.rstrip())
        stderr = process.stderr.read()
        if process.wait(timeout=60) != 0 or not lines or not lines[-1].startswith("{"):
            raise RuntimeError(f"the dashboard benchmark failed on {backend}:\n{stderr[-3000:]}")
    finally:
        shutil.rmtree(home, ignore_errors=True)  # the full run's SQLite database is ~100 MB
    result = json.loads(lines[-1])
    result["backend"] = backend
    return result


def _row(measurement: str, backend: str, measured: str, target: str = "-", met: bool | None = None,
         ratio: str = "") -> dict:
    return {"measurement": measurement, "backend": backend, "measured": measured, "target": target,
            "met": "-" if met is None else ("yes" if met else "NO"), "vs baseline": ratio}


def _table(rows: list[dict]) -> str:
    header = list(rows[0]) if rows else []
    return benchkit.table([[row[key] for key in header] for row in rows], header)


def _figures(results: dict, quick: bool) -> list[benchkit.Figure]:
    """The common figures of each backend: the 30-day cluster page and its charts against the naive build."""
    figures = []
    for result in results["runs"]:
        backend = result["database"]
        thirty = next(page for page in result["pages"] if page["range"] == "30d")
        naive = result["baselines"]["naive_30d"]
        figures.append(benchkit.Figure(
            f"charts_30d_{backend}", f"30-day cluster charts ({backend}): /cluster/charts/ p50 against the naive "
            "build from minute points", thirty["charts_p50_s"], naive["extrapolated_seconds"], "s",
            target=None if quick else 1.0))
        figures.append(benchkit.Figure(
            f"page_30d_{backend}", f"30-day cluster page render p95 ({backend}), against the 1 s target",
            thirty["page_p95_s"], RENDER_TARGET_S, "s", target=None if quick else 1.0,
            baseline_text="target 1 s"))
        figures.append(benchkit.Figure(
            f"payload_30d_{backend}", f"30-day chart payload ({backend}) against the naive payload",
            thirty["charts_bytes"], naive["extrapolated_payload_bytes"], "bytes",
            # The 1 MB payload target, as a ratio: naive / ours >= naive / 1 MB exactly when ours <= 1 MB.
            target=None if quick else naive["extrapolated_payload_bytes"] / PAYLOAD_TARGET_BYTES,
            mechanism_text=f"{thirty['charts_bytes'] / 1000:.0f} kB",
            baseline_text=f"{naive['extrapolated_payload_bytes'] / 1e6:.0f} MB"))
    return figures


def report_rows(result: dict, quick: bool) -> list[dict]:
    backend = result["database"]
    rows = []
    for page in result["pages"]:
        is_target = page["range"] == "30d" and not quick
        rows.append(_row(f"/cluster/?range={page['range']} render p50 / p95", backend,
                         f"{page['page_p50_s'] * 1000:.0f} / {page['page_p95_s'] * 1000:.0f} ms",
                         "p95 < 1 s" if page["range"] == "30d" else "-",
                         page["page_p95_s"] < RENDER_TARGET_S if is_target else None))
    naive = result["baselines"]["naive_30d"]
    for page in result["pages"]:
        ratio = ""
        if page["range"] == "30d":
            ratio = f"{naive['extrapolated_payload_bytes'] / page['charts_bytes']:.0f}x smaller than naive"
        rows.append(_row(f"chart payload {page['range']} (endpoint / embedded)", backend,
                         f"{page['charts_bytes'] / 1000:.0f} / {page['embedded_figure_bytes'] / 1000:.0f} kB",
                         "< 1 MB" if page["range"] == "30d" else "-",
                         page["charts_bytes"] < PAYLOAD_TARGET_BYTES if page["range"] == "30d" and not quick else None,
                         ratio))
    thirty = next(page for page in result["pages"] if page["range"] == "30d")
    rows.append(_row(f"naive 30d chart build, minute points (x{result['devices'] / naive['devices_measured']:g})",
                     backend, f"{naive['extrapolated_seconds']:.2f} s, {naive['extrapolated_payload_bytes'] / 1e6:.0f} MB",
                     ratio=f"{naive['extrapolated_seconds'] / thirty['charts_p50_s']:.0f}x slower than /cluster/charts/"))
    for key in ("reader_1h", "reader_24h"):
        reader = result["baselines"][key]
        rows.append(_row(f"{key.split('_')[1]} series read: Python bucketing / tiered SQL", backend,
                         f"{reader['python_s'] * 1000:.0f} / {reader['tiered_s'] * 1000:.0f} ms",
                         ratio=f"{reader['python_s'] / reader['tiered_s']:.1f}x faster"))
    rollups = result["rollups"]
    rows.append(_row(f"rollups_update, 2 h backlog ({result['telemetry_rows']['raw']:,} samples)", backend,
                     f"{rollups['backlog_seconds'] * 1000:.0f} ms"))
    rows.append(_row(f"rollups_update, one beat ({rollups['beat_samples']:,} samples)", backend,
                     f"{rollups['beat_seconds'] * 1000:.0f} ms", "< 60 s (beat period)",
                     rollups["beat_seconds"] < 60 if not quick else None))
    return rows


def main(quick: bool = False, output: str | None = None) -> int:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    started = datetime.now(UTC)
    machine = {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
               "platform": platform.platform(), "python": platform.python_version()}
    _say(f"strata bench dashboard{' --quick' if quick else ''}: {started:%Y-%m-%d %H:%M} UTC, {machine['cpus']} CPUs, "
         f"{machine['platform']}, Python {machine['python']}")
    devices = sizes["nodes"] * sizes["devices_per_node"]
    _say(f"  {sizes['nodes']} nodes x {sizes['devices_per_node']} devices, {sizes['days']} days of telemetry, "
         f"{sizes['renders']} renders per range")
    results = {"quick": quick, "date": started.isoformat(), "machine": machine, "sizes": sizes, "runs": []}
    backends = [("sqlite", None)]
    url = os.environ.get("STRATA_DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        backends.append(("postgresql", url))
    for backend, server_url in backends:
        _say(f"\n[{backend}] {devices} devices")
        scratch = None
        try:
            database_url = None
            if server_url:
                try:
                    database_url, scratch = _scratch_database(server_url)
                except Exception as error:  # noqa: BLE001 - a server we cannot use is reported, not fatal
                    _say(f"  skipped: cannot create a scratch database on STRATA_DATABASE_URL's server: {error}")
                    results["skipped"] = str(error)
                    continue
            results["runs"].append(run_worker(backend, quick, database_url))
        finally:
            if scratch:
                _drop_database(server_url, scratch)
    rows = [row for run in results["runs"] for row in report_rows(run, quick)]
    results["table"] = rows
    _say("\nResults" + (" (quick: small sizes, targets apply to the full run)" if quick else ""))
    _say(_table(rows))
    _say("Render times are server-side (Django test client in-process: routing, middleware, queries, figures, "
         "templates). The naive baseline is measured on a subset of devices and scaled linearly.")
    if output:
        benchkit.write(benchkit.document("dashboard", quick, _figures(results, quick), details=results,
                                         machine=machine), output)
        _say(f"results written to {output}")
    failed = [row for row in rows if row["met"] == "NO"]
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(_worker(sys.argv[2:]))
    sys.exit(main(quick="--quick" in sys.argv[1:], output=None))
