"""The node's Celery worker: runs each dispatched attempt in child processes it can stop and kill.

Started by the node agent (``strata node``) with ``STRATA_NODE_CONFIG`` pointing at a JSON file holding
the control-plane URL, the node token, the node id and the broker URL. Consumes only the node's own queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from celery import Celery

from components.runtime.broker import COMMON_CELERY_SETTINGS, celery_broker_options
from components.runtime.client import ApiError, ControlPlaneClient, storable_text

log = logging.getLogger("strata.node.worker")
STOP_GRACE_SECONDS = float(os.environ.get("STRATA_STOP_GRACE_SECONDS", "10"))
POLL_SECONDS = float(os.environ.get("STRATA_ATTEMPT_POLL_SECONDS", "1.0"))
# How long a shared attempt waits for its device service to listen (it may be starting or restarting).
SERVICE_CONNECT_SECONDS = float(os.environ.get("STRATA_GPUSHARE_CONNECT_SECONDS", "30"))
SERVICE_ACK_SECONDS = 120.0  # the first job of a service imports torch and builds the executor
# The ``finish`` outcome of an attempt whose GPU-sharing service died under it: the control plane requeues
# the job without counting a failure, as for a lost node (up to a limit; see jobs.services.attempt_finish).
SERVICE_LOST = "service_lost"
# Kinds whose fractional attempts run inside their device's GPU-sharing service.
SHARED_KINDS = ("train", "serve")


def load_config() -> dict:
    path = os.environ.get("STRATA_NODE_CONFIG")
    if not path:
        return {}
    return json.loads(Path(path).read_text())


CONFIG = load_config()
app = Celery("strata-node")
app.conf.update(**COMMON_CELERY_SETTINGS, **celery_broker_options(CONFIG.get("broker_url", "memory://"), CONFIG.get("broker_prefix")))


def _set_parent_death_signal() -> None:
    """Linux: SIGKILL this child if the worker process that started it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class AttemptRunner:
    """Runs the ranks of one attempt that live on this node, and reports how they ended."""

    def __init__(self, config: dict, attempt_id: str, token: str):
        self.config = config
        self.attempt_id = attempt_id
        self.token = token
        self.client = ControlPlaneClient(config["server"], config["node_token"], retries=5)
        self.children: list[tuple[dict, subprocess.Popen]] = []
        self.tail: deque[str] = deque(maxlen=20)
        self.pending_logs: list[dict] = []
        self.logs_lock = threading.Lock()
        self.running_file = Path(config["state_dir"]) / "running" / f"{attempt_id}.json"
        self.service = None  # the connection to the device service running this attempt, when shared

    # -- shared devices: the GPU-sharing service ------------------------------------------------------------
    def shared_allocation(self, claim: dict) -> dict | None:
        """The device of a ``train`` or ``serve`` attempt that gets a fraction of one device on this node, or
        None.

        Such an attempt runs inside that device's GPU-sharing service (components.gpushare.service), which
        interleaves it with the device's other fractional jobs; everything else runs in child processes."""
        sharing = self.config.get("gpushare") or {}
        if (not sharing.get("socket_dir") or claim.get("kind") not in SHARED_KINDS
                or int(claim.get("world_size", 1)) != 1):
            return None
        mine = [a for a in claim["allocations"] if a["node"] == self.config["node"]]
        if len(mine) != 1 or not mine[0].get("device"):
            return None
        device = mine[0]["device"]
        return device if float(device.get("share", 1.0)) < 1.0 else None

    def _connect_service(self, index: int):
        from components.gpushare.service import connect, read_authkey, socket_path

        sharing = self.config["gpushare"]
        path = socket_path(sharing["socket_dir"], index)
        deadline = time.monotonic() + SERVICE_CONNECT_SECONDS
        while True:
            try:
                return connect(path, read_authkey(sharing["authkey_file"]))
            except (OSError, EOFError) as error:
                if time.monotonic() > deadline:
                    log.warning("no GPU-sharing service on device %s (%s)", index, error)
                    return None
                time.sleep(0.25)

    def start_shared(self, claim: dict, device: dict) -> bool:
        """Hand the attempt to its device's service. False when it must run in a child process instead
        (no service, or the service declined the job); raises when the service took it but did not answer."""
        conn = self._connect_service(int(device["index"]))
        if conn is None:
            self._note(f"device {device['index']} has no GPU-sharing service; running in a child process")
            return False
        payload = {**claim, "server": self.config["server"], "node_token": self.config["node_token"],
                   "node": self.config["node"], "fencing_token": self.token, "rank": 0, "device": device}
        try:
            conn.send({"op": "run", "payload": payload})
            if not conn.poll(SERVICE_ACK_SECONDS):
                raise TimeoutError(f"the GPU-sharing service did not answer in {SERVICE_ACK_SECONDS:g} s")
            reply = conn.recv()
        except BaseException:
            conn.close()
            raise
        if not reply.get("ok"):
            conn.close()
            self._note(f"not shared: {reply.get('reason')}; running in a child process")
            return False
        self.service = conn
        self.running_file.parent.mkdir(parents=True, exist_ok=True)
        self.running_file.write_text(json.dumps({"attempt": self.attempt_id, "shared": True,
                                                 "pids": {str(device["index"]): [int(reply["pid"])]}}))
        admission = reply.get("admission") or {}
        if admission.get("status") == "waiting":
            self._note(f"waiting for memory in the GPU-sharing service of device {device['index']} "
                       f"(queue position {admission.get('position')})")
        return True

    def _note(self, message: str) -> None:
        log.info("attempt %s: %s", self.attempt_id, message)
        with self.logs_lock:
            self.pending_logs.append({"level": "info", "message": message})

    def _send_service(self, message: dict) -> None:
        try:
            self.service.send(message)
        except (OSError, EOFError, ValueError):
            pass  # the service is gone: the receive side reports it

    def supervise_shared(self, time_limit: float) -> tuple[str, str]:
        """Wait for the service to end the attempt; stop it on request or at the time limit. Mirrors
        :meth:`supervise`: a stop becomes ``cancel`` (checkpoint at the next iteration boundary), then, past
        the grace period, a hard cancel; past twice that the attempt is given up as failed. When the service
        dies under the attempt (the connection breaks), the outcome is ``service_lost``."""
        started = time.monotonic()
        stop_sent_at = None
        hard_sent = False
        stop_reason = ""
        next_poll = 0.0
        done = None
        died = ""
        lost = ""  # the service died under the attempt: the control plane requeues it without a failure
        while done is None:
            now = time.monotonic()
            if stop_sent_at is None:
                stop_reason, next_poll = self._stop_due(now - started, time_limit, next_poll)
                if stop_reason:
                    self._send_service({"op": "cancel", "attempt": self.attempt_id})
                    stop_sent_at = now
            elif not hard_sent and now - stop_sent_at > STOP_GRACE_SECONDS:
                self._send_service({"op": "cancel", "attempt": self.attempt_id, "hard": True})
                hard_sent = True
            elif now - stop_sent_at > 3 * STOP_GRACE_SECONDS:
                died = "the GPU-sharing service did not stop the attempt"
                break
            try:
                if self.service.poll(0.05):
                    message = self.service.recv()
                    if message.get("event") == "done" and message.get("attempt") == self.attempt_id:
                        done = message
            except (EOFError, OSError) as error:  # ConnectionError is an OSError
                lost = f"the GPU-sharing service died mid-attempt ({error.__class__.__name__})"
                break
        with contextlib.suppress(OSError):
            self.service.close()
        self._poll()
        if stop_reason == "time_limit":
            return "time_limit", f"time limit of {time_limit:g} s exceeded"
        if stop_reason:
            return "failed", "stopped at the control plane's request"
        if died:
            return "failed", died
        if lost:
            return SERVICE_LOST, lost
        if done.get("lost"):
            return SERVICE_LOST, f"the GPU-sharing service crashed under the attempt: {done.get('error') or ''}"[:500]
        state = done["state"]
        if state == "succeeded":
            return "succeeded", ""
        if state == "stopped":  # the attempt's own context was told to stop (e.g. by a report answer)
            return "failed", "stopped at the control plane's request"
        if state == "cancelled":
            return "failed", "dropped by the GPU-sharing service"
        detail = next((line for line in reversed((done.get("error") or "").splitlines()) if line.strip()), "")
        return "failed", f"failed in the GPU-sharing service: {detail or state}"[:500]

    def _auth(self) -> dict:
        return {"node": self.config["node"], "token": self.token}

    def _path(self, suffix: str) -> str:
        return f"node/attempts/{self.attempt_id}/{suffix}"

    def claim(self) -> dict | None:
        try:
            return self.client.post(self._path("claim/"), self._auth())
        except ApiError as error:
            if error.status in (404, 409):
                log.info("attempt %s is no longer runnable: %s", self.attempt_id, error)
                return None
            raise

    def _pump(self, stream, rank: int) -> None:
        for line in iter(stream.readline, ""):
            line = line.rstrip("\n")
            self.tail.append(line)
            with self.logs_lock:
                self.pending_logs.append({"level": "stdout", "message": storable_text(f"[rank {rank}] {line}")})
        stream.close()

    def start(self, claim: dict) -> None:
        mine = [a for a in claim["allocations"] if a["node"] == self.config["node"]]
        ranks = sorted({a["rank"] for a in mine}) or [0]
        for rank in ranks:
            devices = [a["device"] for a in mine if a["rank"] == rank]
            device = devices[0] if devices else None
            env = dict(os.environ)
            env.pop("STRATA_NODE_CONFIG", None)
            env.update({"RANK": str(rank), "WORLD_SIZE": str(claim["world_size"]), "PYTHONUNBUFFERED": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(20000 + int(self.attempt_id[:4], 16) % 20000)})
            cuda = [str(d["index"]) for d in devices if d["kind"] == "cuda"]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(cuda) if cuda else ""
            payload = {**claim, "server": self.config["server"], "node_token": self.config["node_token"],
                       "node": self.config["node"], "fencing_token": self.token, "rank": rank, "device": device}
            child = subprocess.Popen([sys.executable, "-m", "components.runtime.child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     preexec_fn=_set_parent_death_signal)
            child.stdin.write(json.dumps(payload))
            child.stdin.close()
            threading.Thread(target=self._pump, args=(child.stdout, rank), daemon=True).start()
            self.children.append((device, child))
        self.running_file.parent.mkdir(parents=True, exist_ok=True)
        pids: dict[str, list[int]] = {}
        for device, child in self.children:
            if device is not None:
                pids.setdefault(str(device["index"]), []).append(child.pid)
        self.running_file.write_text(json.dumps({"attempt": self.attempt_id, "pids": pids}))

    def _poll(self) -> bool:
        """Send buffered output; return True if the control plane wants the attempt stopped."""
        with self.logs_lock:
            logs, self.pending_logs = self.pending_logs, []
        try:
            answer = self.client.post(self._path("report/"), {**self._auth(), "logs": logs}, retries=1)
        except ApiError as error:
            if error.status == 409:
                return True
            if error.status == 400:  # the control plane will never take these: drop them, keep running
                log.warning("attempt %s: report refused, %d log lines dropped: %s", self.attempt_id, len(logs), error)
                return False
            with self.logs_lock:
                self.pending_logs[:0] = logs
            return False
        return bool(answer and answer.get("stop"))

    def _stop_due(self, elapsed: float, time_limit: float, next_poll: float) -> tuple[str, float]:
        """("time_limit" | "stopped" | "", when to poll the control plane next) for a running attempt."""
        if elapsed > time_limit:
            return "time_limit", next_poll
        now = time.monotonic()
        if now >= next_poll:
            next_poll = now + POLL_SECONDS
            if self._poll():
                return "stopped", next_poll
        return "", next_poll

    def _signal_all(self, sig: int) -> None:
        for _, child in self.children:
            if child.poll() is None:
                try:
                    os.kill(child.pid, sig)
                except ProcessLookupError:
                    pass

    def supervise(self, time_limit: float) -> tuple[str, str]:
        """Wait for the children; stop them on request or at the time limit. Returns (outcome, reason)."""
        started = time.monotonic()
        stop_sent_at = None
        stop_reason = ""
        next_poll = 0.0
        while any(child.poll() is None for _, child in self.children):
            now = time.monotonic()
            if stop_sent_at is None:
                stop_reason, next_poll = self._stop_due(now - started, time_limit, next_poll)
                if stop_reason:
                    self._signal_all(signal.SIGTERM)
                    stop_sent_at = now
            elif now - stop_sent_at > STOP_GRACE_SECONDS:
                self._signal_all(signal.SIGKILL)
            time.sleep(0.05)
        self._poll()
        codes = [child.returncode for _, child in self.children]
        if stop_reason == "time_limit":
            return "time_limit", f"time limit of {time_limit:g} s exceeded"
        if stop_reason:
            return "failed", "stopped at the control plane's request"
        if all(code == 0 for code in codes):
            return "succeeded", ""
        bad = next(code for code in codes if code != 0)
        detail = next((line for line in reversed(self.tail) if line.strip()), "")
        if bad < 0:
            return "failed", f"killed by signal {-bad}. {detail}"[:500]
        return "failed", f"exit code {bad}: {detail}"[:500]

    def finish(self, outcome: str, reason: str) -> None:
        try:
            self.client.post(self._path("finish/"), {**self._auth(), "outcome": outcome, "reason": reason})
        except ApiError as error:
            # Not retried from here: the lease reaper settles an attempt whose end could not be reported.
            log.warning("finish of %s not recorded: %s", self.attempt_id, error)
        finally:
            self.running_file.unlink(missing_ok=True)

    def kill_all(self) -> None:
        self._signal_all(signal.SIGKILL)
        if self.service is not None:
            self._send_service({"op": "cancel", "attempt": self.attempt_id, "hard": True})
            with contextlib.suppress(OSError):
                self.service.close()
        self.running_file.unlink(missing_ok=True)


@app.task(name="strata.node.run_attempt", acks_late=True, reject_on_worker_lost=True)
def run_attempt(attempt_id: str, token: str) -> str:
    runner = AttemptRunner(CONFIG, attempt_id, token)
    claim = runner.claim()
    if claim is None:
        return "stale"
    if claim["stop"]:
        runner.finish("failed", "stopped before it started")
        return "stopped"
    try:
        device = runner.shared_allocation(claim)
        if device is not None and runner.start_shared(claim, device):
            outcome, reason = runner.supervise_shared(float(claim["time_limit"]))
        else:
            runner.start(claim)
            outcome, reason = runner.supervise(float(claim["time_limit"]))
    except BaseException:
        runner.kill_all()
        raise
    runner.finish(outcome, reason)
    log.info("attempt %s ended: %s %s", attempt_id, outcome, reason)
    return outcome
