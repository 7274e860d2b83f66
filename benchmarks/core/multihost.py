"""The cross-host figure of ``strata bench control-plane``: submit -> RUNNING latency when the control plane and
the node are separate hosts (network namespaces on a bridge, :mod:`benchmarks.core.hosts`), on PostgreSQL and a
Redis broker on the control-plane host, with the production defaults (3 s heartbeats, 2 s beat ticks).

The jobs are the same as the single-host figure's (:func:`benchmarks.core.cp_shared.bench_job`, a bare function
that returns at once), submitted at a steady rate well under the node's slots, so the figure is latency (the
pass the submit asks for, the dispatch through Redis to the node's worker across the bridge, its claim over
HTTP), not queueing. Needs root (namespaces) and the machine's PostgreSQL; raises with the reason otherwise.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.core.hosts import HostCluster, Hosts


def _say(message: str) -> None:
    print(message, flush=True)


def _percentile(values: list[float], fraction: float) -> float:
    from benchmarks.benchkit import percentile

    return percentile(values, fraction) if values else float("nan")


def measure_cross_host_latency(jobs: int, rate: float, virtual_gpus: int = 8) -> dict:
    """Start a control-plane host and a node host, submit ``jobs`` short jobs at ``rate`` per second from the
    control-plane host, and return submit -> RUNNING statistics (server timestamps: ``started_at - created_at``)."""
    from benchmarks.core.cp_shared import _job_body, _parse_time

    home = Path(tempfile.mkdtemp(prefix="strata-bench-hosts-"))
    _say(f"  making two hosts (network namespaces on a bridge), state in {home}")
    with Hosts(["cp", "n1"]) as hosts:
        cluster = HostCluster(hosts, home, database="postgres", fast=False)
        try:
            cluster.start()
            cluster.start_node("n1", virtual_gpus=virtual_gpus)
            _say(f"  control plane on {hosts.address('cp')}, node on {hosts.address('n1')} "
                 f"({virtual_gpus} virtual GPUs)")

            def submit(name: str) -> str:
                return cluster.api("POST", "jobs/", json=_job_body(name))["id"]

            def started(ids: list[str], timeout: float) -> dict[str, dict]:
                done: dict[str, dict] = {}
                deadline = time.monotonic() + timeout
                while len(done) < len(ids) and time.monotonic() < deadline:
                    for job_id in ids:
                        if job_id not in done:
                            job = cluster.api("GET", f"jobs/{job_id}/")
                            if job.get("started_at") or job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
                                done[job_id] = job
                    if len(done) < len(ids):
                        time.sleep(0.5)
                return done

            warm = [submit(f"warmup-{i}") for i in range(2)]
            warmed = started(warm, 180)
            if len(warmed) < len(warm) or not all(job.get("started_at") for job in warmed.values()):
                raise RuntimeError(f"warm-up jobs did not start across hosts:\n{cluster.output()}")
            time.sleep(3.0)
            _say(f"  submitting {jobs} jobs at a steady {rate:g}/s from the control-plane host")
            ids: list[str] = []
            began = time.monotonic()
            for index in range(jobs):
                delay = began + index / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                ids.append(submit(f"bench-{index}"))
                if (index + 1) % max(1, jobs // 10) == 0:
                    _say(f"    submitted {index + 1}/{jobs}")
            records = started(ids, 180)
            latencies = [(_parse_time(job["started_at"]) - _parse_time(job["created_at"])).total_seconds()
                         for job in records.values() if job.get("started_at")]
            result = {"backend": "two-hosts", "jobs": jobs, "rate_per_s": rate,
                      "started": len(latencies), "not_started": len(ids) - len(latencies),
                      "p50_s": _percentile(latencies, 0.50), "p90_s": _percentile(latencies, 0.90),
                      "p99_s": _percentile(latencies, 0.99), "max_s": max(latencies, default=float("nan")),
                      "mean_s": statistics.fmean(latencies) if latencies else float("nan")}
            _say(f"  across hosts: p50 {result['p50_s'] * 1000:.1f} ms, p99 {result['p99_s'] * 1000:.1f} ms "
                 f"({len(latencies)}/{jobs} started)")
            return result
        finally:
            cluster.stop()


def _standalone(argv: list[str]) -> int:
    """``python -m benchmarks.core.multihost [--runs N] [--jobs J] [--rate R] [--output F]``: the cross-host latency
    and, in the same run, the single-host PostgreSQL + Redis latency of ``strata bench control-plane`` (the
    baseline), N times each; each figure is the median over the runs with their range (never the best run)."""
    import argparse

    from benchmarks import benchkit
    from benchmarks.core.cp_shared import LATENCY_P50_TARGET, measure_latency
    from benchmarks.core.hosts import unavailable
    from benchmarks.stack import services_available

    parser = argparse.ArgumentParser(prog="benchmarks.core.multihost")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    problem = services_available() or unavailable()
    if problem:
        _say(f"the cross-host figure needs PostgreSQL, Redis and network namespaces: {problem}")
        return 2
    runs: list[dict] = []
    for run in range(args.runs):
        _say(f"[cross-host latency] run {run + 1}/{args.runs}")
        runs.append({"two_hosts": measure_cross_host_latency(args.jobs, args.rate),
                     "one_host": measure_latency("postgres+redis", args.jobs, args.rate, 8)})

    def spread(key: str, value: str) -> tuple[float, list[float]]:
        values = [run[key][value] for run in runs]
        return statistics.median(values), [min(values), max(values)]

    across, across_range = spread("two_hosts", "p50_s")
    local, local_range = spread("one_host", "p50_s")
    p99, p99_range = spread("two_hosts", "p99_s")
    over = f"median of {len(runs)} runs"
    made = [
        benchkit.Figure("latency_p50_two_hosts", f"submit -> RUNNING p50 with the control plane and the node on "
                        f"separate hosts (PostgreSQL + Redis), against the 100 ms target ({over})", across,
                        LATENCY_P50_TARGET, "s", target=1.0, baseline_text="target 100 ms",
                        mechanism_text=f"{across * 1000:.1f} ms ({across_range[0] * 1000:.1f}-"
                                       f"{across_range[1] * 1000:.1f}); p99 {p99 * 1000:.0f} ms",
                        extra={"range": across_range, "p99_s": p99, "p99_range": p99_range}),
        benchkit.Figure("cross_host_overhead", f"submit -> RUNNING p50 across hosts against the same stack on one "
                        f"host, same run ({over})", across, local, "s", target=None,
                        mechanism_text=f"two hosts {across * 1000:.1f} ms",
                        baseline_text=f"one host {local * 1000:.1f} ms ({local_range[0] * 1000:.1f}-"
                                      f"{local_range[1] * 1000:.1f})",
                        extra={"one_host_range": local_range}),
    ]
    doc = benchkit.document("control-plane-hosts", False, made,  # machine: benchkit.machine_facts()
                            details={"runs": runs, "jobs": args.jobs, "rate_per_s": args.rate})
    _say(benchkit.figures_table(doc))
    benchkit.write(doc, args.output)  # nothing without --output
    if args.output:
        _say(f"results written to {args.output}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_standalone(sys.argv[1:]))
