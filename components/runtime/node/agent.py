"""The node agent behind ``strata node``: registers the node, heartbeats, and supervises the node's Celery
worker and every plugin's node services (:mod:`components.runtime.contract.services`): started, checked every
heartbeat and restarted with backoff, their reports sent with the full heartbeats, stopped with the agent.

The node's lease is renewed every ``heartbeat_seconds`` by the lean ``node/renew/``; the device samples (each
beat's, batched) and the plugins' reports go in a full ``node/heartbeat/`` every ``telemetry_seconds`` the control
plane names, and at once when the attempts the node runs change.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from components.runtime.client.client import ApiError, ControlPlaneClient
from components.runtime.contract.data import DATA_SETS_ENV
from components.runtime.contract.services import (
    NodeInfo,
    Supervisor,
    disabled_plugins,
    set_parent_death_signal,
)
from components.runtime.node import sandbox
from components.runtime.node.metrics import NodeMetrics

log = logging.getLogger("strata.node")
LEAVE_MARGIN_S = 10.0  # leave this long before ``end_time``: before the batch system signals the node's processes



@dataclass
class NodeOptions:
    server: str
    token: str
    name: str = field(default_factory=socket.gethostname)
    virtual_gpus: int | None = None
    virtual_gpu_memory: int = 8 * 2**30
    labels: dict = field(default_factory=dict)
    state_dir: Path = field(default_factory=lambda: Path.home() / ".strata" / "node")
    slots: int | None = None
    broker_url: str | None = None
    address: str = "127.0.0.1"
    # When the node's allocation ends (a batch system's time limit), in Unix seconds, and how long before then
    # it drains (takes no new work, finishes what it runs); it leaves LEAVE_MARGIN_S before the end.
    end_time: float | None = None
    drain_before: float | None = None
    metrics_port: int = 0  # expose Prometheus metrics on this port (0: off; components.runtime.node.metrics)
    metrics_bind: str | None = None  # the metrics server's address (default: ``address``)
    # The CPUs and host memory (bytes) the node offers to jobs that reserve CPUs (``resources.cpus``); None: the
    # STRATA_NODE_CPUS / STRATA_NODE_MEMORY environment variables, else what the machine has (host_resources).
    cpus: float | None = None
    memory: int | None = None
    # The sandbox of attempts that run a team's code: "auto" (bubblewrap where it is found), "bwrap" or "none"
    # (components.runtime.node.sandbox).
    sandbox: str = "auto"


def host_resources(cpus: float | None = None, memory: int | None = None) -> tuple[float | None, int | None]:
    """``(cpus, memory bytes)`` the node offers: the given values, else ``STRATA_NODE_CPUS`` and
    ``STRATA_NODE_MEMORY`` (a size such as ``4GiB``: tests fake several nodes on one machine), else the CPUs
    this process may run on and the machine's memory (``/proc/meminfo``, or psutil). None where unknown."""
    from components.runtime.shared.units import parse_bytes

    if cpus is None and os.environ.get("STRATA_NODE_CPUS"):
        cpus = float(os.environ["STRATA_NODE_CPUS"])
    if memory is None and os.environ.get("STRATA_NODE_MEMORY"):
        memory = parse_bytes(os.environ["STRATA_NODE_MEMORY"])
    if cpus is None:
        try:
            cpus = float(len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            cpus = float(os.cpu_count() or 0) or None
    if memory is None:
        memory = _memory_total()
    return cpus, memory


def _memory_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - psutil is optional: the memory is then unknown
        return None


class NodeAgent:
    def __init__(self, options: NodeOptions):
        self.options = options
        self.client = ControlPlaneClient(options.server, options.token, retries=2, timeout=15)
        self.state_dir = Path(options.state_dir).expanduser().resolve()
        (self.state_dir / "running").mkdir(parents=True, exist_ok=True)
        self.sandbox_mode = sandbox.resolve_mode(options.sandbox)
        if self.sandbox_mode == "bwrap":
            # Closed to everyone else: a sandboxed attempt sees none of it, and, as its team's uid, could not read
            # it if it did.
            self.state_dir.chmod(0o700)
        else:
            why = "" if options.sandbox == "none" else ": bubblewrap is not installed, or cannot make a sandbox here"
            log.warning("the sandbox is off (--sandbox %s%s): a job's code runs with this agent's privileges",
                        options.sandbox, why)
        self.worker: subprocess.Popen | None = None
        self.worker_started_at = 0.0
        self.registration: dict = {}
        self.stopping = False
        self.drain_requested = False  # SIGUSR1, or drain_before the end of the allocation
        self.draining = False  # the control plane knows: no new work, leave when nothing is left
        from components.runtime.node.devices import detect_devices, visible_ids

        self.devices = detect_devices(options.virtual_gpus, options.virtual_gpu_memory)
        if any(not d.virtual for d in self.devices) and visible_ids() is not None:
            # The devices carry the ids CUDA_VISIBLE_DEVICES gave (a batch system's grant): the node's processes
            # see them all under those ids, and each attempt's ranks are narrowed to their own.
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        self.services: Supervisor | None = None
        self.cpus, self.memory = host_resources(options.cpus, options.memory)

    # -- registration --------------------------------------------------------------------------------------
    def register(self, wait: float = 120.0) -> dict:
        body = {
            "name": self.options.name, "hostname": socket.gethostname(), "address": self.options.address,
            "labels": {k: str(v) for k, v in self.options.labels.items()},
            "devices": [{"index": d.index, "kind": d.kind, "name": d.name, "memory_total": d.memory_total}
                        for d in self.devices],
            "info": {"python": sys.version.split()[0], "pid": os.getpid(), "sandbox": self.sandbox_mode},
            "cpus": self.cpus, "memory": self.memory,
        }
        deadline = time.monotonic() + wait
        while True:
            try:
                self.registration = self.client.post("node/register/", body)
                break
            except ApiError as error:
                if error.status not in (0, 502, 503, 504) or time.monotonic() > deadline:
                    raise
                log.info("control plane not reachable yet (%s); retrying", error.message)
                time.sleep(1.0)
        self.telemetry_sent_at = 0.0  # the new session's first heartbeat is a full one
        log.info("registered node %s (%s) with %d %s device(s)", self.options.name, self.registration["node"],
                 len(self.devices), "virtual" if all(d.virtual for d in self.devices) else "CUDA")
        return self.registration

    # -- the Celery worker ---------------------------------------------------------------------------------
    def _worker_config(self) -> Path:
        path = self.state_dir / "worker.json"
        config = {"server": self.options.server, "node_token": self.options.token,
                  "node": self.registration["node"], "state_dir": str(self.state_dir),
                  "address": self.options.address,
                  "broker_url": self.options.broker_url or self.registration["broker_url"],
                  "broker_prefix": self.registration.get("broker_prefix"),
                  "services": self.services.worker_config() if self.services is not None else {},
                  "sandbox": self.sandbox_mode, "bwrap": sandbox.find_bwrap() if self.sandbox_mode == "bwrap" else None}
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def start_worker(self) -> None:
        for stale in (self.state_dir / "running").glob("*.json"):
            stale.unlink(missing_ok=True)
        # Attempts that got a fraction of a device may be hosted by a node service, so a device may carry several
        # attempts at once (four 0.25-GPU jobs, say), and a job running nested children inside its own devices
        # (a sweep and its trials) needs a slot besides theirs: five slots per device keep them from queueing on
        # the node.
        # Jobs that hold no GPU share the node's CPUs: a slot per CPU besides.
        slots = self.options.slots or max(2, 5 * len(self.devices)) + int(self.cpus or 0)
        env = {**os.environ, "STRATA_NODE_CONFIG": str(self._worker_config())}
        command = [sys.executable, "-m", "celery", "-A", "components.runtime.node.worker", "worker",
                   "-Q", self.registration["queue"], "-n", f"{self.options.name}@%h", "--concurrency", str(slots),
                   "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat",
                   "--loglevel", "WARNING"]
        self.worker = subprocess.Popen(command, env=env, preexec_fn=set_parent_death_signal)
        self.worker_started_at = time.monotonic()
        log.info("worker started on queue %s with %d slots (pid %d)", self.registration["queue"], slots,
                 self.worker.pid)

    def _restart_stalled_worker(self, stalled: dict | None) -> None:
        """The control plane says attempts dispatched here were never claimed: a worker that lives but takes no
        work (celery can hang so after a broker outage) is restarted -- once it has had that long itself."""
        if not stalled or self.stopping or self.worker is None:
            return
        after = float(stalled.get("after_seconds", 120.0))
        if time.monotonic() - self.worker_started_at < after:
            return
        log.error("%s attempt(s) dispatched to this node were not started within %g s: restarting the worker",
                  stalled.get("attempts"), after)
        self.stop_worker()
        self.start_worker()

    def stop_worker(self) -> None:
        if self.worker is None or self.worker.poll() is not None:
            return
        self.worker.send_signal(signal.SIGQUIT)  # cold shutdown: unacked messages go back to the broker
        try:
            self.worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            self.worker.wait()

    # -- heartbeats ----------------------------------------------------------------------------------------
    def running(self) -> dict[str, dict[int, list[int]]]:
        running = {}
        for path in (self.state_dir / "running").glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            running[data["attempt"]] = {int(k): v for k, v in data.get("pids", {}).items()}
        return running

    # The lean node path: once the control plane's answer names a ``telemetry_seconds`` cadence, the agent renews
    # its lease every interval with ``node/renew/`` (its id, session and running attempts: the answer is the
    # heartbeat's) and sends a full heartbeat -- the device samples of every beat since the last one, each with
    # its time, and the plugins' reports -- once per cadence, and at once when the attempts it runs change. A
    # control plane that names no cadence (an older one) gets a full heartbeat every interval, as before.
    telemetry_seconds: float | None = None  # None: every heartbeat is a full one
    telemetry_sent_at = 0.0  # monotonic time of the last full heartbeat that got through (0: one is due)
    reported_attempts: frozenset = frozenset()  # the attempts listed in that heartbeat
    last_reports: dict | None = None
    MAX_PENDING_BEATS = 120  # device samples of at most this many beats wait for a full heartbeat

    @property
    def pending_samples(self) -> list[dict]:
        return self.__dict__.setdefault("_pending_samples", [])

    def heartbeat(self) -> dict:
        from components.runtime.node.devices import sample_devices

        running = self.running()
        pids: dict[int, list[int]] = {}
        for by_device in running.values():
            for index, device_pids in by_device.items():
                pids.setdefault(index, []).extend(device_pids)
        samples = sample_devices(self.devices, pids)
        taken = round(time.time(), 3)
        pending = self.pending_samples
        pending.extend({"index": s["index"], "utilization": s["utilization"], "memory_used": s["memory_used"],
                        "time": taken} for s in samples)
        del pending[:max(0, len(pending) - self.MAX_PENDING_BEATS * max(1, len(samples)))]
        answer = None
        if not self._telemetry_due(running):
            self.metrics.observe(samples, self.last_reports, running)
            try:
                answer = self.client.post("node/renew/", {"node": self.registration["node"],
                                                          "session": self.registration["session"],
                                                          "attempts": list(running)})
            except ApiError as error:
                if error.status not in (404, 405):
                    raise
                # No such route (an older control plane), or an unknown node: a full heartbeat says which.
                self.telemetry_seconds = None
        if answer is None:
            answer = self._full_heartbeat(running, samples)
        if isinstance(answer, dict):
            cadence = answer.get("telemetry_seconds")
            self.telemetry_seconds = float(cadence) if isinstance(cadence, int | float) and cadence > 0 else None
        if self.services is not None and isinstance(answer, dict):
            self.services.configure(answer)
        if isinstance(answer, dict):
            self._note_state(answer)
            self._restart_stalled_worker(answer.get("stalled"))
        self.metrics.heartbeat_ok()
        return answer

    def _telemetry_due(self, running: dict) -> bool:
        """Whether this beat is a full heartbeat: no cadence from the control plane, the cadence has passed since
        the last one, or the attempts the node runs changed since it."""
        if self.telemetry_seconds is None or not self.telemetry_sent_at:
            return True
        if frozenset(running) != self.reported_attempts:
            return True
        return time.monotonic() - self.telemetry_sent_at >= self.telemetry_seconds

    def _full_heartbeat(self, running: dict, samples: list[dict]):
        """``node/heartbeat/`` with the samples waiting since the last full one and the plugins' reports."""
        body = {
            "node": self.registration["node"], "session": self.registration["session"],
            "samples": list(self.pending_samples), "attempts": list(running),
        }
        reported: list[str] = []
        if self.services is not None:
            reports = self.services.reports()
            if reports:
                body["reports"] = reports
            reported = ["reports"] if reports else []
        self.last_reports = body.get("reports")
        self.metrics.observe(samples, body.get("reports"), running)
        try:
            answer = self.client.post("node/heartbeat/", body)
        except ApiError as error:
            if error.status != 400 or not reported:
                raise
            # A report the control plane refuses must not cost the node its lease.
            refused = error.payload.get("reports") if isinstance(error.payload, dict) else None
            if isinstance(refused, dict) and set(error.payload) == {"reports"} and isinstance(body.get("reports"), dict):
                # Only some plugins' reports were refused: send the heartbeat with the others.
                log.warning("the control plane refused the reports of %s (%s); heartbeat sent without them",
                            ", ".join(sorted(refused)), error.message)
                body["reports"] = {name: value for name, value in body["reports"].items() if name not in refused}
                try:
                    answer = self.client.post("node/heartbeat/", body)
                except ApiError as again:
                    if again.status != 400:
                        raise
                    answer = self._heartbeat_without(body, reported, again)
            else:
                answer = self._heartbeat_without(body, reported, error)
        self.pending_samples.clear()
        self.telemetry_sent_at = time.monotonic()
        self.reported_attempts = frozenset(running)
        return answer

    def _heartbeat_without(self, body: dict, reported: list[str], error: ApiError):
        """A report the control plane refuses must not cost the node its lease: send the heartbeat without any."""
        log.warning("the control plane refused the node services' reports (%s); heartbeat sent without them",
                    error.message)
        for name in reported:
            body.pop(name, None)
        return self.client.post("node/heartbeat/", body)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_drain_signal)
        self.register()
        self.start_metrics()  # first: a node whose services are still starting is already worth watching
        self.services = self.node_services()
        # What the services tell every attempt (a node-local cache's directory, say): the worker, its attempts'
        # child processes and the service processes inherit it.
        os.environ.update(self.services.environment())
        # Where the worker keeps the data sets it fetches for attempts (components.runtime.node.project_cache.ProjectCache):
        # an attempt's processes, and a service hosting one, find them there (components.runtime.contract.data).
        os.environ[DATA_SETS_ENV] = str(self.state_dir / "data")
        self.services.start_all()
        self.start_worker()
        interval = float(self.registration.get("heartbeat_seconds", 3.0))
        try:
            while not self.stopping:
                self._drain_due()
                try:
                    self.heartbeat()
                except ApiError as error:
                    self.metrics.heartbeat_failed()
                    if error.status == 409 and (self.draining or self.drain_requested):
                        log.warning("%s; the node was draining: stopping", error.message)
                        self.stopping = True
                    elif error.status == 409:  # our session was replaced or expired: start a new one
                        log.warning("%s; registering again", error.message)
                        self.stop_worker()
                        self.register()
                        self.start_worker()
                    else:
                        log.warning("heartbeat failed: %s", error.message)
                if self.worker is not None and self.worker.poll() is not None and not self.stopping:
                    log.error("worker exited with %s; restarting it", self.worker.returncode)
                    self.start_worker()
                if self.services is not None and not self.stopping:
                    self.services.check()
                self._sleep(interval)
        finally:
            # Leave first: the attempts still here end as for a lost node (requeued, no failure counted), so the
            # worker's reports about the children it loses while it stops are refused as stale.
            self.leave()
            self.metrics.stop()
            self.stop_worker()
            if self.services is not None:
                self.services.stop_all()
        return 0

    @functools.cached_property
    def metrics(self) -> NodeMetrics:
        """What ``--metrics-port`` exposes: the latest heartbeat's observations (components.runtime.node.metrics)."""
        return NodeMetrics(self)

    def start_metrics(self) -> int | None:
        """Serve the node's Prometheus metrics when ``--metrics-port`` is set; the bound port, or None."""
        if not self.options.metrics_port:
            return None
        return self.metrics.start(self.options.metrics_port, self.options.metrics_bind or self.options.address)

    # -- drain and leave -----------------------------------------------------------------------------------
    def _drain_due(self) -> None:
        """Drain on SIGUSR1 or ``drain_before`` the end of the allocation; stop ``LEAVE_MARGIN_S`` before it."""
        end, before = self.options.end_time, self.options.drain_before
        if end is not None:
            now = time.time()
            if now >= end - LEAVE_MARGIN_S:
                log.warning("the node's allocation ends in %.0f s: leaving", max(end - now, 0.0))
                self.stopping = True
                return
            if before is not None and now >= end - before and not self.drain_requested:
                log.warning("the node's allocation ends in %.0f s: draining", end - now)
                self.drain_requested = True
        if self.drain_requested and not self.draining:
            self.drain()

    def drain(self) -> dict | None:
        """Tell the control plane the node takes no new work (DRAINING); its attempts run on. It leaves once
        none is left (see ``_note_state``). Retried at the next beat when the call fails."""
        self.drain_requested = True
        try:
            answer = self.client.post("node/drain/", {"node": self.registration["node"],
                                                      "session": self.registration["session"]})
        except ApiError as error:
            log.warning("drain not recorded (%s); retrying", error.message)
            return None
        log.warning("draining: no new work; %s attempt(s) left", answer.get("attempts_left"))
        self._note_state(answer)
        return answer

    def _note_state(self, answer: dict) -> None:
        """What the control plane says of the node: draining, and how many attempts it still holds."""
        if answer.get("state") == "draining":
            self.draining = True
            if answer.get("attempts_left") == 0 and not self.stopping:
                log.warning("drained: no attempt left; leaving")
                self.stopping = True

    def leave(self) -> None:
        """Tell the control plane the node goes away: DOWN, its remaining attempts requeued without counting a
        failure. Best effort: when it cannot be told, the lease reaper does the same once the lease expires."""
        if not self.registration:
            return
        try:
            answer = self.client.post("node/leave/", {"node": self.registration["node"],
                                                      "session": self.registration["session"]})
        except ApiError as error:
            log.warning("leave not recorded (%s): the node's attempts are requeued when its lease expires",
                        error.message)
            return
        log.warning("left the cluster; %s attempt(s) requeued", answer.get("released"))

    def node_services(self) -> Supervisor:
        """Every plugin's node services for this node, minus the plugins ``STRATA_NODE_SERVICES_DISABLE`` names."""
        from components.runtime.contract import registry

        node = NodeInfo(name=self.options.name, devices=list(self.devices), state_dir=self.state_dir,
                        labels={k: str(v) for k, v in self.options.labels.items()})
        return Supervisor(node, registry.node_services(), disabled_plugins())

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, seconds))

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def _on_drain_signal(self, signum, frame) -> None:
        self.drain_requested = True
