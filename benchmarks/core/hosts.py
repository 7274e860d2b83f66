"""Separate hosts on one machine: Linux network namespaces joined by veth pairs, for the multi-host test
(``tests/e2e/test_multihost.py``) and the cross-host figure of ``strata bench control-plane``.

Topology (``ip`` from iproute2, run as root)::

    <p>sw   a switch namespace holding the bridge ``br0``
    <p>cp   the control-plane host: eth0 = 198.18.N.1   redis-server, strata server, strata scheduler
    <p>n1   a node host:            eth0 = 198.18.N.2   strata node
    <p>n2   ...                     eth0 = 198.18.N.3

Each host's ``eth0`` is one end of a veth pair whose other end sits in the switch, attached to the bridge.
The addresses come from 198.18.0.0/15, the block RFC 2544 reserves for benchmarking networks: it is routed
nowhere and exists only inside these namespaces (the root namespace has no address or route into it).
Cutting a host's link (``cut``) sets its switch port down: the host and its processes live on, unreachable.

The control plane's database is the machine's PostgreSQL over its Unix socket (a file, reachable from any
network namespace, like a database on the control-plane host itself) or SQLite in the control plane's home;
its broker is a redis-server started inside the control-plane host and reached by the nodes over the bridge.
Nodes never open the database. Only the standard library is imported here (psycopg when PostgreSQL is used).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.stack import stop_on_exit, stopped

TEST_RANGE = "198.18.0.0/15"  # RFC 2544: for benchmarking networks, never routed
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
PG_SOCKET_DIR = os.environ.get("STRATA_MULTIHOST_PG_SOCKET", "/var/run/postgresql")
# Settings every process of a test cluster gets: short leases so that a lost host is noticed in seconds.
FAST = {"STRATA_NODE_LEASE_SECONDS": "6", "STRATA_HEARTBEAT_SECONDS": "1", "STRATA_SCHEDULER_TICK_SECONDS": "1",
        "STRATA_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1", "STRATA_GPUSHARE_WARM_UP": "0"}
SERVER_PORT = 8000
NODE_METRICS_PORT = 9108  # each node serves Prometheus metrics on its own address
REDIS_PORT = 6379


class NamespaceError(RuntimeError):
    """The machine cannot make network namespaces (not root, no iproute2, no kernel support)."""


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can (checked by making and deleting one)."""
    if os.geteuid() != 0:
        return "network namespaces need root (the multi-host test runs as root, as CI does)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    probe = f"stprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise NamespaceError(f"{' '.join(command)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    port: str  # the switch side of its veth pair
    executor: ThreadPoolExecutor | None = None


class Hosts:
    """Named hosts (network namespaces) on one bridge. ``with Hosts(["cp", "n1", "n2"]) as hosts: ...``;
    closing kills every process left in them and deletes the namespaces."""

    def __init__(self, names: list[str], prefix: str | None = None):
        problem = unavailable()
        if problem:
            raise NamespaceError(problem)
        self.prefix = prefix or f"st{os.getpid() % 100000}{secrets.token_hex(1)}"
        self.switch = f"{self.prefix}sw"
        net = (os.getpid() + secrets.randbelow(256)) % 256  # 198.18.<net>.0/24
        self.hosts: dict[str, Host] = {}
        self.processes: list[subprocess.Popen] = []
        stop_on_exit(self, self.close)  # interrupted, leave no process and no namespace behind
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "add", "br0", "type", "bridge", namespace=self.switch)
            _ip("link", "set", "br0", "up", namespace=self.switch)
            _ip("link", "set", "lo", "up", namespace=self.switch)
            for index, name in enumerate(names):
                namespace = f"{self.prefix}{name}"
                inside, port = f"{self.prefix}{index}h", f"{self.prefix}{index}s"
                address = f"198.18.{net}.{index + 1}"
                _ip("netns", "add", namespace)
                self.hosts[name] = Host(name, namespace, address, port)
                _ip("link", "add", inside, "type", "veth", "peer", "name", port)
                _ip("link", "set", inside, "netns", namespace)
                _ip("link", "set", port, "netns", self.switch)
                _ip("link", "set", port, "master", "br0", namespace=self.switch)
                _ip("link", "set", port, "up", namespace=self.switch)
                _ip("link", "set", inside, "name", "eth0", namespace=namespace)
                _ip("addr", "add", f"{address}/24", "dev", "eth0", namespace=namespace)
                _ip("link", "set", "eth0", "up", namespace=namespace)
                _ip("link", "set", "lo", "up", namespace=namespace)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def address(self, name: str) -> str:
        return self.hosts[name].address

    # -- processes on a host ---------------------------------------------------------------------------------
    def start(self, name: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """``argv`` on host ``name``, in a new process group (killed by :meth:`kill` and :meth:`close`)."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        process = subprocess.Popen(["ip", "netns", "exec", self.hosts[name].namespace, *argv], **kwargs)
        self.processes.append(process)
        return process

    def run(self, name: str, argv: list[str], timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``name`` to its end."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(["ip", "netns", "exec", self.hosts[name].namespace, *argv], timeout=timeout,
                              capture_output=True, text=True, **kwargs)

    def pids(self, name: str) -> list[int]:
        """Every process in host ``name``'s namespace."""
        done = subprocess.run(["ip", "netns", "pids", self.hosts[name].namespace], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def kill(self, name: str) -> int:
        """SIGKILL every process on host ``name`` (a host that dies); returns how many there were."""
        killed = 0
        for _ in range(20):  # processes may still fork while we kill: repeat until none is left
            pids = self.pids(name)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.1)
        for process in self.processes:  # reap the ones we started
            if process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.1)
        return killed

    # -- the network -----------------------------------------------------------------------------------------
    def cut(self, name: str) -> None:
        """Unplug host ``name``: its switch port goes down; it keeps running, unreachable."""
        _ip("link", "set", self.hosts[name].port, "down", namespace=self.switch)

    def restore(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].port, "up", namespace=self.switch)

    def call(self, name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function`` in this process, on a thread inside host ``name``'s network namespace: the sockets it
        opens are that host's (a test's HTTP client "on" the control-plane host, say)."""
        host = self.hosts[name]
        if host.executor is None:
            host.executor = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{name}",
                                               initializer=_enter_namespace, initargs=(host.namespace,))
        return host.executor.submit(function, *args, **kwargs).result()

    def enter(self, name: str) -> None:
        """Move the calling thread into host ``name``'s network namespace for good: a long-running client thread
        of its own (:meth:`call` runs one function at a time per host)."""
        _enter_namespace(self.hosts[name].namespace)

    def close(self) -> None:
        for host in self.hosts.values():
            if host.executor is not None:
                host.executor.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(Exception):
                self.kill(host.name)
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for namespace in [*(host.namespace for host in self.hosts.values()), self.switch]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self.hosts = {}
        stopped(self)


def _enter_namespace(namespace: str) -> None:
    """Move the calling thread into a network namespace (setns(2) acts on the thread, not the process)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / namespace, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise NamespaceError(f"setns({namespace}): {os.strerror(error)}")
    finally:
        os.close(fd)


# -- a Strata cluster over those hosts ---------------------------------------------------------------------------

def strata_command() -> list[str]:
    script = Path(sys.executable).with_name("strata")
    return [str(script)] if script.exists() else [sys.executable, "-m", "strata.cli.main"]


def _base_env() -> dict[str, str]:
    """This process's environment without any STRATA_* setting (each process gets its own below)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("STRATA_")}


@dataclass
class HostCluster:
    """A control plane on host ``cp`` (redis-server, ``strata server`` on all its addresses, ``strata
    scheduler``) and ``strata node`` agents on the other hosts, each registering with its own address.

    ``database``: "postgres" (a fresh database on the machine's PostgreSQL, reached through its Unix socket,
    dropped by :meth:`stop`) or "sqlite" (in the control plane's home)."""

    hosts: Hosts
    home: Path
    database: str = "postgres"
    extra_env: dict[str, str] = field(default_factory=dict)
    fast: bool = True  # short leases and ticks (FAST) for tests; False: the production defaults
    persistent_broker: bool = False  # redis-server with its append-only file (a restart keeps the queues)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    credentials: dict = field(default_factory=dict)
    database_name: str | None = None

    @property
    def cp(self) -> str:
        return self.hosts.address("cp")

    @property
    def url(self) -> str:
        return f"http://{self.cp}:{SERVER_PORT}"

    def control_env(self) -> dict[str, str]:
        env = {**_base_env(), **self._fast(), **self.extra_env, "STRATA_HOME": str(self.home / "cp"),
               "STRATA_BROKER_URL": f"redis://{self.cp}:{REDIS_PORT}/0", "STRATA_PUBLIC_URL": self.url,
               "STRATA_ALLOWED_HOSTS": f"{self.cp},127.0.0.1,localhost"}
        if self.database_name:
            env["STRATA_DATABASE_URL"] = f"postgresql://postgres@/{self.database_name}?host={PG_SOCKET_DIR}"
        return env

    def _fast(self) -> dict[str, str]:
        return dict(FAST) if self.fast else {"PYTHONUNBUFFERED": "1"}

    def _log(self, name: str):
        return (self.home / f"{name}.log").open("ab")

    def start(self, timeout: float = 120.0) -> HostCluster:
        (self.home / "cp").mkdir(parents=True, exist_ok=True)
        if self.database == "postgres":
            import psycopg

            self.database_name = f"strata_multihost_{secrets.token_hex(4)}"
            with psycopg.connect(f"postgresql://postgres@/postgres?host={PG_SOCKET_DIR}", autocommit=True) as db:
                db.execute(f'CREATE DATABASE "{self.database_name}"')
        self.start_broker()
        env = self.control_env()
        # The operator's first step on the control-plane host: migrate, then an admin, a team and the tokens.
        script = ("from pathlib import Path; from strata.cli.server_commands import migrate, bootstrap; migrate(); "
                  f"bootstrap(Path({str(self.home / 'cp')!r}), {self.url!r})")
        done = self.hosts.run("cp", [sys.executable, "-c", script], env=env, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"bootstrap failed: {done.stderr[-3000:]}")
        self.credentials = json.loads((self.home / "cp" / "credentials.json").read_text())
        self.processes["server"] = self.hosts.start(
            "cp", [*strata_command(), "server", "--host", "0.0.0.0", "--port", str(SERVER_PORT)], env=env,
            stdout=self._log("server"), stderr=subprocess.STDOUT)
        self.processes["scheduler"] = self.hosts.start(
            "cp", [*strata_command(), "scheduler"], env=env, stdout=self._log("scheduler"),
            stderr=subprocess.STDOUT)
        self.wait(lambda: self._healthy(), timeout, "the control plane to answer /healthz on its host address")
        return self

    def start_broker(self) -> subprocess.Popen:
        """The control-plane host's redis-server (again, after :meth:`stop_broker`): with its append-only file in
        the control plane's home when ``persistent_broker``, so a restart finds the queues it had."""
        redis = shutil.which("redis-server")
        if redis is None:
            raise RuntimeError("redis-server is not installed: the control-plane host runs its own broker")
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent_broker else \
            ["--appendonly", "no"]
        self.processes["redis"] = self.hosts.start(
            "cp", [redis, "--bind", self.cp, "--port", str(REDIS_PORT), "--save", "", *persistence,
                   "--protected-mode", "no", "--dir", str(self.home / "cp")],
            stdout=self._log("redis"), stderr=subprocess.STDOUT)
        return self.processes["redis"]

    def stop_broker(self, wipe: bool = False) -> None:
        """Stop the broker (SIGTERM: redis-server finishes its append-only file); ``wipe``: delete its data too,
        so that it comes back empty (a broker without persistence that restarted, or a FLUSHALL)."""
        process = self.processes.get("redis")
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        if wipe:
            for path in [*(self.home / "cp").glob("appendonly*"), self.home / "cp" / "dump.rdb"]:
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()

    def database_connections(self, terminate: bool = False) -> int:
        """How many connections the control plane holds to its PostgreSQL database; ``terminate``: end them all
        (``pg_terminate_backend``, what a database restart or failover does to its clients). 0 on SQLite."""
        if not self.database_name:
            return 0
        import psycopg

        query = ("SELECT count(*) FILTER (WHERE {}) FROM pg_stat_activity WHERE datname = %s "
                 "AND pid <> pg_backend_pid()").format("pg_terminate_backend(pid)" if terminate else "true")
        with psycopg.connect(f"postgresql://postgres@/postgres?host={PG_SOCKET_DIR}", autocommit=True) as db:
            return int(db.execute(query, (self.database_name,)).fetchone()[0])

    def _healthy(self) -> bool:
        for name in ("redis", "server", "scheduler"):
            process = self.processes[name]
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.output()}")
        try:
            return self.hosts.call("cp", _get_ok, f"{self.url}/healthz")
        except OSError:
            return False

    def start_node(self, host: str, virtual_gpus: int = 1, **env: str) -> subprocess.Popen:
        """``strata node`` on ``host``, registering with that host's address (its endpoints bind every
        interface and are published with that address; callers need the job's deployment tokens)."""
        address = self.hosts.address(host)
        variables = {**_base_env(), **self._fast(), **self.extra_env,
                     "STRATA_NODE_TOKEN": self.credentials["node_token"],
                     "STRATA_SERVING_HOST": "0.0.0.0", "STRATA_SERVING_ADVERTISE_HOST": address, **env}
        process = self.hosts.start(
            host, [*strata_command(), "node", "--server", self.url, "--name", f"host-{host}", "--address", address,
                   "--virtual-gpus", str(virtual_gpus), "--state-dir", str(self.home / f"node-{host}"),
                   "--metrics-port", str(NODE_METRICS_PORT)],
            env=variables, stdout=self._log(f"node-{host}"), stderr=subprocess.STDOUT)
        self.processes[f"node-{host}"] = process
        return process

    def api(self, method: str, path: str, host: str = "cp", **kwargs: Any) -> Any:
        """A REST call from ``host`` (default: the control-plane host) with the team's token."""
        return self.hosts.call(host, _request, method, f"{self.url}/api/v1/{path}", self.credentials["token"],
                               kwargs)

    def wait(self, condition: Callable[[], Any], timeout: float, message: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {message}\n{self.output()}")
            time.sleep(0.3)

    def log(self, name: str) -> str:
        """What process ``name`` (server, scheduler, redis, node-<host>) wrote so far."""
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def output(self, tail: int = 3000) -> str:
        parts = []
        for path in sorted(self.home.glob("*.log")):
            parts.append(f"--- {path.name} ---\n" + path.read_text(errors="replace")[-tail:])
        return "\n".join(parts)

    def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        if self.database_name:
            with contextlib.suppress(Exception):
                import psycopg

                with psycopg.connect(f"postgresql://postgres@/postgres?host={PG_SOCKET_DIR}",
                                     autocommit=True) as db:
                    db.execute(f'DROP DATABASE IF EXISTS "{self.database_name}" WITH (FORCE)')


_sessions = threading.local()


def _session():
    import requests

    if not hasattr(_sessions, "session"):
        _sessions.session = requests.Session()
    return _sessions.session


def get_text(url: str) -> str:
    """GET ``url`` (no token), for :meth:`Hosts.call`: ``hosts.call("cp", get_text, url)``."""
    response = _session().get(url, timeout=10)
    response.raise_for_status()
    return response.text


def _get_ok(url: str) -> bool:
    import requests

    try:
        return _session().get(url, timeout=2).ok
    except requests.RequestException:
        return False


def _request(method: str, url: str, token: str, kwargs: dict) -> Any:
    response = _session().request(method, url, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                                  **kwargs)
    response.raise_for_status()
    return response.json() if response.content else None
