"""``strata bench control-plane``, heartbeat part: the API and the scheduler with many simulated nodes
heartbeating at the real interval.

A real stack (``strata up --virtual-gpus 0``: the hardened waitress server and the scheduler, no local node) on
a fresh PostgreSQL database and a fresh Redis key prefix. N simulated nodes register through the real API
(``POST /api/v1/node/register/`` with the stack's node token, DEVICES_PER_NODE virtual devices each) and then
beat every STRATA_HEARTBEAT_SECONDS (3 s; the lease is 15 s; neither is shortened) as ``NodeAgent.heartbeat``
does: with the lean protocol (the default), a lease renewal (``POST /api/v1/node/renew/``: node, session, no
attempts) each beat and a full heartbeat (``POST /api/v1/node/heartbeat/``: the samples of every beat since the
last one, one per device per beat with its time) every ``telemetry_seconds`` the control plane names (15 s); with
``--protocol full`` (the agent before the lean path) a full heartbeat with one sample per device each beat. Phases
spread evenly over the interval, each node on its own kept-alive HTTP/1.1 connection as a real agent's
``requests.Session`` is. The load generator is one asyncio process speaking HTTP/1.1 on raw streams (no aiohttp
or httpx in the environment); it runs on the same machine as the stack, so its own CPU is measured and reported.

For each size (nodes are added to the running set, so the earlier ones keep heartbeating): register the new
nodes, warm up, then a measured window: heartbeats answered 200 per second (sustained) against the target rate
(nodes / interval; a node whose answer is late skips slots, as an agent falls behind), latency p50/p99, errors,
leases lost (a gap between a node's successful heartbeats longer than the lease, a 409 from a reaped session, or
a node that is not UP with a valid lease in the database at the end of the window), the CPU of the server,
scheduler, PostgreSQL and the generator, and the scheduling pass time while the heartbeats run: a separate
process (``python -m benchmarks.core.heartbeats pass``) against the same database repeatedly creates
``jobs_per_node x nodes`` QUEUED jobs (the pass benchmark's mixed requests) inside a transaction, times
``schedule_pass(dispatch=False)`` over them and the registered nodes, and rolls the transaction back, so every
repetition sees the same queue and the stack's own scheduler never sees those jobs.
After the last size the heartbeats stop, the server settles, the nodes' leases are extended by an hour (so they
stay UP and nothing is reaped), and the same process times the same pass with no heartbeat load: the interference.

Django is set up only in the pass worker process; this module imports neither torch nor Django at import time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import benchkit
from benchmarks.benchkit import percentile
from benchmarks.core.http1 import Connection, HttpError

DEVICES_PER_NODE = 4
DEVICE_MEMORY = 16 * 2**30
REQUEST_TIMEOUT_S = 30.0
REGISTER_CONCURRENCY = 16
MET_FRACTION = 0.99  # sustained >= 99% of offered (and no lease lost) meets the heartbeat figure

FULL = {"sizes": [250, 500, 1000], "window_s": {250: 30.0, 500: 30.0, 1000: 60.0}, "warmup_s": 10.0,
        "jobs_per_node": 10, "max_pass_runs": 6, "quiet_pass_runs": 3}
QUICK = {"sizes": [100], "window_s": {100: 12.0}, "warmup_s": 4.0, "jobs_per_node": 10, "max_pass_runs": 3,
         "quiet_pass_runs": 2}


def _say(message: str) -> None:
    print(message, flush=True)


def _pct(values: list[float], q: float) -> float:
    value = percentile(values, q)
    return float("nan") if value is None else value


# --- the simulated nodes ------------------------------------------------------------------------------------

class SimNode:
    __slots__ = ("index", "name", "id", "session", "connection", "last_ok", "max_gap", "lost", "task", "pending",
                 "telemetry_at")

    def __init__(self, index: int, name: str, connection: Connection):
        self.index, self.name, self.connection = index, name, connection
        self.id = self.session = None
        self.pending: list[dict] = []  # samples waiting for the next full heartbeat
        self.telemetry_at = 0.0  # loop time of the last full heartbeat (0: the next beat is one)
        self.last_ok: float | None = None
        self.max_gap = 0.0
        self.lost = 0
        self.task: asyncio.Task | None = None


class LoadGenerator:
    """Registers simulated nodes and drives their heartbeats at a fixed interval, each on its own connection.
    Every heartbeat is recorded as (completion time, latency, status or 0 for a transport error)."""

    def __init__(self, host: str, port: int, token: str, run_id: str, protocol: str = "lean"):
        self.host, self.port, self.token, self.run_id = host, port, token, run_id
        self.protocol = protocol
        self.telemetry_seconds: float | None = None  # from the control plane's answer (lean protocol)
        self.full_beats: list[float] = []  # completion times of the full heartbeats answered 200
        self.nodes: list[SimNode] = []
        self.records: list[tuple[float, float, int]] = []
        self.sent: list[float] = []  # slot times of the heartbeats sent (offered load)
        self.skipped = 0  # slots skipped because the node was still waiting for an answer a whole interval late
        self.reregistered = 0
        self.register_retries = 0
        self.interval = 3.0
        self.lease = 15.0
        self.stopping = False
        self.error_samples: list[str] = []

    def _register_body(self, node: SimNode) -> bytes:
        return json.dumps({
            "name": node.name, "hostname": f"sim-{node.index}", "labels": {"bench": "heartbeats"},
            "devices": [{"index": i, "kind": "virtual", "name": f"virtual-{i}", "memory_total": DEVICE_MEMORY}
                        for i in range(DEVICES_PER_NODE)],
            "info": {"python": "sim", "pid": 0},
        }).encode()

    async def _register(self, node: SimNode, wait: float = 120.0) -> None:
        """As ``NodeAgent.register``: retried for up to ``wait`` seconds while the server cannot be reached
        (a connection closed or refused, 502/503/504)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                status, payload = await asyncio.wait_for(
                    node.connection.post("/api/v1/node/register/", self._register_body(node)), REQUEST_TIMEOUT_S)
            except (TimeoutError, ConnectionError, HttpError, OSError, ValueError, asyncio.IncompleteReadError) as error:
                node.connection.close()
                status, payload = 0, repr(error).encode()
            if status == 200:
                break
            if status not in (0, 502, 503, 504) or time.monotonic() > deadline:
                raise RuntimeError(f"register {node.name}: HTTP {status}: {payload[:300]!r}")
            self.register_retries += 1
            await asyncio.sleep(1.0)
        answer = json.loads(payload)
        node.id, node.session = answer["node"], answer["session"]
        node.telemetry_at, node.pending = 0.0, []
        self.interval = float(answer["heartbeat_seconds"])
        self.lease = float(answer["lease_seconds"])

    async def add(self, count: int) -> list[SimNode]:
        """Register ``count`` more nodes (REGISTER_CONCURRENCY at a time); each starts heartbeating as soon as it
        is registered (as an agent does), on a phase grid spread evenly over the interval."""
        start = len(self.nodes)
        new = [SimNode(start + i, f"hb-{self.run_id}-{start + i:05d}", Connection(self.host, self.port, self.token, resend_unsafe=True))
               for i in range(count)]
        self.nodes.extend(new)
        gate = asyncio.Semaphore(REGISTER_CONCURRENCY)
        loop = asyncio.get_running_loop()
        base = loop.time()

        async def one(i: int, node: SimNode) -> None:
            async with gate:
                await self._register(node)
            first = base + self.interval * i / count
            now = loop.time()
            if first < now:
                first += self.interval * (int((now - first) // self.interval) + 1)
            node.task = asyncio.create_task(self._drive(node, first))

        await asyncio.gather(*(one(i, node) for i, node in enumerate(new)))
        return new

    def _beat(self, node: SimNode, rng: random.Random, now: float) -> tuple[str, bytes, bool]:
        """``(path, body, full)`` of this beat, as ``NodeAgent.heartbeat`` sends it."""
        taken = round(time.time(), 3)
        samples = [{"index": i, "utilization": round(rng.uniform(0, 100), 1),
                    "memory_used": rng.randrange(0, DEVICE_MEMORY), "time": taken} for i in range(DEVICES_PER_NODE)]
        if self.protocol == "full":
            for sample in samples:
                del sample["time"]
            return "/api/v1/node/heartbeat/", json.dumps({"node": node.id, "session": node.session,
                                                          "samples": samples, "attempts": []}).encode(), True
        node.pending.extend(samples)
        if self.telemetry_seconds is None or not node.telemetry_at or now - node.telemetry_at >= self.telemetry_seconds:
            return "/api/v1/node/heartbeat/", json.dumps({"node": node.id, "session": node.session,
                                                          "samples": node.pending, "attempts": []}).encode(), True
        return "/api/v1/node/renew/", json.dumps({"node": node.id, "session": node.session,
                                                  "attempts": []}).encode(), False

    async def _drive(self, node: SimNode, first: float) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(node.index)
        slot = first
        node.last_ok = loop.time()
        while not self.stopping:
            delay = slot - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                if self.stopping:
                    break
            elif -delay >= self.interval:  # a whole interval late (a slow answer): skip the missed slots
                missed = int(-delay // self.interval)
                self.skipped += missed
                slot += missed * self.interval
            self.sent.append(slot)
            slot += self.interval
            begin = loop.time()
            path, body, full = self._beat(node, rng, begin)
            try:
                status, payload = await asyncio.wait_for(node.connection.post(path, body), REQUEST_TIMEOUT_S)
            except (TimeoutError, ConnectionError, HttpError, OSError, ValueError, asyncio.IncompleteReadError) as error:
                node.connection.close()
                status, payload = 0, repr(error).encode()
            end = loop.time()
            self.records.append((end, end - begin, status))
            if status == 200:
                if full:
                    self.full_beats.append(end)
                    node.pending, node.telemetry_at = [], begin
                    if self.protocol == "lean" and self.telemetry_seconds is None:
                        cadence = json.loads(payload).get("telemetry_seconds")
                        self.telemetry_seconds = float(cadence) if cadence else None
                if node.last_ok is not None:
                    gap = end - node.last_ok
                    node.max_gap = max(node.max_gap, gap)
                    if gap > self.lease:
                        node.lost += 1
                node.last_ok = end
                continue
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{node.name}: {status} {payload[:200]!r}")
            if status == 409:  # reaped (lease expired) or replaced: register again, as the agent does
                node.lost += 1
                try:
                    await self._register(node)
                    self.reregistered += 1
                except Exception as error:  # noqa: BLE001 - counted; the node tries again next slot
                    if len(self.error_samples) < 5:
                        self.error_samples.append(f"{node.name}: re-register failed: {error}")

    async def stop(self) -> None:
        self.stopping = True
        tasks = [node.task for node in self.nodes if node.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for node in self.nodes:
            node.connection.close()

    def window(self, begin: float, end: float) -> dict:
        """Statistics of the heartbeats completed within [begin, end) (loop time)."""
        seconds = end - begin
        inside = [(latency, status) for done, latency, status in self.records if begin <= done < end]
        ok = [latency for latency, status in inside if status == 200]
        errors: dict[str, int] = {}
        for _, status in inside:
            if status != 200:
                errors[str(status)] = errors.get(str(status), 0) + 1
        offered = sum(1 for slot in self.sent if begin <= slot < end)
        full = sum(1 for done in self.full_beats if begin <= done < end)
        return {"protocol": self.protocol, "telemetry_seconds": self.telemetry_seconds,
                "full_heartbeats_per_s": full / seconds, "seconds": seconds, "nodes": len(self.nodes), "interval_s": self.interval, "lease_s": self.lease,
                "target_per_s": len(self.nodes) / self.interval, "offered_per_s": offered / seconds,
                "sustained_per_s": len(ok) / seconds, "answered": len(ok), "errors": errors,
                "error_count": sum(errors.values()), "latency_p50_s": _pct(ok, 0.50),
                "latency_p99_s": _pct(ok, 0.99), "latency_max_s": max(ok) if ok else float("nan")}

    def lease_summary(self) -> dict:
        return {"nodes_lost_lease": sum(1 for node in self.nodes if node.lost), "lease_losses": sum(
            node.lost for node in self.nodes), "max_gap_s": max((node.max_gap for node in self.nodes), default=0.0),
            "reregistered": self.reregistered, "register_retries": self.register_retries,
            "skipped_slots": self.skipped,
            "connections_opened": sum(node.connection.connects for node in self.nodes)}


# --- CPU of the stack's processes ---------------------------------------------------------------------------

class CpuMeter:
    """CPU seconds (user + system) of the server and the scheduler (each with its children), the PostgreSQL
    backends of the bench database, every PostgreSQL process of the machine (other users' included), this
    process (the load generator), and the machine. Per process, so that processes that come and go between two
    snapshots never make a negative sum (one that exits in between loses its last seconds: a slight undercount)."""

    def __init__(self, stack_pid: int, database: str):
        import psutil

        self.psutil, self.database = psutil, database
        self.roles: dict[str, list] = {"server": [], "scheduler": []}
        for child in psutil.Process(stack_pid).children():
            command = " ".join(child.cmdline())
            for role in self.roles:
                if f"strata.cli.main {role}" in command or command.endswith(f" {role}") or f" {role} " in command:
                    self.roles[role].append(child)
        self.me = psutil.Process()

    def _tree(self, processes: list) -> dict:
        times = {}
        for process in processes:
            try:
                for item in [process, *process.children(recursive=True)]:
                    cpu = item.cpu_times()
                    times[item.pid] = cpu.user + cpu.system
            except self.psutil.Error:
                pass
        return times

    def _postgres(self) -> tuple[dict, dict]:
        everything, ours = {}, {}
        for process in self.psutil.process_iter(["name", "cmdline"]):
            try:
                if (process.info["name"] or "").startswith("postgres"):
                    cpu = process.cpu_times()
                    everything[process.pid] = cpu.user + cpu.system
                    if self.database in " ".join(process.info["cmdline"] or []):
                        ours[process.pid] = everything[process.pid]
            except self.psutil.Error:
                pass
        return everything, ours

    def snapshot(self) -> dict:
        me = self.me.cpu_times()
        machine = self.psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        everything, ours = self._postgres()
        return {"server": self._tree(self.roles["server"]), "scheduler": self._tree(self.roles["scheduler"]),
                "postgres_bench_db": ours, "postgres_all": everything, "generator": me.user + me.system,
                "machine_busy": busy, "wall": time.monotonic()}

    @staticmethod
    def usage(before: dict, after: dict) -> dict:
        """Cores used by each role between two snapshots (1.0 = one core fully busy)."""
        wall = after["wall"] - before["wall"]
        used = {}
        for key, value in after.items():
            if key == "wall":
                continue
            if isinstance(value, dict):
                delta = sum(seconds - before[key].get(pid, 0.0) for pid, seconds in value.items())
            else:
                delta = value - before[key]
            used[key] = max(0.0, delta) / wall
        return used


# --- the pass under load: a worker process against the stack's database -------------------------------------

def _pass_worker(argv: list[str]) -> int:
    """``python -m benchmarks.core.heartbeats pass``: wait until --start (epoch s), then repeat: inside a transaction
    create --jobs QUEUED jobs, time ``schedule_pass(dispatch=False)``, roll back; until --until or --max-runs
    (at least --min-runs). One JSON line per run, a summary last."""
    parser = argparse.ArgumentParser(prog="benchmarks.core.heartbeats pass")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--start", type=float, default=0.0)
    parser.add_argument("--until", type=float, default=0.0)
    parser.add_argument("--min-runs", type=int, default=3)
    parser.add_argument("--max-runs", type=int, default=6)
    args = parser.parse_args(argv)
    os.environ.setdefault("STRATA_HOME", tempfile.mkdtemp(prefix="strata-bench-hbpass-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone as dj_timezone

    from benchmarks.core.cp_shared import MIXED_REQUESTS, bench_job
    from strata.accounts import services as accounts
    from strata.cluster.models import Node
    from strata.jobs.models import Job, JobState
    from strata.scheduling.services import schedule_pass

    user = get_user_model().objects.create(username=f"hbpass-{secrets.token_hex(3)}")
    teams = [accounts.team_create(f"hbpass-{secrets.token_hex(3)}-{i}") for i in range(4)]
    kind, spec = bench_job()
    connection.close()
    while time.time() < args.start:
        time.sleep(min(0.2, args.start - time.time()))
    runs: list[dict] = []
    while len(runs) < args.max_runs and (len(runs) < args.min_runs or time.time() < args.until - (
            runs[-1]["total_s"] if runs else 0.0)):
        begin_total = time.perf_counter()
        with transaction.atomic():
            now = dj_timezone.now()
            created = time.perf_counter()
            Job.objects.bulk_create([
                Job(team=teams[i % len(teams)], owner=user, kind=kind, name=f"hbpass-{i}", spec=spec,
                    resources=dict(MIXED_REQUESTS[i % len(MIXED_REQUESTS)]), state=JobState.QUEUED,
                    queued_at=now + timedelta(microseconds=i), created_at=now)
                for i in range(args.jobs)], batch_size=1000)
            populate_s = time.perf_counter() - created
            nodes = Node.objects.filter(state=Node.State.UP, lease_expires_at__gt=dj_timezone.now()).count()
            begin, begin_cpu = time.perf_counter(), time.process_time()
            result = schedule_pass(dispatch=False)
            seconds, cpu_s = time.perf_counter() - begin, time.process_time() - begin_cpu
            transaction.set_rollback(True)
        run = {"seconds": seconds, "cpu_s": cpu_s, "placed": result.placed, "waiting": result.waiting, "nodes_up": nodes,
               "jobs": args.jobs, "populate_s": populate_s, "total_s": time.perf_counter() - begin_total,
               "ended": time.time()}
        runs.append(run)
        print(json.dumps(run), flush=True)
    values = [run["seconds"] for run in runs]
    cpu = [run["cpu_s"] for run in runs]
    print(json.dumps({"summary": True, "runs": values, "median": statistics.median(values),
                      "cpu_median_s": statistics.median(cpu),
                      "range": [min(values), max(values)], "placed": [run["placed"] for run in runs],
                      "nodes_up": [run["nodes_up"] for run in runs]}), flush=True)
    return 0


class PassWorker:
    """The pass worker as a subprocess (started ahead of its window so Django's start is not measured)."""

    def __init__(self, env: dict, jobs: int, start: float, until: float, min_runs: int, max_runs: int):
        self.log = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "benchmarks.core.heartbeats", "pass", "--jobs", str(jobs), "--start",
                   f"{start:.3f}", "--until", f"{until:.3f}", "--min-runs", str(min_runs), "--max-runs",
                   str(max_runs)]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        start_new_session=True)

    async def result(self, timeout: float = 600.0) -> dict:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("the pass worker did not finish in time")
            await asyncio.sleep(0.2)
        output = self.process.stdout.read()
        if self.process.returncode != 0:
            self.log.seek(0)
            raise RuntimeError(f"the pass worker failed ({self.process.returncode}):\n"
                               f"{self.log.read().decode(errors='replace')[-3000:]}")
        lines = [json.loads(line) for line in output.splitlines() if line.strip().startswith("{")]
        summary = lines[-1]
        summary["details"] = lines[:-1]
        return summary

    def kill(self) -> None:
        import signal

        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)


# --- the measurement ----------------------------------------------------------------------------------------

def _hold_leases(database_url: str, run_id: str, settle_s: float = 60.0) -> int:
    """Once the heartbeats stop: wait until the server has answered the heartbeats still queued in it (the newest
    ``last_heartbeat`` stops moving: a late one would set a 15 s lease again), then extend the nodes' leases by an
    hour (committed), so the pass without heartbeats sees the same UP nodes and the reaper has nothing to do."""
    import psycopg

    name = f"hb-{run_id}-%"
    with psycopg.connect(database_url, autocommit=True) as connection:
        deadline, last = time.monotonic() + settle_s, None
        while time.monotonic() < deadline:
            newest = connection.execute("SELECT max(last_heartbeat) FROM cluster_node WHERE name LIKE %s",
                                        [name]).fetchone()[0]
            if newest == last:
                break
            last = newest
            time.sleep(2.0)
        return connection.execute(
            "UPDATE cluster_node SET lease_expires_at = now() + interval '1 hour' WHERE name LIKE %s AND state = 'up'",
            [name]).rowcount


def _lease_check(database_url: str, run_id: str) -> dict:
    """Nodes of this run that are not UP with a valid lease in the database right now."""
    import psycopg

    with psycopg.connect(database_url) as connection:
        row = connection.execute(
            "SELECT count(*), count(*) FILTER (WHERE state <> 'up' OR lease_expires_at <= now()) "
            "FROM cluster_node WHERE name LIKE %s", [f"hb-{run_id}-%"]).fetchone()
    return {"registered": row[0], "not_up": row[1]}


async def _measure(stack, credentials: dict, env: dict, database_url: str, sizes: dict,
                   protocol: str = "lean") -> dict:
    run_id = secrets.token_hex(3)
    generator = LoadGenerator("127.0.0.1", stack.port, credentials["node_token"], run_id, protocol)
    meter = CpuMeter(stack.process.pid, database_url.rpartition('/')[2])
    loop = asyncio.get_running_loop()
    steps: list[dict] = []
    workers: list[PassWorker] = []
    try:
        for size in sizes["sizes"]:
            adding = size - len(generator.nodes)
            _say(f"  registering {adding:,} simulated nodes ({DEVICES_PER_NODE} virtual devices each) -> {size:,}")
            registered_at = time.monotonic()
            await generator.add(adding)
            register_s = time.monotonic() - registered_at
            window_s = sizes["window_s"][size]
            jobs = sizes["jobs_per_node"] * size
            start = time.time() + sizes["warmup_s"]
            min_runs = 3 if size == sizes["sizes"][-1] else 2
            worker = PassWorker(env, jobs, start, start + window_s, min_runs, sizes["max_pass_runs"])
            workers.append(worker)
            _say(f"  {size:,} nodes heartbeating every {generator.interval:g} s (offered "
                 f"{size / generator.interval:.0f}/s; registered in {register_s:.1f} s); warm-up "
                 f"{sizes['warmup_s']:g} s, then a {window_s:g} s window with {jobs:,}-job passes running")
            await asyncio.sleep(max(0.0, start - time.time()))
            before, begin = meter.snapshot(), loop.time()
            await asyncio.sleep(window_s)
            after, end = meter.snapshot(), loop.time()
            stats = generator.window(begin, end)
            cpu = CpuMeter.usage(before, after)
            database = _lease_check(database_url, run_id)
            _say(f"    sustained {stats['sustained_per_s']:.1f}/s of {stats['offered_per_s']:.1f}/s offered, "
                 f"p50 {stats['latency_p50_s'] * 1000:.1f} ms, p99 {stats['latency_p99_s'] * 1000:.1f} ms, "
                 f"{stats['error_count']} errors, {database['not_up']} nodes not UP; CPU cores: server "
                 f"{cpu['server']:.2f}, scheduler {cpu['scheduler']:.2f}, postgres {cpu['postgres_bench_db']:.2f} "
                 f"(all {cpu['postgres_all']:.2f}), "
                 f"generator {cpu['generator']:.2f}, machine {cpu['machine_busy']:.2f}")
            passes = await worker.result()
            _say(f"    pass ({jobs:,} jobs / {size:,} nodes) under heartbeats: median {passes['median']:.3f} s, "
                 f"range {passes['range'][0]:.3f}-{passes['range'][1]:.3f} s over {len(passes['runs'])} runs")
            per_100 = (cpu["server"] / (stats["sustained_per_s"] / 100.0)) if stats["sustained_per_s"] else None
            steps.append({"nodes": size, "register_s": register_s, "heartbeats": stats, "cpu_cores": cpu,
                          "load_average_1m": os.getloadavg()[0],
                          "server_cores_per_100_hb_s": per_100, "database": database,
                          "leases": generator.lease_summary(), "pass_under_heartbeats": passes})
        leases = generator.lease_summary()
    finally:
        await generator.stop()
        for worker in workers:
            worker.kill()
    size = sizes["sizes"][-1]
    jobs = sizes["jobs_per_node"] * size
    _say(f"  heartbeats stopped; the same pass ({jobs:,} jobs / {size:,} nodes) with no heartbeat load ...")
    held = _hold_leases(database_url, run_id)
    if held < size:
        _say(f"    note: only {held:,} of {size:,} nodes were still UP when the heartbeats stopped")
    before = meter.snapshot()
    worker = PassWorker(env, jobs, 0.0, 0.0, sizes["quiet_pass_runs"], sizes["quiet_pass_runs"])
    try:
        quiet = await worker.result()
    finally:
        worker.kill()
    quiet["cpu_cores"] = CpuMeter.usage(before, meter.snapshot())
    _say(f"    pass without heartbeats: median {quiet['median']:.3f} s, range {quiet['range'][0]:.3f}-"
         f"{quiet['range'][1]:.3f} s over {len(quiet['runs'])} runs (machine busy "
         f"{quiet['cpu_cores']['machine_busy']:.2f} cores: the pass worker, PostgreSQL and whatever else runs)")
    return {"run_id": run_id, "steps": steps, "leases": leases, "pass_quiet": quiet,
            "error_samples": generator.error_samples}


def measure(quick: bool = False, sizes: dict | None = None, server_workers: int = 1, protocol: str = "lean") -> dict:
    """Start a stack on PostgreSQL + Redis, run the heartbeat load at each size, return everything measured.
    ``server_workers``: the server's processes on its port (``strata server --workers``); ``protocol``: "lean"
    (renewals, a full heartbeat per telemetry cadence) or "full" (a full heartbeat every beat)."""
    from benchmarks.stack import (
        REDIS_URL,
        Stack,
        clean_env,
        clear_redis_prefix,
        create_database,
        database_url,
        drop_database,
        free_port,
    )

    sizes = sizes or (QUICK if quick else FULL)
    database = create_database()
    prefix = f"strata-bench-{secrets.token_hex(4)}:"
    home = Path(tempfile.mkdtemp(prefix="strata-bench-heartbeats-"))
    database_url = database_url(database)
    extra_env = {"STRATA_DATABASE_URL": database_url, "STRATA_BROKER_URL": REDIS_URL, "STRATA_BROKER_PREFIX": prefix,
                 "STRATA_SERVER_WORKERS": str(server_workers)}
    port = free_port()
    _say(f"  starting strata up --virtual-gpus 0 (server + scheduler, PostgreSQL + Redis) on port {port}, "
         f"state in {home}")
    stack = Stack(home, port, 0, extra_env)
    ok = False
    try:
        credentials = stack.wait_ready()
        env = {**clean_env(), **extra_env}
        try:
            import uvloop  # noqa: F401 - optional: a cheaper event loop for the generator

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        result = runner(_measure(stack, credentials, env, database_url, sizes, protocol))
        result["server_workers"] = server_workers
        result["protocol"] = protocol
        result["event_loop"] = "uvloop" if runner is not asyncio.run else "asyncio"
        ok = True
        return result
    finally:
        stack.stop()
        _say("  stack stopped")
        drop_database(database)
        clear_redis_prefix(prefix)
        if ok:
            shutil.rmtree(home, ignore_errors=True)
        else:
            _say(f"  logs kept in {home / 'logs'}")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def figures(result: dict | list[dict], quick: bool) -> list[benchkit.Figure]:
    """``heartbeats_per_s`` (higher is better, against the offered rate) and ``pass_under_heartbeats_s`` (lower
    is better, against the 1 s pass target) at the largest size. ``result`` may be several runs' results: each
    figure is then the median over the runs, with their range (never the best run)."""
    from benchmarks.core.cp_shared import PASS_TARGET

    results = result if isinstance(result, list) else [result]
    lasts = [item["steps"][-1] for item in results]
    beats = [last["heartbeats"] for last in lasts]
    lost = [last["leases"]["nodes_lost_lease"] + last["database"]["not_up"] for last in lasts]
    sustained = [item["sustained_per_s"] for item in beats]
    # met needs sustained >= 99% of offered and no lease lost: a run that lost a lease counts as 0/s.
    counted = [value if not missing else 0.0 for value, missing in zip(sustained, lost, strict=True)]
    offered = beats[0]["target_per_s"]
    p99 = _median([item["latency_p99_s"] for item in beats])
    # The server's CPU per lease renewal or heartbeat answered (ms): its cores over the answers per second.
    cpu_ms = [last["cpu_cores"]["server"] / item["sustained_per_s"] * 1000.0 if item["sustained_per_s"] else float("nan")
              for last, item in zip(lasts, beats, strict=True)]
    protocol = results[0].get("protocol", "full")
    errors = sum(item["error_count"] for item in beats)
    passes = [last["pass_under_heartbeats"]["median"] for last in lasts]
    quiet = [item["pass_quiet"]["median"] for item in results]
    nodes, jobs = lasts[0]["nodes"], lasts[0]["pass_under_heartbeats"]["details"][0]["jobs"]
    over = f" (median of {len(results)} runs)" if len(results) > 1 else ""
    workers = results[0].get("server_workers", 1)
    over = f", {workers} server process{'es' if workers > 1 else ''}{over}"
    return [
        benchkit.Figure(
            "heartbeats_per_s", f"heartbeats/s sustained with {nodes:,} nodes at the real {beats[0]['interval_s']:g} s "
            f"interval (PostgreSQL + Redis), against the offered rate{over}", _median(counted) or None, offered,
            "/s", lower_is_better=False, target=MET_FRACTION,
            mechanism_text=f"{_median(sustained):.1f}/s (p99 {p99 * 1000:.0f} ms, {errors} errors, "
                           f"{sum(lost)} leases lost, server CPU {_median(cpu_ms):.2f} ms each, {protocol} protocol)",
            baseline_text=f"target {offered:.1f}/s (nodes / interval)",
            extra={"runs": sustained, "range": [min(sustained), max(sustained)], "nodes_lost_lease": sum(lost),
                   "latency_p99_s": p99, "protocol": protocol, "server_cpu_ms_per_heartbeat": _median(cpu_ms),
                   "server_cpu_ms_per_heartbeat_runs": cpu_ms,
                   "full_heartbeats_per_s": _median([item.get("full_heartbeats_per_s", float("nan"))
                                                     for item in beats])}),
        benchkit.Figure(
            "pass_under_heartbeats_s", f"one scheduling pass, {jobs:,} jobs / {nodes:,} nodes, while {nodes:,} nodes "
            f"heartbeat, against the 1 s target{over}", _median(passes), PASS_TARGET, "s",
            target=None if quick else 1.0, baseline_text="target 1 s",
            mechanism_text=f"{_median(passes):.3f} s (without heartbeats {_median(quiet):.3f} s)",
            extra={"runs": passes, "range": [min(passes), max(passes)], "without_heartbeats": _median(quiet),
                   "without_heartbeats_runs": quiet,
                   "cpu_s": _median([last["pass_under_heartbeats"].get("cpu_median_s", float("nan")) for last in lasts]),
                   "without_heartbeats_cpu_s": _median([item["pass_quiet"].get("cpu_median_s", float("nan"))
                                                        for item in results])}),
    ]


def report(result: dict) -> str:
    rows = []
    for step in result["steps"]:
        beats, cpu = step["heartbeats"], step["cpu_cores"]
        rows.append([f"{step['nodes']:,}", f"{beats['offered_per_s']:.1f}", f"{beats['sustained_per_s']:.1f}",
                     f"{beats['latency_p50_s'] * 1000:.1f}", f"{beats['latency_p99_s'] * 1000:.1f}",
                     beats["error_count"], step["leases"]["nodes_lost_lease"] + step["database"]["not_up"],
                     f"{cpu['server']:.2f}", f"{cpu['postgres_bench_db']:.2f}", f"{cpu['generator']:.2f}",
                     f"{cpu['machine_busy']:.2f}",
                     "-" if step["server_cores_per_100_hb_s"] is None else f"{step['server_cores_per_100_hb_s']:.3f}",
                     f"{step['pass_under_heartbeats']['median']:.3f}"])
    table = benchkit.table(rows, ["nodes", "offered/s", "sustained/s", "p50 ms", "p99 ms", "errors", "lost",
                                  "server cores", "postgres cores", "generator cores", "machine cores",
                                  "server cores/100 hb/s", "pass s"])
    quiet = result["pass_quiet"]
    return table + f"\npass without heartbeats (largest size): median {quiet['median']:.3f} s, range " \
                   f"{quiet['range'][0]:.3f}-{quiet['range'][1]:.3f} s"


def main(quick: bool = False, server_workers: int = 1, protocol: str = "lean") -> dict:
    """What ``strata bench control-plane`` calls: measure, print the table, return the details."""
    result = measure(quick, server_workers=server_workers, protocol=protocol)
    _say(report(result))
    return result


def _standalone(argv: list[str]) -> int:
    """``python -m benchmarks.core.heartbeats [--quick] [--runs N] [--output F]``: this part alone, N times, the
    figures as medians over the runs in the common document (benchmark ``control-plane-heartbeats``)."""
    import platform

    from benchmarks.stack import services_available

    parser = argparse.ArgumentParser(prog="benchmarks.core.heartbeats")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--server-workers", type=int, default=1, help="strata server --workers for the stack")
    parser.add_argument("--protocol", choices=["lean", "full"], default="lean",
                        help="lean: the agent's renewals and a full heartbeat per telemetry cadence (default); "
                             "full: a full heartbeat every beat (the agent before the lean node path)")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    # Stopped with SIGTERM (or SIGINT, which a background shell job ignores): unwind, so the stack, the pass
    # worker, the database and the Redis keys are cleaned up.
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    problem = services_available()
    if problem:
        _say(f"needs PostgreSQL and Redis: {problem}")
        return 2
    machine = {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
               "platform": platform.platform(), "python": platform.python_version()}
    results = []
    for run in range(args.runs):
        _say(f"[heartbeats] run {run + 1}/{args.runs}")
        results.append(main(args.quick, server_workers=args.server_workers, protocol=args.protocol))
    made = figures(results, args.quick)
    doc = benchkit.document("control-plane-heartbeats", args.quick, made, details={"runs": results},
                            machine=machine)
    _say(benchkit.figures_table(doc))
    if args.output:
        benchkit.write(doc, args.output)
        _say(f"results written to {args.output}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "pass":
        sys.exit(_pass_worker(sys.argv[2:]))
    sys.exit(_standalone(sys.argv[1:]))
