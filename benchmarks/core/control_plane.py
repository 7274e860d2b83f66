"""``strata bench control-plane``: how fast the control plane turns a submit into a running attempt, and how
long one scheduling pass over a large queue takes.

1. Submit -> RUNNING latency (``job.started_at - job.created_at``, both stamped by the server): a real stack
   (``strata up`` as a subprocess in its own process group) on the embedded defaults (SQLite + filesystem
   broker) and on PostgreSQL + Redis (a fresh database and a fresh Redis key prefix, removed at the end).
   Short jobs are submitted at a steady rate well under the node's capacity, so the figure is latency,
   not queueing behind busy slots.
2. One scheduling pass with many queued jobs and many simulated nodes, timed in a separate process against
   a fresh database (``python -m benchmarks.core.control_plane pass ...``) with ``dispatch=False``.

Part 1's measurement, the targets and the benchmarks' job are in :mod:`benchmarks.core.cp_shared`, which the
heartbeat part (:mod:`benchmarks.core.heartbeats`) and the cross-host part (:mod:`benchmarks.core.multihost`) use
too. This module imports neither torch nor Django at import time: Django is set up only in the pass worker
process, after STRATA_HOME and the database URL are in its environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import benchkit
from benchmarks.core.cp_shared import (
    LATENCY_P50_TARGET,
    MIXED_REQUESTS,
    PASS_TARGET,
    _parse_time,
    _percentile,
    _say,
    bench_job,
    measure_latency,
)
from benchmarks.stack import (
    Stack,
    clean_env,
    create_database,
    database_url,
    drop_database,
    free_port,
    services_available,
)

DEVICE_MEMORY = 16 * 2**30
DEVICES_PER_NODE = 4

FULL_SIZES = {"latency_jobs": 200, "rate": 1.0, "virtual_gpus": 8, "pass_jobs": 10_000, "pass_nodes": 1_000,
              "sandbox_jobs": 20}
QUICK_SIZES = {"latency_jobs": 20, "rate": 2.0, "virtual_gpus": 8, "pass_jobs": 1_000, "pass_nodes": 100,
               "sandbox_jobs": 5}
SANDBOX_START_TARGET = 0.050  # seconds the sandbox may add to an attempt's start (median)


def stamp(ctx) -> None:
    """The sandbox benchmark's start probe: records when the job's own code began (unix seconds, the node's clock:
    the same machine as the control plane's here), to compare with the attempt's ``started_at``."""
    ctx.metrics({"entered_at": time.time()}, step=0)


def steps(ctx) -> None:
    """The sandbox benchmark's step probe: 40 steps of the same numpy work (a 384x384 float32 matmul chain, what a
    small model's step costs on a CPU), each step's milliseconds recorded."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((384, 384), dtype=np.float32)
    b = rng.standard_normal((384, 384), dtype=np.float32)
    for step in range(40):
        began = time.perf_counter()
        for _ in range(8):
            a = np.tanh(a @ b)
        ctx.metrics({"step_ms": (time.perf_counter() - began) * 1000}, step=step)


# --- the sandbox's cost: start and step time of a job's own code, with and without it ---------------------------

def _entrypoint_body(name: str, function: str) -> dict:
    from components.runtime.contract import registry

    for kind, spec in registry.kinds().items():
        found = spec.entrypoint_spec(function)
        if found is not None:
            return {"name": name, "kind": kind, "max_attempts": 1, "time_limit": 300, "resources": {"gpus": 0.125},
                    "spec": found}
    raise RuntimeError("no registered job kind can run a bare function (KindSpec.entrypoint_spec)")


def _wait_ended(client, job_id: str, timeout: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"jobs/{job_id}/")
        if job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            return job
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} did not end within {timeout:g} s")


def _points(client, job_id: str, name: str) -> list[float]:
    answer = client.get(f"jobs/{job_id}/metrics/", params={"name": name})
    points = answer.get("points", answer) if isinstance(answer, dict) else answer
    return [float(p["value"]) for p in points if p.get("name", name) == name]


def measure_sandbox(jobs: int) -> dict:
    """``jobs`` start probes and 2 step probes, run one at a time (entry points: a job's own code, so the node
    sandboxes them), on a node with the sandbox off and on (``STRATA_SANDBOX``). Start = when the job's code began
    minus the attempt's ``started_at`` (its claim): the worker's preparation, the process, bwrap, Python."""
    from components.runtime.client.client import ControlPlaneClient
    from components.runtime.node import sandbox

    modes = ["none"] + (["bwrap"] if sandbox.resolve_mode("auto") == "bwrap" else [])
    out: dict = {"jobs": jobs, "modes": {}}
    for mode in modes:
        home = Path(tempfile.mkdtemp(prefix=f"strata-bench-sandbox-{mode}-"))
        stack = Stack(home, free_port(), 2, {"STRATA_SANDBOX": mode})
        try:
            credentials = stack.wait_ready()
            client = ControlPlaneClient(stack.url, credentials["token"], retries=3, timeout=30)
            starts: list[float] = []
            for index in range(jobs + 1):  # the first warms the node up: not counted
                job = _wait_ended(client, client.post("jobs/", _entrypoint_body(f"start-{index}", "benchmarks.core.control_plane:stamp"))["id"])
                entered = _points(client, job["id"], "entered_at")
                if job["state"] != "SUCCEEDED" or not entered:
                    raise RuntimeError(f"the start probe failed ({job['state']}: {job.get('reason')}); see {home}")
                if index:
                    started = client.get(f"jobs/{job['id']}/")["attempts"][-1]["started_at"]
                    starts.append(entered[0] - _parse_time(started).timestamp())
            step_ms: list[float] = []
            for index in range(2):
                job = _wait_ended(client, client.post("jobs/", _entrypoint_body(f"steps-{index}", "benchmarks.core.control_plane:steps"))["id"])
                step_ms.extend(_points(client, job["id"], "step_ms")[5:])  # past the first steps' warm-up
            out["modes"][mode] = {"start_p50_s": statistics.median(starts), "start_min_s": min(starts),
                                  "start_max_s": max(starts), "step_p50_ms": statistics.median(step_ms),
                                  "step_p10_ms": _percentile(step_ms, 0.10), "step_p90_ms": _percentile(step_ms, 0.90)}
            _say(f"  sandbox {mode}: start p50 {out['modes'][mode]['start_p50_s'] * 1000:.0f} ms "
                 f"[{min(starts) * 1000:.0f}-{max(starts) * 1000:.0f}], step p50 "
                 f"{out['modes'][mode]['step_p50_ms']:.2f} ms")
        finally:
            stack.stop()
    if "bwrap" in out["modes"]:
        out["spawn"] = measure_sandbox_spawn()
        _say(f"  spawn of python -I -c pass: {out['spawn']['plain_p50_ms']:.1f} ms plain, "
             f"{out['spawn']['sandboxed_p50_ms']:.1f} ms in the sandbox (p50 of {out['spawn']['runs']})")
        off, on = out["modes"]["none"], out["modes"]["bwrap"]
        out["start_added_s"] = on["start_p50_s"] - off["start_p50_s"]
        out["step_ratio"] = on["step_p50_ms"] / off["step_p50_ms"]
    return out


def measure_sandbox_spawn(runs: int = 30) -> dict:
    """What bwrap itself adds to starting a process, without the rest of an attempt's start around it: ``python -I
    -c pass`` spawned and waited for, plain and in a sandbox laid out as a worker lays one out, alternated."""
    from components.runtime.node import sandbox

    root = Path(tempfile.mkdtemp(prefix="strata-bench-spawn-"))
    work = root / "state" / "work" / "a-0"
    work.mkdir(parents=True)
    box = sandbox.Sandbox(bwrap=sandbox.find_bwrap() or "bwrap", hide=[root / "state", Path.home()],
                          writable=[work], uid=sandbox.team_uid(1) if os.geteuid() == 0 else None, cwd=work)
    box.prepare()
    argv = [sys.executable, "-I", "-c", "pass"]
    plain: list[float] = []
    boxed: list[float] = []
    for _ in range(runs):
        for times, command, preexec in ((plain, argv, None), (boxed, box.command(argv), box.preexec())):
            began = time.perf_counter()
            subprocess.run(command, check=True, preexec_fn=preexec, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - began)
    return {"runs": runs, "plain_p50_ms": statistics.median(plain) * 1000,
            "sandboxed_p50_ms": statistics.median(boxed) * 1000,
            "added_p50_ms": (statistics.median(boxed) - statistics.median(plain)) * 1000,
            "plain_range_ms": [min(plain) * 1000, max(plain) * 1000],
            "sandboxed_range_ms": [min(boxed) * 1000, max(boxed) * 1000]}


# --- part 2: one scheduling pass at scale -------------------------------------------------------------------

def populate(jobs: int, nodes: int, mix: str = "mixed", teams: int = 4) -> dict:
    """Create ``nodes`` nodes of DEVICES_PER_NODE virtual devices and ``jobs`` QUEUED jobs (Django must be
    set up and migrated). Returns the capacity in GPUs."""
    from datetime import timedelta

    from django.utils import timezone as dj_timezone

    from strata.accounts import services as accounts
    from strata.cluster.models import Device, Node
    from strata.jobs.models import Job, JobState

    now = dj_timezone.now()
    user = accounts.user_create(f"bench-{secrets.token_hex(3)}", secrets.token_urlsafe(12))
    team_objects = [accounts.team_create(f"bench-{secrets.token_hex(3)}-{i}") for i in range(teams)]
    node_objects = [Node(name=f"bench-node-{secrets.token_hex(3)}-{i:05d}", state=Node.State.UP,
                         lease_expires_at=now + timedelta(hours=1)) for i in range(nodes)]
    Node.objects.bulk_create(node_objects, batch_size=500)
    Device.objects.bulk_create([
        Device(node=node, index=index, kind=Device.Kind.VIRTUAL, name=f"virtual-{index}", memory_total=DEVICE_MEMORY)
        for node in node_objects for index in range(DEVICES_PER_NODE)
    ], batch_size=1000)
    requests = MIXED_REQUESTS if mix == "mixed" else [{"gpus": 1.0, "gpu_memory": None, "workers": 1}]
    kind, spec = bench_job()
    Job.objects.bulk_create([
        Job(team=team_objects[i % teams], owner=user, kind=kind, name=f"bench-{i}",
            spec=spec, resources=dict(requests[i % len(requests)]),
            state=JobState.QUEUED, queued_at=now + timedelta(microseconds=i), created_at=now)
        for i in range(jobs)
    ], batch_size=1000)
    return {"capacity_gpus": float(nodes * DEVICES_PER_NODE)}


def measure_pass(jobs: int, nodes: int, mix: str = "mixed", profile: str | None = None) -> dict:
    """Populate, then time one ``schedule_pass(dispatch=False)``. Django must be set up and migrated."""
    from django.db import connection
    from django.db.models import Sum

    from strata.jobs.models import Allocation, Job, JobState
    from strata.scheduling.services import schedule_pass

    created = time.perf_counter()
    capacity = populate(jobs, nodes, mix)
    populate_seconds = time.perf_counter() - created
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    begin = time.perf_counter()
    result = schedule_pass(dispatch=False)
    seconds = time.perf_counter() - begin
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    placed_gpus = Allocation.objects.filter(active=True).aggregate(total=Sum("share"))["total"] or 0.0
    return {
        "database": connection.vendor, "jobs": jobs, "nodes": nodes, "devices": nodes * DEVICES_PER_NODE,
        "mix": mix, "seconds": seconds, "placed": result.placed, "waiting": result.waiting,
        "still_queued": Job.objects.filter(state=JobState.QUEUED).count(),
        "placed_gpus": round(placed_gpus, 6), **capacity, "populate_seconds": populate_seconds,
    }


def _pass_worker(argv: list[str]) -> int:
    """``python -m benchmarks.core.control_plane pass ...``: set Django up on this process's environment, migrate
    a fresh database, measure one pass and print the result as JSON on the last line."""
    parser = argparse.ArgumentParser(prog="benchmarks.core.control_plane pass")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--mix", choices=["mixed", "uniform"], default="mixed")
    parser.add_argument("--profile", help="write cProfile stats of the pass here")
    args = parser.parse_args(argv)
    # Never the user's ~/.strata: without an explicit STRATA_HOME, a throw-away one.
    os.environ.setdefault("STRATA_HOME", tempfile.mkdtemp(prefix="strata-bench-pass-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    print(json.dumps(measure_pass(args.jobs, args.nodes, args.mix, args.profile)), flush=True)
    return 0


def run_pass_subprocess(jobs: int, nodes: int, backend: str, mix: str = "mixed") -> dict:
    home = Path(tempfile.mkdtemp(prefix="strata-bench-pass-"))
    env = {**clean_env(), "STRATA_HOME": str(home)}
    database = None
    if backend == "postgresql":
        database = create_database()
        env["STRATA_DATABASE_URL"] = database_url(database)
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.core.control_plane", "pass", "--jobs", str(jobs), "--nodes", str(nodes),
             "--mix", mix], env=env, capture_output=True, text=True, timeout=900)
        if completed.returncode != 0:
            raise RuntimeError(f"the pass benchmark failed ({backend}):\n{completed.stderr[-3000:]}")
        return json.loads(completed.stdout.strip().splitlines()[-1])
    finally:
        if database:
            drop_database(database)


# --- the report ---------------------------------------------------------------------------------------------

def _ratio(target: float, measured: float) -> float:
    return target / measured if measured and measured == measured else float("nan")


def _table(rows: list[dict]) -> str:
    return benchkit.table([[row["measurement"], row["backend"], row["measured_text"], row["target_text"],
                            f"{row['ratio']:.3g}" if row["ratio"] == row["ratio"] else "n/a",
                            "-" if row["met"] is None else ("yes" if row["met"] else "NO")] for row in rows],
                          ["measurement", "backend", "measured", "target", "ratio target/measured", "met"])


def _figures(results: dict, quick: bool) -> list[benchkit.Figure]:
    """The common figures: each measurement against its target (the control plane has no peer to run here)."""
    figures = []
    for item in results["latency"]:
        figures.append(benchkit.Figure(
            f"latency_p50_{item['backend']}", f"submit -> RUNNING p50 ({item['backend']}), against the 100 ms target",
            item["p50_s"], LATENCY_P50_TARGET, "s", target=1.0, baseline_text="target 100 ms"))
    for item in results["scheduling_pass"]:
        figures.append(benchkit.Figure(
            f"pass_{item['database']}", f"one scheduling pass, {item['jobs']:,} jobs / {item['nodes']:,} nodes "
            f"({item['database']}), against the 1 s target", item["seconds"], PASS_TARGET, "s",
            target=None if quick else 1.0, baseline_text="target 1 s"))
    sandbox = results.get("sandbox") or {}
    if "start_added_s" in sandbox:
        off, on = sandbox["modes"]["none"], sandbox["modes"]["bwrap"]
        figures.append(benchkit.Figure(
            "sandbox_start", "an attempt's start (claim -> its code runs) in the sandbox, against no sandbox + 50 ms",
            on["start_p50_s"], off["start_p50_s"] + SANDBOX_START_TARGET, "s", target=1.0,
            baseline_text=f"no sandbox {off['start_p50_s'] * 1000:.0f} ms + 50 ms"))
        figures.append(benchkit.Figure(
            "sandbox_step", "step time of a job's code in the sandbox, against no sandbox (within noise: 5 %)",
            on["step_p50_ms"], off["step_p50_ms"], "ms", target=0.95, baseline_text="no sandbox"))
    if results.get("heartbeats"):  # simulated nodes heartbeating at the real interval (benchmarks.core.heartbeats)
        from benchmarks.core import heartbeats

        figures.extend(heartbeats.figures(results["heartbeats"], quick))
    return figures


def main(quick: bool = False, output: str | None = None) -> int:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    started = datetime.now(UTC)
    machine = {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
               "platform": platform.platform(), "python": platform.python_version()}
    _say(f"strata bench control-plane{' --quick' if quick else ''}: {started:%Y-%m-%d %H:%M} UTC, "
         f"{machine['cpus']} CPUs, {machine['platform']}, Python {machine['python']}")
    services_problem = services_available()
    if services_problem:
        _say(f"  note: PostgreSQL/Redis parts skipped: {services_problem}")
    results: dict = {"quick": quick, "date": started.isoformat(), "machine": machine, "sizes": sizes,
                     "latency": [], "scheduling_pass": [], "skipped": services_problem}

    _say(f"\n[1/2] submit -> RUNNING latency, {sizes['latency_jobs']} short jobs per backend")
    for backend in ("embedded", "postgres+redis"):
        if backend == "postgres+redis" and services_problem:
            continue
        results["latency"].append(measure_latency(backend, sizes["latency_jobs"], sizes["rate"],
                                                  sizes["virtual_gpus"]))
    # The same jobs with the control plane and the node on separate hosts (network namespaces on a bridge).
    from benchmarks.core import hosts, multihost

    cross_problem = services_problem or hosts.unavailable()
    if cross_problem:
        _say(f"  note: the cross-host measurement is skipped: {cross_problem}")
        results["cross_host_skipped"] = cross_problem
    else:
        _say("  two-hosts: control plane and node on separate hosts (PostgreSQL + Redis)")
        results["latency"].append(multihost.measure_cross_host_latency(sizes["latency_jobs"], sizes["rate"],
                                                                       sizes["virtual_gpus"]))

    _say(f"\n[sandbox] what the node's sandbox costs a job's own code: {sizes['sandbox_jobs']} starts and 80 steps, "
         "with it off and on")
    results["sandbox"] = measure_sandbox(sizes["sandbox_jobs"])

    _say(f"\n[2/2] one scheduling pass: {sizes['pass_jobs']:,} queued jobs, {sizes['pass_nodes']:,} nodes x "
         f"{DEVICES_PER_NODE} devices (mixed whole/fractional/2-GPU requests)")
    for backend in ("sqlite", "postgresql"):
        if backend == "postgresql" and services_problem:
            continue
        _say(f"  {backend}: creating rows and running the pass ...")
        outcome = run_pass_subprocess(sizes["pass_jobs"], sizes["pass_nodes"], backend)
        results["scheduling_pass"].append(outcome)
        _say(f"  {backend}: pass {outcome['seconds']:.3f} s, placed {outcome['placed']:,} jobs "
             f"({outcome['placed_gpus']:g} of {outcome['capacity_gpus']:g} GPUs), "
             f"{outcome['still_queued']:,} still queued (rows created in {outcome['populate_seconds']:.1f} s)")

    if not services_problem:
        from benchmarks.core import heartbeats

        _say("\n[heartbeats] simulated nodes heartbeating at the real interval while scheduling passes run")
        results["heartbeats"] = heartbeats.main(quick)

    rows = []
    for item in results["latency"]:
        rows.append({"measurement": "submit->RUNNING p50", "backend": item["backend"], "measured": item["p50_s"],
                     "measured_text": f"{item['p50_s'] * 1000:.1f} ms", "target_text": "<= 100 ms",
                     "ratio": _ratio(LATENCY_P50_TARGET, item["p50_s"]), "met": item["p50_s"] <= LATENCY_P50_TARGET})
        rows.append({"measurement": "submit->RUNNING p99", "backend": item["backend"], "measured": item["p99_s"],
                     "measured_text": f"{item['p99_s'] * 1000:.1f} ms", "target_text": "(none)",
                     "ratio": float("nan"), "met": None})
    for item in results["scheduling_pass"]:
        size = f"{item['jobs']:,} jobs / {item['nodes']:,} nodes"
        rows.append({"measurement": f"schedule_pass ({size})", "backend": item["database"],
                     "measured": item["seconds"], "measured_text": f"{item['seconds']:.3f} s "
                     f"({item['placed']:,} placed)", "target_text": "<= 1 s",
                     "ratio": _ratio(PASS_TARGET, item["seconds"]),
                     "met": item["seconds"] <= PASS_TARGET if not quick else None})
    sandbox = results.get("sandbox") or {}
    if "start_added_s" in sandbox:
        added = sandbox["start_added_s"]
        rows.append({"measurement": "sandbox: start added (p50)", "backend": "embedded", "measured": added,
                     "measured_text": f"{added * 1000:.0f} ms", "target_text": "<= 50 ms",
                     "ratio": _ratio(SANDBOX_START_TARGET, added) if added > 0 else float("inf"),
                     "met": added <= SANDBOX_START_TARGET})
        rows.append({"measurement": "sandbox: step time on/off (p50)", "backend": "embedded",
                     "measured": sandbox["step_ratio"], "measured_text": f"{sandbox['step_ratio']:.3f}x",
                     "target_text": "within noise (<= 1.05x)", "ratio": 1 / sandbox["step_ratio"],
                     "met": sandbox["step_ratio"] <= 1.05})
    results["table"] = [{k: v for k, v in row.items() if not k.endswith("_text")} for row in rows]
    _say("\nResults" + (" (quick: small sizes, targets are for the full run)" if quick else ""))
    _say(_table(rows))
    _say(f"latency: jobs submitted at a steady {sizes['rate']:g}/s (not in bursts), each 0.125 GPU on a node with "
         f"{sizes['virtual_gpus']} virtual GPUs and {2 * sizes['virtual_gpus']} slots: sized so no job queues behind "
         "capacity if each child exits promptly (on a CPU-starved machine the slots fill and dispatches wait for one); latency = job.started_at - job.created_at (both server clock).")
    if output:
        benchkit.write(benchkit.document("control-plane", quick, _figures(results, quick), details=results,
                                         machine=machine), output)
        _say(f"results written to {output}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "pass":
        sys.exit(_pass_worker(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "sandbox":  # the sandbox's part alone: ... sandbox [JOBS]
        print(json.dumps(measure_sandbox(int(sys.argv[2]) if len(sys.argv) > 2 else 5), indent=2))
        sys.exit(0)
    sys.exit(main(quick="--quick" in sys.argv[1:]))
