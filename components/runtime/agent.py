"""The node agent behind ``strata node``: registers the node, heartbeats, and supervises the node's Celery
worker and one GPU-sharing service per device (:mod:`components.gpushare.service`), which runs the
attempts that got a fraction of a device.
"""

from __future__ import annotations

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

from components.runtime.client import ApiError, ControlPlaneClient

log = logging.getLogger("strata.node")

SHARING_ENV = "STRATA_GPUSHARE"  # "0"/"off": no GPU-sharing services; fractional jobs run in child processes
POLICY_ENV = "STRATA_GPUSHARE_POLICY"
SERVICE_BACKOFF_MAX_S = 30.0
SERVICE_CALL_TIMEOUT_S = 2.0


def sharing_enabled() -> bool:
    return os.environ.get(SHARING_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


class DeviceServices:
    """One GPU-sharing service process per device: started eagerly (an idle one is a small process that
    imports torch only on its first job), restarted with backoff when it dies, stopped with the agent.

    The services listen on unix sockets under ``state_dir/gpushare`` (or a short temporary directory when
    that path is too long for a socket), authenticated with a random key kept in a 0600 file there."""

    def __init__(self, state_dir: Path, devices: list, policy: str | None = None):
        import secrets
        import tempfile

        self.devices = devices
        self.policy = policy or os.environ.get(POLICY_ENV, "fair")
        self.directory = state_dir / "gpushare"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        self.socket_dir = self.directory
        if len(str(self.directory / "device-999.sock")) > 100:  # AF_UNIX paths are limited to 108 bytes
            self.socket_dir = Path(tempfile.mkdtemp(prefix="strata-gpushare-"))
        self.authkey_file = self.directory / "authkey"
        self.authkey_file.write_text(secrets.token_hex(32))
        self.authkey_file.chmod(0o600)
        self.processes: dict[int, subprocess.Popen] = {}
        self.failures: dict[int, int] = {}
        self.next_start: dict[int, float] = {}
        self.cursors: dict[int, float] = {}
        self.applied: dict[int, str] = {}  # the policy each running service was last given

    def config(self) -> dict:
        return {"socket_dir": str(self.socket_dir), "authkey_file": str(self.authkey_file)}

    def _socket(self, index: int) -> str:
        from components.gpushare.service import socket_path

        return socket_path(self.socket_dir, index)

    def start(self, device) -> None:
        from components.runtime.worker import _set_parent_death_signal

        command = [sys.executable, "-m", "components.gpushare.service", "--device-index", str(device.index),
                   "--kind", "cuda" if device.kind == "cuda" else "virtual", "--memory", str(device.memory_total),
                   "--socket", self._socket(device.index), "--authkey-file", str(self.authkey_file),
                   "--policy", self.policy]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("STRATA_NODE_CONFIG", None)
        self.processes[device.index] = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                                        preexec_fn=_set_parent_death_signal)
        self.applied[device.index] = self.policy
        self.cursors.setdefault(device.index, time.time())
        log.info("GPU-sharing service for device %d started (pid %d, policy %s)", device.index,
                 self.processes[device.index].pid, self.policy)

    def start_all(self) -> None:
        for device in self.devices:
            self.start(device)

    def check(self) -> None:
        """Restart services that died, with exponential backoff per device."""
        now = time.monotonic()
        for device in self.devices:
            process = self.processes.get(device.index)
            if process is None or process.poll() is None:
                continue
            if device.index not in self.next_start:
                failures = self.failures.get(device.index, 0) + 1
                self.failures[device.index] = failures
                delay = min(SERVICE_BACKOFF_MAX_S, 0.5 * 2 ** (failures - 1))
                self.next_start[device.index] = now + delay
                log.error("GPU-sharing service of device %d exited with %s; restarting in %.1f s", device.index,
                          process.returncode, delay)
            if now >= self.next_start[device.index]:
                del self.next_start[device.index]
                self.start(device)

    def call(self, index: int, message: dict) -> dict | None:
        from components.gpushare.service import call, read_authkey

        process = self.processes.get(index)
        if process is None or process.poll() is not None:
            return None
        try:
            return call(self._socket(index), read_authkey(self.authkey_file), message, SERVICE_CALL_TIMEOUT_S)
        except (OSError, EOFError, TimeoutError) as error:
            log.debug("GPU-sharing service of device %d did not answer %s: %s", index, message.get("op"), error)
            return None

    def set_policy(self, policy: str) -> None:
        self.policy = policy
        for index in list(self.processes):
            if self.applied.get(index) != policy:
                reply = self.call(index, {"op": "policy", "policy": policy})
                if reply and reply.get("ok"):
                    self.applied[index] = policy
                    log.info("device %d now shares with policy %s", index, policy)
                elif reply:
                    log.warning("device %d refused policy %r: %s", index, policy, reply.get("reason"))
                    self.applied[index] = policy  # do not ask again every beat

    def report(self) -> list[dict]:
        """The heartbeat's ``sharing`` entries: one per service that answered, slices since the last beat."""
        from components.gpushare.service import SLICE_LIMIT

        entries = []
        for index in sorted(self.processes):
            reply = self.call(index, {"op": "report", "since": self.cursors.get(index, 0.0), "limit": SLICE_LIMIT})
            if reply and reply.get("ok"):
                self.cursors[index] = reply["cursor"]
                entries.append(reply["sharing"])
        return entries

    def stop_all(self, timeout: float = 15.0) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.socket_dir != self.directory:
            import shutil

            shutil.rmtree(self.socket_dir, ignore_errors=True)


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


class NodeAgent:
    def __init__(self, options: NodeOptions):
        self.options = options
        self.client = ControlPlaneClient(options.server, options.token, retries=2, timeout=15)
        self.state_dir = Path(options.state_dir).expanduser().resolve()
        (self.state_dir / "running").mkdir(parents=True, exist_ok=True)
        self.worker: subprocess.Popen | None = None
        self.registration: dict = {}
        self.stopping = False
        from components.runtime.devices import detect_devices

        self.devices = detect_devices(options.virtual_gpus, options.virtual_gpu_memory)
        self.services: DeviceServices | None = None

    # -- registration --------------------------------------------------------------------------------------
    def register(self, wait: float = 120.0) -> dict:
        body = {
            "name": self.options.name, "hostname": socket.gethostname(), "address": self.options.address,
            "labels": {k: str(v) for k, v in self.options.labels.items()},
            "devices": [{"index": d.index, "kind": d.kind, "name": d.name, "memory_total": d.memory_total}
                        for d in self.devices],
            "info": {"python": sys.version.split()[0], "pid": os.getpid()},
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
        log.info("registered node %s (%s) with %d %s device(s)", self.options.name, self.registration["node"],
                 len(self.devices), "virtual" if all(d.virtual for d in self.devices) else "CUDA")
        return self.registration

    # -- the Celery worker ---------------------------------------------------------------------------------
    def _worker_config(self) -> Path:
        path = self.state_dir / "worker.json"
        config = {"server": self.options.server, "node_token": self.options.token,
                  "node": self.registration["node"], "state_dir": str(self.state_dir),
                  "broker_url": self.options.broker_url or self.registration["broker_url"],
                  "broker_prefix": self.registration.get("broker_prefix"),
                  "gpushare": self.services.config() if self.services is not None else None}
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def start_worker(self) -> None:
        for stale in (self.state_dir / "running").glob("*.json"):
            stale.unlink(missing_ok=True)
        # Fractional jobs run inside a device's sharing service, so a device may carry several attempts at
        # once (four 0.25-GPU jobs, say): four slots per device keep them from queueing on the node.
        slots = self.options.slots or max(2, 4 * len(self.devices))
        env = {**os.environ, "STRATA_NODE_CONFIG": str(self._worker_config())}
        command = [sys.executable, "-m", "celery", "-A", "components.runtime.worker", "worker",
                   "-Q", self.registration["queue"], "-n", f"{self.options.name}@%h", "--concurrency", str(slots),
                   "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat",
                   "--loglevel", "WARNING"]
        from components.runtime.worker import _set_parent_death_signal

        self.worker = subprocess.Popen(command, env=env, preexec_fn=_set_parent_death_signal)
        log.info("worker started on queue %s with %d slots (pid %d)", self.registration["queue"], slots,
                 self.worker.pid)

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

    def heartbeat(self) -> dict:
        from components.runtime.devices import sample_devices

        running = self.running()
        pids: dict[int, list[int]] = {}
        for by_device in running.values():
            for index, device_pids in by_device.items():
                pids.setdefault(index, []).extend(device_pids)
        samples = sample_devices(self.devices, pids)
        body = {
            "node": self.registration["node"], "session": self.registration["session"],
            "samples": [{"index": s["index"], "utilization": s["utilization"], "memory_used": s["memory_used"]}
                        for s in samples],
            "attempts": list(running),
        }
        if self.services is not None:
            body["sharing"] = self.services.report()
        try:
            answer = self.client.post("node/heartbeat/", body)
        except ApiError as error:
            if error.status != 400 or "sharing" not in body:
                raise
            # A sharing report the control plane refuses must not cost the node its lease.
            log.warning("the control plane refused the sharing report (%s); heartbeat sent without it",
                        error.message)
            del body["sharing"]
            answer = self.client.post("node/heartbeat/", body)
        policy = (answer or {}).get("sharing_policy")
        if policy and self.services is not None:
            self.services.set_policy(str(policy))
        return answer

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.register()
        if sharing_enabled():
            self.services = DeviceServices(self.state_dir, self.devices)
            self.services.start_all()
        self.start_worker()
        interval = float(self.registration.get("heartbeat_seconds", 3.0))
        try:
            while not self.stopping:
                try:
                    self.heartbeat()
                except ApiError as error:
                    if error.status == 409:  # our session was replaced or expired: start a new one
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
            self.stop_worker()
            if self.services is not None:
                self.services.stop_all()
        return 0

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, seconds))

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True
