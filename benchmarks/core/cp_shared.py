"""What the control-plane benchmarks share: :mod:`benchmarks.core.control_plane`, its heartbeat part
(:mod:`benchmarks.core.heartbeats`) and its cross-host part (:mod:`benchmarks.core.multihost`), and the other core
benchmarks that submit its job. It holds the targets, the cheapest real job (:func:`bench_job`, a no-op), the mix
of requests of the scheduling-pass benchmark, and part 1 of ``strata bench control-plane``: submit -> RUNNING
latency on a real stack (:func:`measure_latency`).

This module imports neither torch nor Django at import time.
"""

from __future__ import annotations

import secrets
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from benchmarks.benchkit import percentile
from benchmarks.stack import (
    REDIS_URL,
    Stack,
    clear_redis_prefix,
    create_database,
    database_url,
    drop_database,
    free_port,
)

LATENCY_P50_TARGET = 0.100  # seconds, submit -> RUNNING, median
PASS_TARGET = 1.0  # seconds, one scheduling pass at full size

# Requests of the pass benchmark, cycled in submission order: whole, half, quarter, memory-sized
# (4 GiB of a 16 GiB device = a quarter) and two-device jobs. 8 GPUs of demand per 10 jobs.
MIXED_REQUESTS = [
    {"gpus": 1.0, "gpu_memory": None, "workers": 1}, {"gpus": 1.0, "gpu_memory": None, "workers": 1},
    {"gpus": 1.0, "gpu_memory": None, "workers": 1}, {"gpus": 1.0, "gpu_memory": None, "workers": 1},
    {"gpus": 0.5, "gpu_memory": None, "workers": 1}, {"gpus": 0.5, "gpu_memory": None, "workers": 1},
    {"gpus": 0.5, "gpu_memory": None, "workers": 1}, {"gpus": 0.25, "gpu_memory": None, "workers": 1},
    {"gpus": 0.0, "gpu_memory": 4 * 2**30, "workers": 1}, {"gpus": 2.0, "gpu_memory": None, "workers": 1},
]


def noop(ctx) -> None:
    """What the latency benchmark's jobs run: returns at once, so the child never imports torch."""
    return None


NOOP = "benchmarks.core.cp_shared:noop"


def bench_job() -> tuple[str, dict]:
    """``(kind, spec)`` of a job that runs :func:`noop`: the first registered kind that can run a bare function
    (``KindSpec.entrypoint_spec``)."""
    from components.runtime.contract import registry

    for kind, spec in registry.kinds().items():
        found = spec.entrypoint_spec(NOOP)
        if found is not None:
            return kind, found
    raise RuntimeError("no registered job kind can run a bare function (KindSpec.entrypoint_spec)")


def _say(message: str) -> None:
    print(message, flush=True)


def _percentile(values: list[float], fraction: float) -> float:
    """The harness's percentile, NaN (shown as n/a) when there are no values."""
    value = percentile(values, fraction)
    return float("nan") if value is None else value


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# --- part 1: submit -> RUNNING latency on a real stack ------------------------------------------------------

def _job_body(name: str) -> dict:
    kind, spec = bench_job()
    return {"name": name, "kind": kind, "max_attempts": 1, "time_limit": 300, "resources": {"gpus": 0.125},
            "spec": spec}


def _wait_started(client, job_ids: list[str], timeout: float) -> dict[str, dict]:
    """Poll until every job has started_at (or ended without one); returns the job records."""
    done: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(job_ids) and time.monotonic() < deadline:
        for job_id in job_ids:
            if job_id in done:
                continue
            job = client.get(f"jobs/{job_id}/")
            if job.get("started_at") or job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
                done[job_id] = job
        if len(done) < len(job_ids):
            time.sleep(0.5)
    return done


def measure_latency(backend: str, jobs: int, rate: float, virtual_gpus: int) -> dict:
    """Start a stack on ``backend`` ("embedded" or "postgres+redis"), submit ``jobs`` short jobs at ``rate``
    per second, and return submit -> RUNNING statistics."""
    from components.runtime.client.client import ControlPlaneClient

    home = Path(tempfile.mkdtemp(prefix=f"strata-bench-{backend.replace('+', '-')}-"))
    extra_env, database, prefix = {}, None, None
    if backend == "postgres+redis":
        database = create_database()
        prefix = f"strata-bench-{secrets.token_hex(4)}:"
        extra_env = {"STRATA_DATABASE_URL": database_url(database), "STRATA_BROKER_URL": REDIS_URL,
                     "STRATA_BROKER_PREFIX": prefix}
    port = free_port()
    _say(f"  starting strata up ({backend}) on port {port}, {virtual_gpus} virtual GPUs, state in {home}")
    stack = Stack(home, port, virtual_gpus, extra_env)
    try:
        credentials = stack.wait_ready()
        client = ControlPlaneClient(stack.url, credentials["token"], retries=3, timeout=30)
        # Warm-up: the node registers, its worker starts, and the first passes and claims run.
        warm = [client.post("jobs/", _job_body(f"warmup-{i}"))["id"] for i in range(2)]
        warmed = _wait_started(client, warm, timeout=120)
        if len(warmed) < len(warm) or not all(job.get("started_at") for job in warmed.values()):
            raise RuntimeError(f"warm-up jobs did not start; see {home / 'logs'}")
        time.sleep(3.0)  # let the warm-up children finish so the measured run starts idle
        _say(f"  stack ready; submitting {jobs} jobs at a steady {rate:g}/s "
             f"(0.125 GPU each, {2 * virtual_gpus} worker slots on the node)")
        ids: list[str] = []
        submit_seconds: list[float] = []
        started = time.monotonic()
        for index in range(jobs):
            delay = started + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent = time.perf_counter()
            ids.append(client.post("jobs/", _job_body(f"bench-{index}"))["id"])
            submit_seconds.append(time.perf_counter() - sent)
            if (index + 1) % max(1, jobs // 10) == 0:
                _say(f"    submitted {index + 1}/{jobs}")
        records = _wait_started(client, ids, timeout=180)
        latencies = [(_parse_time(job["started_at"]) - _parse_time(job["created_at"])).total_seconds()
                     for job in records.values() if job.get("started_at")]
        missing = len(ids) - len(latencies)
        result = {
            "backend": backend, "jobs": jobs, "rate_per_s": rate, "started": len(latencies),
            "not_started": missing,
            "p50_s": _percentile(latencies, 0.50), "p90_s": _percentile(latencies, 0.90),
            "p99_s": _percentile(latencies, 0.99), "max_s": max(latencies) if latencies else float("nan"),
            "mean_s": statistics.fmean(latencies) if latencies else float("nan"),
            "submit_http_p50_s": _percentile(submit_seconds, 0.50),
            "submit_http_p99_s": _percentile(submit_seconds, 0.99),
        }
        _say(f"  {backend}: p50 {result['p50_s'] * 1000:.1f} ms, p99 {result['p99_s'] * 1000:.1f} ms "
             f"({len(latencies)}/{jobs} started; submit HTTP p50 {result['submit_http_p50_s'] * 1000:.1f} ms)")
        return result
    finally:
        stack.stop()
        _say(f"  stack ({backend}) stopped")
        if database:
            drop_database(database)
        if prefix:
            clear_redis_prefix(prefix)
