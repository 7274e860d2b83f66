"""The soak test: a real control plane under a steady mix of API calls for minutes, watched for errors and leaks.

A real platform on 127.0.0.1 only, each part its own process as an operator runs it: ``strata server`` (the
hardened waitress server), ``strata scheduler`` and one ``strata node`` agent with virtual GPUs that really runs
the jobs (the cheapest real job there is: the first registered kind that runs a bare function,
:func:`benchmarks.core.cp_shared.bench_job`, on a no-op, so each job is one short child process). It runs on
PostgreSQL + Redis when ``STRATA_DATABASE_URL`` / ``STRATA_BROKER_URL`` name them (a fresh database on that
server and a fresh Redis key prefix, both removed at the end), else on SQLite and the embedded broker in a
temporary home. Users, teams and tokens are made by a set-up process (``python -m benchmarks.core.soak setup``, the
only place Django runs): two teams, two users each, one token per user.

The load generator is one asyncio process speaking HTTP/1.1 with keep-alive on raw streams (no aiohttp, httpx or
locust in the environment; nothing is fetched at run time). Requests arrive open-loop (Poisson, ``--rate`` per
second) and are sent on the users' kept-alive connections (``CONNECTIONS_PER_USER`` each; an arrival waits for a
free one). The mix (:data:`MIX`): submits (``POST /api/v1/jobs/``, a third with an ``Idempotency-Key``, a few of
those replayed and expected to answer 200 with the same job), job detail, the paginated job list, events, logs, the
team's quota usage, the node list, cancels, and reads of the other team's jobs (which must be 404).

Every answer is classified: ``ok``; ``expected`` (a 4xx the call may give: 429 throttling, the other team's 404,
counted apart); ``unexpected`` (any other 4xx, or a 2xx where a 404 was due: a bug, reported); ``error`` (any
5xx, a connection error or a timeout of REQUEST_TIMEOUT_S). Latency is from sending the request on a free
connection (opening it first when needed) to reading the answer's last byte. The server's RSS (its process tree, psutil) and the database connections (PostgreSQL:
``pg_stat_activity`` for the soak's database, the watcher's own excluded; SQLite: the server's open descriptors of
the database file) are sampled every ``--sample`` seconds. "Flat" (:func:`flatness`) compares the second half of
the samples after the warm-up with the first half: RSS mean and max may grow by at most RSS_TOLERANCE_FRACTION +
RSS_TOLERANCE_BYTES; the connections' median may grow by at most CONNECTION_TOLERANCE and their maximum stay
within the first half's + CONNECTION_TOLERANCE or the server's threads (one connection each) + the same.

After the load the generator waits (``--drain`` seconds at most) for every acknowledged job to end, then lists each
team's jobs through the paginated API: every acknowledged submit must be there.

    python -m benchmarks.core.soak --duration 300 --rate 10 --output soak.json

prints a progress line every 10 s and a summary, and writes the common results document
(:mod:`benchmarks.benchkit`). This module imports neither torch nor Django at import time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from benchmarks import benchkit
from benchmarks.benchkit import percentile
from benchmarks.core.http1 import Connection, HttpError
from benchmarks.stack import clean_env, free_port

REQUEST_TIMEOUT_S = 30.0
CONNECTIONS_PER_USER = 4
IDLE_REOPEN_S = 20.0  # the server closes a connection idle for STRATA_SERVER_IDLE_TIMEOUT (30 s): reopen before
PROGRESS_S = 10.0
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
P99_TARGET_S = 0.300  # the reliability bar: p99 < 300 ms, 0 5xx, flat RSS and DB connections
RSS_TOLERANCE_FRACTION = 0.10
RSS_TOLERANCE_BYTES = 20 * 2**20
CONNECTION_TOLERANCE = 2
TEAMS = ("soak-a", "soak-b")
USERS_PER_TEAM = 2
# Operation: weight (the share of arrivals), and the 4xx codes it may answer besides 2xx.
MIX: dict[str, tuple[int, set[int]]] = {
    "submit": (12, {429}),
    "detail": (18, {429}),
    "list": (14, {429}),
    "events": (10, {429}),
    "logs": (10, {429}),
    "quota_usage": (8, {429}),
    "nodes": (8, {429}),
    "cancel": (5, {429}),
    "foreign_detail": (3, {404, 429}),
}
LIST_PAGE_SIZE = 20
NODE_GPUS = 2
NODE_SLOTS = 4
JOB_GPUS = 0.5  # NODE_GPUS / JOB_GPUS = 4 jobs at once, one per slot


def _say(message: str) -> None:
    print(message, flush=True)


def _pct(values: list[float], q: float) -> float | None:
    return percentile(values, q)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f} ms"


# --- the platform: set-up, server, scheduler, node ---------------------------------------------------------

def _setup_worker(argv: list[str]) -> int:
    """``python -m benchmarks.core.soak setup``: migrate, then make the soak's teams, users and tokens and a node
    token; print them as one JSON line."""
    del argv
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
    from strata.cli.server_commands import migrate

    migrate()
    from strata.accounts import services
    from strata.accounts.models import ApiToken

    admin = services.user_create("soak-admin", secrets.token_urlsafe(12), admin=True)
    users = []
    for team_slug in TEAMS:
        team = services.team_create(team_slug)
        for index in range(USERS_PER_TEAM):
            name = f"{team_slug}-user{index}"
            user = services.user_create(name, secrets.token_urlsafe(12))
            services.membership_set(user, team)
            _, raw = services.token_create(user, team=team, name="soak", ttl_days=1)
            users.append({"user": name, "team": team_slug, "token": raw})
    _, node_token = services.token_create(admin, kind=ApiToken.Kind.NODE, name="soak node", ttl_days=1)
    print(json.dumps({"users": users, "node_token": node_token}), flush=True)
    return 0


def _strata() -> list[str]:
    return [sys.executable, "-m", "strata.cli.main"]


@dataclass
class Backend:
    """Where the platform keeps its state: ``postgres+redis`` (a fresh database and key prefix) or
    ``sqlite+embedded`` (a temporary home)."""

    name: str
    env: dict
    database: str | None = None  # PostgreSQL database name
    admin_url: str | None = None  # where the database was created from (to drop it)
    redis_url: str | None = None
    prefix: str | None = None

    @property
    def database_url(self) -> str | None:
        return self.env.get("STRATA_DATABASE_URL")

    @classmethod
    def create(cls, database_url: str | None, broker_url: str | None) -> Backend:
        if not database_url or not database_url.startswith("postgres"):
            return cls("sqlite+embedded", {})
        import psycopg

        name = f"strata_soak_{secrets.token_hex(4)}"
        admin = _libpq_url(database_url)
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(database_url)
        env = {"STRATA_DATABASE_URL": urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))}
        backend = cls("postgres", env, database=name, admin_url=admin)
        if broker_url:
            backend.name, backend.redis_url = "postgres+redis", broker_url
            backend.prefix = f"strata-soak-{secrets.token_hex(4)}:"
            env.update({"STRATA_BROKER_URL": broker_url, "STRATA_BROKER_PREFIX": backend.prefix})
        return backend

    def remove(self) -> None:
        if self.database:
            import psycopg

            try:
                with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as connection:
                    connection.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            except Exception as error:  # noqa: BLE001 - cleanup must not hide the results
                _say(f"  warning: could not drop database {self.database}: {error}")
        if self.prefix:
            try:
                import redis

                client = redis.Redis.from_url(self.redis_url)
                keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
                for start in range(0, len(keys), 500):
                    client.delete(*keys[start:start + 500])
            except Exception as error:  # noqa: BLE001
                _say(f"  warning: could not clear Redis keys {self.prefix}*: {error}")


def _libpq_url(url: str) -> str:
    """psycopg takes postgresql:// (and postgres://) URLs; drop Django-only schemes such as postgis."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))


class Platform:
    """``strata server``, ``strata scheduler`` and one ``strata node``, each in its own process group;
    ``stop()`` kills every group."""

    def __init__(self, home: Path, backend: Backend):
        self.home, self.backend = home, backend
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**clean_env(), **backend.env, "STRATA_HOME": str(home), "STRATA_PUBLIC_URL": self.url}
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.credentials: dict = {}

    def _start(self, name: str, command: list[str], extra: dict | None = None) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(command, env={**self.env, **(extra or {})}, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.processes[name] = process
        return process

    def start(self, timeout: float = 180.0) -> dict:
        completed = subprocess.run([sys.executable, "-m", "benchmarks.core.soak", "setup"], env=self.env,
                                   capture_output=True, text=True, timeout=timeout)
        if completed.returncode != 0:
            raise RuntimeError(f"the soak set-up failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
        self.credentials = json.loads(completed.stdout.strip().splitlines()[-1])
        self._start("server", [*_strata(), "server", "--host", "127.0.0.1", "--port", str(self.port)])
        self._start("scheduler", [*_strata(), "scheduler"])
        # The agent retries its registration until the server answers, as it does after a restart.
        self._start("node", [*_strata(), "node", "--server", self.url, "--name", "soak-node", "--virtual-gpus",
                             str(NODE_GPUS), "--slots", str(NODE_SLOTS), "--state-dir", str(self.home / "node")],
                    {"STRATA_NODE_TOKEN": self.credentials["node_token"]})
        self._wait_healthy(timeout)
        return self.credentials

    def _wait_healthy(self, timeout: float) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the server did not answer within {timeout:g} s; see {self.logs}")

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"strata {name} exited with {process.returncode}; see "
                                   f"{self.logs / (name + '.log')}:\n{self.tail(name)}")

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every group, SIGKILL what is left after ``grace`` seconds (nothing here checks a graceful
        stop)."""
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes.values():  # whatever is left in each group (workers, attempt children)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


# --- the watcher: server RSS and database connections ------------------------------------------------------

class Watcher:
    """Samples the server's RSS (its process and children), the scheduler's and the node's (for the record) and
    the database connections. Blocking calls; the soak runs them in a thread."""

    def __init__(self, platform: Platform):
        import psutil

        self.psutil = psutil
        self.platform = platform
        self.samples: list[dict] = []
        self.pg = None
        self.sqlite_path = os.path.realpath(platform.home / "strata.sqlite3")
        if platform.backend.database:
            import psycopg

            self.pg = psycopg.connect(_libpq_url(platform.backend.database_url), autocommit=True, connect_timeout=10)

    def _tree(self, name: str) -> list:
        process = self.platform.processes.get(name)
        if process is None:
            return []
        try:
            root = self.psutil.Process(process.pid)
            return [root, *root.children(recursive=True)]
        except self.psutil.Error:
            return []

    def _rss(self, name: str) -> int:
        total = 0
        for process in self._tree(name):
            try:
                total += process.memory_info().rss
            except self.psutil.Error:
                pass
        return total

    def _server_database_connections(self) -> int:
        """The server's own: TCP connections to the PostgreSQL port, or descriptors of the SQLite file."""
        count = 0
        for process in self._tree("server"):
            try:
                if self.pg is not None:
                    port = self.pg.info.port
                    count += sum(1 for item in process.net_connections(kind="tcp")
                                 if item.raddr and item.raddr.port == port and item.status == "ESTABLISHED")
                else:
                    count += sum(1 for item in process.open_files() if item.path == self.sqlite_path)
            except self.psutil.Error:
                pass
        return count

    def _database_connections(self) -> int:
        """Every connection to the soak's database (server and scheduler), the watcher's own excluded; on SQLite
        the descriptors of the database file held by the server and the scheduler."""
        if self.pg is not None:
            return self.pg.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                                   "pg_backend_pid()", [self.platform.backend.database]).fetchone()[0]
        count = 0
        for name in ("server", "scheduler"):
            for process in self._tree(name):
                try:
                    count += sum(1 for item in process.open_files() if item.path == self.sqlite_path)
                except self.psutil.Error:
                    pass
        return count

    def sample(self, elapsed: float) -> dict:
        row = {"t": elapsed, "server_rss": self._rss("server"), "scheduler_rss": self._rss("scheduler"),
               "node_rss": self._rss("node"), "db_connections": self._database_connections(),
               "server_db_connections": self._server_database_connections(),
               "server_threads": sum(_threads(process) for process in self._tree("server")),
               "load_1m": os.getloadavg()[0]}
        self.samples.append(row)
        return row

    def close(self) -> None:
        if self.pg is not None:
            self.pg.close()


def _threads(process) -> int:
    try:
        return process.num_threads()
    except Exception:  # noqa: BLE001 - a process that just exited
        return 0


def flatness(samples: list[dict], warmup_s: float) -> dict:
    """Split the samples after ``warmup_s`` into two halves by time and compare them.

    RSS is flat when the second half's mean and max are each at most the first half's × (1 +
    RSS_TOLERANCE_FRACTION) + RSS_TOLERANCE_BYTES.

    Connections (all of the database's, and the server's own) are flat when (a) the second half's median is at
    most the first half's + CONNECTION_TOLERANCE: a connection never given back raises the floor, whatever the
    bursts do; and (b) the second half's max is at most the first half's max + CONNECTION_TOLERANCE, or within
    the server's thread count + CONNECTION_TOLERANCE: each request thread holds at most one connection (on
    PostgreSQL for CONN_MAX_AGE, so the pool fills towards its threads; on SQLite only while it serves a
    request, so a sample counts the requests in flight), and more than that means connections outlive the
    requests that opened them."""
    kept = [row for row in samples if row["t"] >= warmup_s]
    if len(kept) < 4:
        return {"judged": False, "reason": f"only {len(kept)} samples after the warm-up", "flat": None}
    middle = (kept[0]["t"] + kept[-1]["t"]) / 2
    first = [row for row in kept if row["t"] <= middle]
    second = [row for row in kept if row["t"] > middle]

    def stats(rows: list[dict], key: str) -> dict:
        values = [row[key] for row in rows]
        return {"mean": sum(values) / len(values), "median": percentile(values, 0.5), "max": max(values),
                "min": min(values)}

    threads = max((row.get("server_threads", 0) for row in samples), default=0)
    result: dict = {"judged": True, "warmup_s": warmup_s, "samples": [len(first), len(second)],
                    "server_threads": threads,
                    "tolerance": {"rss_fraction": RSS_TOLERANCE_FRACTION, "rss_bytes": RSS_TOLERANCE_BYTES,
                                  "connections": CONNECTION_TOLERANCE}}
    rss1, rss2 = stats(first, "server_rss"), stats(second, "server_rss")
    limit_mean = rss1["mean"] * (1 + RSS_TOLERANCE_FRACTION) + RSS_TOLERANCE_BYTES
    limit_max = rss1["max"] * (1 + RSS_TOLERANCE_FRACTION) + RSS_TOLERANCE_BYTES
    result["rss"] = {"first": rss1, "second": rss2, "limit_mean": limit_mean, "limit_max": limit_max,
                     "flat": rss2["mean"] <= limit_mean and rss2["max"] <= limit_max}
    for key in ("db_connections", "server_db_connections"):
        one, two = stats(first, key), stats(second, key)
        limit_median = one["median"] + CONNECTION_TOLERANCE
        limit_max = max(one["max"], threads) + CONNECTION_TOLERANCE
        result[key] = {"first": one, "second": two, "limit_median": limit_median, "limit_max": limit_max,
                       "flat": two["median"] <= limit_median and two["max"] <= limit_max}
    result["flat"] = result["rss"]["flat"] and result["db_connections"]["flat"] and \
        result["server_db_connections"]["flat"]
    return result


# --- the load ----------------------------------------------------------------------------------------------

@dataclass
class User:
    name: str
    team: str
    token: str
    pool: asyncio.Queue = field(default_factory=asyncio.Queue)


@dataclass
class Record:
    done: float  # loop time the answer was read
    op: str
    latency: float
    status: int  # 0: connection error, -1: timeout
    outcome: str  # ok | expected | unexpected | error


class Soak:
    def __init__(self, platform: Platform, rate: float, duration: float, seed: int = 0):
        from benchmarks.core.cp_shared import NOOP, bench_job

        self.platform, self.rate, self.duration = platform, rate, duration
        self.rng = random.Random(seed)
        self.kind, self.spec = bench_job()
        self.entrypoint = NOOP
        self.users = [User(item["user"], item["team"], item["token"]) for item in platform.credentials["users"]]
        self.connections: list[Connection] = []
        for user in self.users:
            for _ in range(CONNECTIONS_PER_USER):
                connection = Connection("127.0.0.1", platform.port, user.token, agent="strata-soak", idle_reopen_s=IDLE_REOPEN_S)
                self.connections.append(connection)
                user.pool.put_nowait(connection)
        self.records: list[Record] = []
        self.jobs: dict[str, list[str]] = {team: [] for team in TEAMS}  # acknowledged job ids, in order
        # Each user's own, in order: a member cancels only those (a teammate's job takes the team-admin role).
        self.own: dict[str, list[str]] = {}
        self.acked: dict[str, str] = {}  # job id -> team
        self.keys: list[tuple[str, str, bytes, str]] = []  # (user, key, body, job id) of keyed submits
        self.replays = {"sent": 0, "same_job": 0, "other_job": 0}
        self.samples_unexpected: list[str] = []
        self.samples_error: list[str] = []
        self.submitted = 0
        self.lag_max = 0.0
        self.tasks: set[asyncio.Task] = set()
        self.ops = list(MIX)
        self.weights = [MIX[op][0] for op in self.ops]

    # -- one call ---------------------------------------------------------------------------------------
    async def call(self, user: User, op: str, method: str, path: str, body: bytes | None = None,
                   headers: dict | None = None, expect: set[int] | None = None) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        connection = await user.pool.get()
        begin = loop.time()
        try:
            status, payload = await asyncio.wait_for(connection.request(method, path, body, headers),
                                                     REQUEST_TIMEOUT_S)
        except TimeoutError:
            connection.close()
            status, payload = -1, b"timeout"
        except (ConnectionError, HttpError, OSError, ValueError, asyncio.IncompleteReadError) as error:
            connection.close()
            status, payload = 0, repr(error).encode()
        finally:
            user.pool.put_nowait(connection)
        end = loop.time()
        allowed = MIX[op][1] if expect is None else expect
        if status <= 0 or status >= 500:
            outcome = "error"
        elif 200 <= status < 300:
            outcome = "unexpected" if op == "foreign_detail" else "ok"
        elif status in allowed:
            outcome = "expected"
        else:
            outcome = "unexpected"
        self.records.append(Record(end, op, end - begin, status, outcome))
        if outcome in ("unexpected", "error"):
            samples = self.samples_error if outcome == "error" else self.samples_unexpected
            if len(samples) < 10:
                samples.append(f"{op} {method} {path}: {status} {payload[:300]!r}")
        return status, payload

    # -- the operations ---------------------------------------------------------------------------------
    def _job_of(self, team: str, recent: int = 50) -> str | None:
        jobs = self.jobs[team]
        if not jobs:
            return None
        return self.rng.choice(jobs[-recent:]) if self.rng.random() < 0.8 else self.rng.choice(jobs)

    def _submit_body(self, number: int) -> bytes:
        return json.dumps({"name": f"soak-{number}", "kind": self.kind, "spec": self.spec, "max_attempts": 1,
                           "time_limit": 300, "resources": {"gpus": JOB_GPUS}}).encode()

    async def op_submit(self, user: User) -> None:
        headers = None
        replay = None
        # A client retrying one of its keyed submits (a key is its user's): the same job, 200.
        own_keys = [item for item in self.keys if item[0] == user.name]
        if own_keys and self.rng.random() < 0.1:
            replay = self.rng.choice(own_keys[-20:])
            _, key, body, _ = replay
            headers = {"Idempotency-Key": key}
        else:
            self.submitted += 1
            body = self._submit_body(self.submitted)
            if self.rng.random() < 1 / 3:
                key = f"soak-{uuid.uuid4()}"
                headers = {"Idempotency-Key": key}
        status, payload = await self.call(user, "submit", "POST", "/api/v1/jobs/", body, headers)
        if status not in (200, 201):
            return
        job = json.loads(payload)["id"]
        if job not in self.acked:
            self.acked[job] = user.team
            self.jobs[user.team].append(job)
            self.own.setdefault(user.name, []).append(job)
        if replay is not None:
            self.replays["sent"] += 1
            same = job == replay[3] and status == 200
            self.replays["same_job" if same else "other_job"] += 1
            if not same and len(self.samples_unexpected) < 10:
                self.samples_unexpected.append(f"replayed key {replay[1]}: {status}, job {job}, first {replay[3]}")
            return
        if headers:
            self.keys.append((user.name, headers["Idempotency-Key"], body, job))

    async def op_detail(self, user: User, op: str = "detail", suffix: str = "") -> None:
        job = self._job_of(user.team)
        if job is None:
            return await self.op_list(user)
        await self.call(user, op, "GET", f"/api/v1/jobs/{job}/{suffix}")

    async def op_list(self, user: User) -> None:
        pages = max(1, (len(self.jobs[user.team]) + LIST_PAGE_SIZE - 1) // LIST_PAGE_SIZE)
        page = 1 if self.rng.random() < 0.6 else self.rng.randint(1, min(pages, 10))
        state = "&state=RUNNING,QUEUED" if self.rng.random() < 0.2 else ""
        if state:
            page = 1
        await self.call(user, "list", "GET", f"/api/v1/jobs/?page={page}&page_size={LIST_PAGE_SIZE}{state}",
                        expect={404, 429} if state else None)

    async def op_quota_usage(self, user: User) -> None:
        await self.call(user, "quota_usage", "GET", f"/api/v1/quotas/{user.team}/usage/")

    async def op_nodes(self, user: User) -> None:
        await self.call(user, "nodes", "GET", "/api/v1/nodes/")

    async def op_cancel(self, user: User) -> None:
        own = self.own.get(user.name, [])[-10:]
        job = self.rng.choice(own) if own else None
        if job is None:
            return await self.op_list(user)
        await self.call(user, "cancel", "POST", f"/api/v1/jobs/{job}/cancel/", b"{}")

    async def op_foreign_detail(self, user: User) -> None:
        other = next(team for team in TEAMS if team != user.team)
        job = self._job_of(other)
        if job is None:
            return await self.op_nodes(user)
        await self.call(user, "foreign_detail", "GET", f"/api/v1/jobs/{job}/")

    async def one(self, op: str, user: User) -> None:
        if op in ("detail", "events", "logs"):
            await self.op_detail(user, op, "" if op == "detail" else f"{op}/")
        else:
            await getattr(self, f"op_{op}")(user)

    # -- the run ----------------------------------------------------------------------------------------
    async def run(self, watcher: Watcher, sample_s: float, progress=_say) -> dict:
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + self.duration
        next_sample, next_progress, last_progress = start, start + PROGRESS_S, start
        arrival = start
        sampler: asyncio.Task | None = None
        while True:
            now = loop.time()
            if now >= end:
                break
            if arrival <= now:
                self.lag_max = max(self.lag_max, now - arrival)
                op = self.rng.choices(self.ops, self.weights)[0]
                task = asyncio.create_task(self.one(op, self.rng.choice(self.users)))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                arrival += self.rng.expovariate(self.rate)
                continue
            if now >= next_sample and (sampler is None or sampler.done()):
                sampler = asyncio.create_task(asyncio.to_thread(watcher.sample, now - start))
                next_sample += sample_s
            if now >= next_progress:
                self.platform.check_alive()
                progress(self.progress_line(start, last_progress, now, watcher))
                last_progress, next_progress = now, next_progress + PROGRESS_S
            await asyncio.sleep(max(0.0, min(arrival, next_sample, next_progress, end) - loop.time()))
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=REQUEST_TIMEOUT_S + 5)
        if sampler is not None:
            await sampler
        await asyncio.to_thread(watcher.sample, loop.time() - start)
        return {"start": start, "end": loop.time()}

    def progress_line(self, start: float, since: float, now: float, watcher: Watcher) -> str:
        recent = [record for record in self.records if record.done >= since]
        latencies = [record.latency for record in recent]
        errors = sum(1 for record in self.records if record.outcome == "error")
        unexpected = sum(1 for record in self.records if record.outcome == "unexpected")
        sample = watcher.samples[-1] if watcher.samples else {}
        rss = sample.get("server_rss", 0) / 2**20
        return (f"  [{now - start:5.0f} s] {len(recent) / max(now - since, 1e-9):5.1f} req/s, p50 "
                f"{_ms(_pct(latencies, 0.5))}, p99 {_ms(_pct(latencies, 0.99))}; total {len(self.records):,} "
                f"requests, {errors} errors, {unexpected} unexpected; {len(self.acked):,} jobs acknowledged; "
                f"server RSS {rss:.1f} MiB, DB connections {sample.get('db_connections', '?')} "
                f"(server {sample.get('server_db_connections', '?')}); load {os.getloadavg()[0]:.2f}")

    def close(self) -> None:
        for connection in self.connections:
            connection.close()

    # -- after the load ---------------------------------------------------------------------------------
    async def list_team(self, user: User) -> dict[str, str]:
        """Every job of the user's team through the paginated list: ``{id: state}``."""
        found: dict[str, str] = {}
        page = 1
        while True:
            status, payload = await self.call(user, "final_list", "GET",
                                              f"/api/v1/jobs/?page={page}&page_size=500", expect={429})
            if status == 429:
                await asyncio.sleep(1.0)
                continue
            if status != 200:
                raise RuntimeError(f"listing {user.team}'s jobs, page {page}: {status} {payload[:300]!r}")
            answer = json.loads(payload)
            for job in answer["results"]:
                found[job["id"]] = job["state"]
            if not answer.get("next"):
                return found
            page += 1

    async def settle(self, drain_s: float, progress=_say) -> dict:
        """Wait up to ``drain_s`` for every acknowledged job to end; then list each team's jobs."""
        owners = {team: next(user for user in self.users if user.team == team) for team in TEAMS}
        deadline = time.monotonic() + drain_s
        while True:
            listed: dict[str, str] = {}
            for user in owners.values():
                listed.update(await self.list_team(user))
            open_jobs = [job for job in self.acked if listed.get(job) not in TERMINAL]
            if not open_jobs or time.monotonic() > deadline:
                break
            progress(f"  waiting for {len(open_jobs):,} acknowledged jobs to end ...")
            await asyncio.sleep(5.0)
        states: dict[str, int] = {}
        for job in self.acked:
            state = listed.get(job, "MISSING")
            states[state] = states.get(state, 0) + 1
        wrong_team = [job for job, team in self.acked.items()
                      if job in listed and job not in self.jobs[team]]
        missing = [job for job in self.acked if job not in listed]
        return {"acknowledged": len(self.acked), "listed": len(self.acked) - len(missing), "missing": missing[:20],
                "missing_count": len(missing), "states": states, "wrong_team": len(wrong_team),
                "finished": sum(count for state, count in states.items() if state in TERMINAL),
                "not_finished": [job for job in self.acked if listed.get(job) not in TERMINAL][:20]}

    def statistics(self, begin: float, end: float) -> dict:
        inside = [record for record in self.records if begin <= record.done <= end + REQUEST_TIMEOUT_S + 5
                  and record.op != "final_list"]
        seconds = end - begin

        def block(records: list[Record]) -> dict:
            latencies = [record.latency for record in records]
            statuses: dict[str, int] = {}
            outcomes = {"ok": 0, "expected": 0, "unexpected": 0, "error": 0}
            for record in records:
                statuses[str(record.status)] = statuses.get(str(record.status), 0) + 1
                outcomes[record.outcome] += 1
            return {"requests": len(records), "p50_s": _pct(latencies, 0.5), "p90_s": _pct(latencies, 0.9),
                    "p99_s": _pct(latencies, 0.99), "max_s": max(latencies) if latencies else None,
                    "statuses": statuses, **outcomes,
                    "error_rate": outcomes["error"] / len(records) if records else 0.0,
                    "server_errors": sum(1 for record in records if record.status >= 500),
                    "connection_errors": sum(1 for record in records if record.status == 0),
                    "timeouts": sum(1 for record in records if record.status == -1),
                    "throttled": sum(1 for record in records if record.status == 429)}

        overall = block(inside)
        overall["throughput_per_s"] = len(inside) / seconds if seconds else 0.0
        overall["offered_per_s"] = self.rate
        per_op = {op: block([record for record in inside if record.op == op]) for op in MIX}
        return {"seconds": seconds, "overall": overall, "per_operation": per_op,
                "connections_opened": sum(connection.connects for connection in self.connections),
                "generator_lag_max_s": self.lag_max, "idempotent_replays": self.replays,
                "samples_error": self.samples_error, "samples_unexpected": self.samples_unexpected}


# --- the measurement -----------------------------------------------------------------------------------------

async def _warm_up(soak: Soak, timeout: float, progress, job: bool = True) -> float:
    """The node registers (and with ``job``, one job runs to SUCCEEDED) before the load starts; returns the
    seconds it took."""
    began = time.monotonic()
    user = soak.users[0]
    deadline = time.monotonic() + timeout
    while True:
        soak.platform.check_alive()
        status, payload = await soak.call(user, "warmup", "GET", "/api/v1/nodes/", expect=set())
        if status == 200 and any(node["state"] == "up" for node in json.loads(payload).get("results", [])):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node did not register within {timeout:g} s:\n{soak.platform.tail('node')}")
        await asyncio.sleep(0.5)
    if not job:
        progress(f"  node up {time.monotonic() - began:.1f} s after it started")
        return time.monotonic() - began
    status, payload = await soak.call(user, "warmup", "POST", "/api/v1/jobs/", soak._submit_body(0), expect=set())
    if status != 201:
        raise RuntimeError(f"the warm-up submit answered {status}: {payload[:300]!r}")
    job = json.loads(payload)["id"]
    while True:
        status, payload = await soak.call(user, "warmup", "GET", f"/api/v1/jobs/{job}/", expect=set())
        state = json.loads(payload)["state"] if status == 200 else None
        if state == "SUCCEEDED":
            break
        if state in TERMINAL or time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up job ended {state} (or timed out); node log:\n"
                               f"{soak.platform.tail('node')}")
        await asyncio.sleep(0.5)
    soak.records.clear()
    progress(f"  warm-up job SUCCEEDED {time.monotonic() - began:.1f} s after the node started")
    return time.monotonic() - began


def measure(duration: float = 300.0, rate: float = 10.0, sample_s: float = 5.0, warmup_s: float | None = None,
            drain_s: float = 120.0, seed: int = 0, database_url: str | None = None, broker_url: str | None = None,
            warm_job: bool = True, progress=_say) -> dict:
    """Start the platform, run the soak, settle, stop; return everything measured. ``database_url`` /
    ``broker_url``: None reads STRATA_DATABASE_URL / STRATA_BROKER_URL (absent: SQLite + the embedded broker).
    ``warm_job``: run one job to its end before the load (else only wait for the node)."""
    database_url = os.environ.get("STRATA_DATABASE_URL") if database_url is None else database_url
    broker_url = os.environ.get("STRATA_BROKER_URL") if broker_url is None else broker_url
    warmup_s = min(60.0, duration * 0.2) if warmup_s is None else warmup_s
    load_before = os.getloadavg()
    backend = Backend.create(database_url, broker_url)
    home = Path(tempfile.mkdtemp(prefix="strata-soak-"))
    platform = Platform(home, backend)
    progress(f"  soak on {backend.name}: strata server on port {platform.port}, strata scheduler, strata node "
             f"({NODE_GPUS} virtual GPUs, {NODE_SLOTS} slots); state in {home}")
    ok = False
    watcher = None
    try:
        platform.start()
        watcher = Watcher(platform)

        async def main() -> dict:
            soak = Soak(platform, rate, duration, seed)
            try:
                startup_s = await _warm_up(soak, 180.0, progress, warm_job)
                progress(f"  load: {rate:g} requests/s (Poisson) for {duration:g} s, {len(soak.users)} users of "
                         f"{len(TEAMS)} teams, {CONNECTIONS_PER_USER} kept-alive connections each; samples every "
                         f"{sample_s:g} s, warm-up {warmup_s:g} s")
                window = await soak.run(watcher, sample_s, progress)
                stats = soak.statistics(window["start"], window["end"])
                jobs = await soak.settle(drain_s, progress)
                jobs["submitted"] = soak.submitted
                return {"stats": stats, "jobs": jobs, "startup_s": startup_s}
            finally:
                soak.close()

        result = asyncio.run(main())
        samples = watcher.samples
        result.update({
            "backend": backend.name, "duration_s": duration, "rate_per_s": rate, "sample_s": sample_s,
            "seed": seed, "users": len(platform.credentials["users"]), "teams": list(TEAMS),
            "mix": {op: weight for op, (weight, _) in MIX.items()}, "samples": samples,
            "flatness": flatness(samples, warmup_s),
            "rss": {"start": samples[0]["server_rss"] if samples else None,
                    "end": samples[-1]["server_rss"] if samples else None},
            "db_connections": {"start": samples[0]["db_connections"] if samples else None,
                               "end": samples[-1]["db_connections"] if samples else None,
                               "max": max((row["db_connections"] for row in samples), default=None)},
            "load_average_before": load_before, "load_average": os.getloadavg(),
            "load_1m_during": [min((row["load_1m"] for row in samples), default=None),
                               max((row["load_1m"] for row in samples), default=None)],
            "node_slots": NODE_SLOTS, "node_gpus": NODE_GPUS,
            "job_gpus": JOB_GPUS,
        })
        ok = True
        return result
    finally:
        if watcher is not None:
            watcher.close()
        platform.stop()
        backend.remove()
        if ok:
            shutil.rmtree(home, ignore_errors=True)
        else:
            progress(f"  logs kept in {platform.logs}")


def figures(result: dict) -> list[benchkit.Figure]:
    overall = result["stats"]["overall"]
    flat = result["flatness"]
    rss, connections = result["rss"], result["db_connections"]
    jobs = result["jobs"]
    backend = result["backend"]
    rss_flat = flat.get("rss", {}).get("flat")
    connections_flat = flat.get("db_connections", {}).get("flat")
    return [
        benchkit.Figure(
            "latency_p99_s", f"p99 latency of every call of the soak mix ({backend}), against the 300 ms bar",
            overall["p99_s"], P99_TARGET_S, "s", target=1.0, baseline_text="target 300 ms",
            mechanism_text=f"p99 {_ms(overall['p99_s'])} (p50 {_ms(overall['p50_s'])})",
            extra={"p50_s": overall["p50_s"], "per_operation_p99_s": {
                op: item["p99_s"] for op, item in result["stats"]["per_operation"].items()}}),
        benchkit.Figure(
            "throughput_per_s", f"calls answered per second against the offered rate ({backend})",
            overall["throughput_per_s"], overall["offered_per_s"], "/s", lower_is_better=False,
            mechanism_text=f"{overall['throughput_per_s']:.2f}/s ({overall['requests']:,} calls)",
            baseline_text=f"offered {overall['offered_per_s']:g}/s"),
        benchkit.Figure(
            "errors", f"calls that failed: 5xx, connection errors, timeouts ({backend}); 4xx the call may give "
            "(429, the other team's 404) apart", float(overall["error"]), None, "calls",
            mechanism_text=f"{overall['error']} of {overall['requests']:,} (rate {overall['error_rate']:.2%}); "
                           f"{overall['unexpected']} unexpected 4xx, {overall['expected']} expected 4xx "
                           f"({overall['throttled']} throttled)",
            baseline_text="0",
            extra={"error_rate": overall["error_rate"], "server_errors": overall["server_errors"],
                   "connection_errors": overall["connection_errors"], "timeouts": overall["timeouts"],
                   "unexpected": overall["unexpected"], "expected_4xx": overall["expected"]}),
        benchkit.Figure(
            "server_rss_mib", f"the server's RSS at the end against the start ({backend}); flat: second half "
            f"within {RSS_TOLERANCE_FRACTION:.0%} + {RSS_TOLERANCE_BYTES // 2**20} MiB of the first",
            (rss["end"] or 0) / 2**20 or None, (rss["start"] or 0) / 2**20 or None, "MiB",
            mechanism_text=f"{(rss['end'] or 0) / 2**20:.1f} MiB at the end (flat: {rss_flat})",
            baseline_text=f"{(rss['start'] or 0) / 2**20:.1f} MiB at the start", extra={"flat": rss_flat}),
        benchkit.Figure(
            "db_connections", f"database connections at the end against the start ({backend}); flat: second "
            f"half's median within +{CONNECTION_TOLERANCE} of the first's, max within the first's or the server's "
            f"threads +{CONNECTION_TOLERANCE}", float(connections["end"] or 0) or None,
            float(connections["start"] or 0) or None, "connections",
            mechanism_text=f"{connections['end']} at the end, max {connections['max']} (flat: {connections_flat})",
            baseline_text=f"{connections['start']} at the start", extra={"flat": connections_flat}),
        benchkit.Figure(
            "jobs_listed", f"acknowledged submits listed afterwards ({backend})",
            float(jobs["listed"]) or None, float(jobs["acknowledged"]) or None, "jobs", lower_is_better=False,
            target=1.0, mechanism_text=f"{jobs['listed']:,} listed, {jobs['finished']:,} finished",
            baseline_text=f"{jobs['acknowledged']:,} acknowledged", extra={"states": jobs["states"]}),
    ]


def report(result: dict) -> str:
    stats = result["stats"]
    rows = []
    for op, item in [("all", stats["overall"]), *stats["per_operation"].items()]:
        rows.append([op, f"{item['requests']:,}", _ms(item["p50_s"]), _ms(item["p99_s"]), _ms(item["max_s"]),
                     item["error"], item["unexpected"], item["expected"], item["throttled"]])
    table = benchkit.table(rows, ["operation", "calls", "p50", "p99", "max", "errors", "unexpected 4xx",
                                  "expected 4xx", "429"])
    overall, flat, jobs = stats["overall"], result["flatness"], result["jobs"]
    rss, connections = result["rss"], result["db_connections"]
    lines = [table,
             f"throughput {overall['throughput_per_s']:.2f} calls/s of {overall['offered_per_s']:g} offered; error "
             f"rate {overall['error_rate']:.3%} ({overall['server_errors']} 5xx, {overall['connection_errors']} "
             f"connection errors, {overall['timeouts']} timeouts)",
             f"server RSS {rss['start'] / 2**20:.1f} -> {rss['end'] / 2**20:.1f} MiB; DB connections "
             f"{connections['start']} -> {connections['end']} (max {connections['max']}); flat: {flat.get('flat')}",
             f"jobs: {jobs['acknowledged']:,} acknowledged, {jobs['listed']:,} listed afterwards, "
             f"{jobs['finished']:,} finished {jobs['states']}; idempotent replays {stats['idempotent_replays']}"]
    if stats["samples_error"] or stats["samples_unexpected"]:
        lines.append("samples: " + "; ".join(stats["samples_error"] + stats["samples_unexpected"]))
    return "\n".join(lines)


def _standalone(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.core.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    parser.add_argument("--rate", type=float, default=10.0, help="calls per second offered (Poisson; default 10)")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between RSS/connection samples")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of samples left out of the "
                        "flatness check (default: 20%% of the duration, at most 60)")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait for the jobs to end")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the platform, database and keys go
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _say(f"strata soak: {args.duration:g} s at {args.rate:g} calls/s on 127.0.0.1 "
         f"(load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    result = measure(args.duration, args.rate, args.sample, args.warmup, args.drain, args.seed)
    _say(report(result))
    doc = benchkit.document("soak", args.duration < 300, figures(result), details=result)
    _say(benchkit.figures_table(doc))
    if args.output:
        benchkit.write(doc, args.output)
        _say(f"results written to {args.output}")
    overall = result["stats"]["overall"]
    healthy = overall["error"] == 0 and result["jobs"]["missing_count"] == 0 and result["flatness"].get("flat")
    return 0 if healthy else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "setup":
        sys.exit(_setup_worker(sys.argv[2:]))
    sys.exit(_standalone(sys.argv[1:]))
