"""The node's Celery worker: runs each dispatched attempt in child processes it can stop and kill.

Started by the node agent (``strata node``) with ``STRATA_NODE_CONFIG`` pointing at a JSON file holding
the control-plane URL, the node token, the node id and the broker URL. Consumes only the node's own queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from celery import Celery

from components.runtime.client import transfers
from components.runtime.client.client import ApiError, ControlPlaneClient, storable_text
from components.runtime.contract.project import UserError, reads_data_sets, runs_user_code, uses_project
from components.runtime.contract.services import set_parent_death_signal
from components.runtime.node import sandbox
from components.runtime.node.project_cache import (
    Lease,
    Project,
    ProjectCache,
    fetch_data_sets,
    prepare_rank,
    remove_workdir,
)
from components.runtime.shared import protocol
from components.runtime.shared.broker import COMMON_CELERY_SETTINGS, celery_broker_options
from components.runtime.shared.protocol import End, HostAddress, finish_for

log = logging.getLogger("strata.node.worker")
STOP_GRACE_SECONDS = float(os.environ.get("STRATA_STOP_GRACE_SECONDS", "10"))
POLL_SECONDS = float(os.environ.get("STRATA_ATTEMPT_POLL_SECONDS", "1.0"))
# How long a hosted attempt waits for its host to listen (it may be starting or restarting).
SERVICE_CONNECT_SECONDS = float(os.environ.get("STRATA_HOST_CONNECT_SECONDS", "30"))
SERVICE_ACK_SECONDS = 120.0  # a host's first attempt may import torch and build its executor
# The ``finish`` outcome of an attempt whose host died under it: the control plane requeues the job without
# counting a failure, as for a lost node (up to a limit; see protocol.SERVICE_LOST).
SERVICE_LOST = protocol.SERVICE_LOST.name


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
    set_parent_death_signal(signal.SIGKILL)


def hostable(kind: str) -> bool:
    """Whether the component of ``kind`` may run inside a node service that hosts attempts (its class says so:
    :attr:`components.runtime.contract.component.Component.hostable`). Imports the component class, not its heavy parts."""
    from components.runtime.contract.registry import get_kind, import_path

    try:
        return bool(getattr(import_path(get_kind(kind).component), "hostable", False))
    except Exception as error:  # noqa: BLE001 - an unknown or broken kind: the child path reports it
        log.debug("kind %r cannot be hosted: %r", kind, error)
        return False


def elastic_ranks(kind: str) -> bool:
    """Whether ``kind``'s ranks are independent peers (``KindSpec.elastic_ranks``): one that fails costs only
    itself."""
    from components.runtime.contract.registry import get_kind

    try:
        return bool(getattr(get_kind(kind), "elastic_ranks", False))
    except Exception as error:  # noqa: BLE001 - an unknown kind: the child path reports it
        log.debug("kind %r: %r", kind, error)
        return False


class AttemptRunner:
    """Runs the ranks of one attempt that live on this node, and reports how they ended."""

    def __init__(self, config: dict, attempt_id: str, token: str):
        self.config = config
        self.attempt_id = attempt_id
        self.token = token
        self.client = ControlPlaneClient(config["server"], config["node_token"], retries=5)
        self.children: list[tuple[dict, subprocess.Popen]] = []
        self.ranks: list[int] = []  # the rank of each child
        self.tail: deque[str] = deque(maxlen=20)
        self.pending_logs: list[dict] = []
        self.logs_lock = threading.Lock()
        self.running_file = Path(config["state_dir"]) / "running" / f"{attempt_id}.json"
        self.service = None  # the connection to the node service hosting this attempt, when hosted
        self.host: HostAddress | None = None
        self.elastic = False  # set from the claim's kind (KindSpec.elastic_ranks) in start()
        self.projects: dict[int, Project] = {}  # a team's project, prepared per rank (prepare())
        self.data_leases: list[Lease] = []  # data sets an attempt without a project reads (prepare())
        # The node's sandbox for attempts that run a team's code ("bwrap" or "none": strata node --sandbox).
        self.sandbox_mode = config.get("sandbox") or "none"
        self.sandboxes: list[sandbox.Sandbox] = []

    # -- a team's project: the code bundle, the environment, the working directories ------------------------------
    def _ranks_here(self, claim: dict) -> list[int]:
        mine = [a for a in claim["allocations"] if a["node"] == self.config["node"]]
        return sorted({a["rank"] for a in mine}) or [0]

    def _download(self, suffix: str, target: Path, timeout: float = 600) -> None:
        if not transfers.download(self.client, self._path(suffix), self._auth(), target, timeout=timeout):
            raise ApiError(404, f"the control plane has no {suffix.rstrip('/')} for this attempt")

    def _download_code(self, target: Path) -> None:
        self._download("code/", target)

    def _download_data(self, digest: str, target: Path) -> None:
        self._download(f"data/{digest}/", target, timeout=3600)

    def prepare(self, claim: dict) -> None:
        """Fetch the job's code bundle and the data sets it reads and build its environment (once per node:
        cached), and make each rank's working directory. Raises :class:`~components.runtime.contract.project.UserError` for
        what retrying cannot fix (a failed build, a damaged bundle). The build's output goes to the job's log as it
        comes, and the last note says how long the preparation took."""
        if not uses_project(claim):
            if reads_data_sets(claim):  # a built-in workload over an uploaded data set: fetched, leased, no project
                started = time.monotonic()
                cache = ProjectCache(Path(self.config["state_dir"]))
                self.data_leases = list(fetch_data_sets(cache, claim, self._download_data, self._note).values())
                self._note(f"data sets ready in {time.monotonic() - started:.2f} s")
                self._poll_logs_only()
            return
        cache = ProjectCache(Path(self.config["state_dir"]))
        started = time.monotonic()
        wrap = self._build_wrap(claim) if self.sandbox_mode == "bwrap" else None
        for rank in self._ranks_here(claim):
            self.projects[rank] = prepare_rank(cache, claim, rank, download=self._download_code, note=self._note,
                                               download_data=self._download_data, wrap_build=wrap)
        self._note(f"project prepared in {time.monotonic() - started:.2f} s")
        self._poll_logs_only()

    def _poll_logs_only(self) -> None:
        """Send the notes so far (an environment build is long: its log should not wait for the run)."""
        with contextlib.suppress(Exception):
            self._poll()

    def cleanup(self) -> None:
        for box in self.sandboxes:
            box.cleanup()
        self.sandboxes.clear()
        state_dir = Path(self.config["state_dir"])
        for extra in (state_dir / "work").glob(f"{self.attempt_id}-*") if (state_dir / "work").is_dir() else ():
            if not any(extra == project.workdir.parent for project in self.projects.values()):
                shutil.rmtree(extra, ignore_errors=True)  # the attempt's shared /dev/shm, an entry point's home
        for rank, project in self.projects.items():
            project.release()
            with contextlib.suppress(OSError):
                remove_workdir(Path(self.config["state_dir"]), self.attempt_id, rank)
        self.projects.clear()
        for lease in self.data_leases:
            lease.release()
        self.data_leases.clear()

    # -- hosted attempts: a node service runs the attempt ---------------------------------------------------
    def find_host(self, claim: dict) -> HostAddress | None:
        """The node service that should host this attempt, or None (it runs in child processes).

        The attempt's component must be hostable, and one of the node's services must claim it
        (:meth:`components.runtime.contract.services.NodeService.host_for`: e.g. a device's sharing service takes a
        one-worker attempt that got a fraction of its device)."""
        from components.runtime.contract.services import find_host

        if not self.config.get("services") or not hostable(str(claim.get("kind"))):
            return None
        found = find_host(self.config["services"], claim, self.config["node"])
        return found[1] if found else None

    def _connect_host(self, host: HostAddress):
        deadline = time.monotonic() + SERVICE_CONNECT_SECONDS
        while True:
            try:
                return host.connect()
            except (OSError, EOFError) as error:
                if time.monotonic() > deadline:
                    log.warning("%s is not listening (%s)", host.label, error)
                    return None
                time.sleep(0.25)

    def start_hosted(self, claim: dict, host: HostAddress) -> bool:
        """Hand the attempt to its host. False when it must run in a child process instead (no host
        listening, or the host declined the attempt); raises when the host took it but did not answer."""
        conn = self._connect_host(host)
        if conn is None:
            self._note(f"{host.label} is not listening; running in a child process")
            return False
        device = self._device(claim)
        payload = {**claim, "server": self.config["server"], "node": self.config["node"],
                   "fencing_token": self.token, "rank": 0, "device": device}
        payload.pop("secrets", None)  # a shared host never runs a team's code, so it never needs them
        try:
            conn.send(protocol.run_message(payload))
            if not conn.poll(SERVICE_ACK_SECONDS):
                raise TimeoutError(f"{host.label} did not answer in {SERVICE_ACK_SECONDS:g} s")
            reply = conn.recv()
        except BaseException:
            conn.close()
            raise
        if not reply.get("ok"):
            conn.close()
            self._note(f"not shared: {reply.get('reason')}; running in a child process")
            return False
        self.service = conn
        self.host = host
        self.running_file.parent.mkdir(parents=True, exist_ok=True)
        pids = {str(device["index"]): [int(reply["pid"])]} if device else {}
        self.running_file.write_text(json.dumps({"attempt": self.attempt_id, "shared": True, "pids": pids}))
        admission = reply.get("admission") or {}
        if admission.get("status") == "waiting":
            self._note(f"waiting for memory in {host.label} (queue position {admission.get('position')})")
        return True

    def _device(self, claim: dict) -> dict | None:
        mine = [a for a in claim["allocations"] if a["node"] == self.config["node"]]
        return mine[0]["device"] if mine else None

    def _note(self, message: str) -> None:
        log.info("attempt %s: %s", self.attempt_id, message)
        with self.logs_lock:
            self.pending_logs.append({"level": "info", "message": message})

    def _send_service(self, message: dict) -> None:
        try:
            self.service.send(message)
        except (OSError, EOFError, ValueError):
            pass  # the host is gone: the receive side reports it

    def supervise_hosted(self, time_limit: float) -> tuple[str, str]:
        """Wait for the host to end the attempt; stop it on request or at the time limit. Mirrors
        :meth:`supervise`: a stop becomes ``cancel`` (checkpoint at the next step boundary), then, past the
        grace period, a hard cancel; past three times that the attempt is given up as failed. When the host
        dies under the attempt (the connection breaks), the outcome is ``service_lost``."""
        started = time.monotonic()
        stop_sent_at = None
        hard_sent = False
        stop_reason = ""
        next_poll = 0.0
        done = None
        end = End.FAILED
        detail = ""
        where = self.host.label if self.host is not None else ""
        while done is None:
            now = time.monotonic()
            if stop_sent_at is None:
                stop_reason, next_poll = self._stop_due(now - started, time_limit, next_poll)
                if stop_reason:
                    self._send_service(protocol.cancel_message(self.attempt_id))
                    stop_sent_at = now
            elif not hard_sent and now - stop_sent_at > STOP_GRACE_SECONDS:
                self._send_service(protocol.cancel_message(self.attempt_id, hard=True))
                hard_sent = True
            elif now - stop_sent_at > 3 * STOP_GRACE_SECONDS:
                detail = f"{where} did not stop the attempt"
                break
            try:
                if self.service.poll(0.05):
                    message = self.service.recv()
                    if message.get("event") == protocol.DONE_EVENT and message.get("attempt") == self.attempt_id:
                        done = message
            except (EOFError, OSError) as error:  # ConnectionError is an OSError
                end, detail = End.LOST, f"the connection broke ({error.__class__.__name__})"
                break
        with contextlib.suppress(OSError):
            self.service.close()
        self._poll()
        if done is None and end is not End.LOST:  # the host ignored the stop
            outcome, reason = finish_for(End.FAILED, stop_reason=stop_reason, time_limit=time_limit,
                                         detail=detail)
            return outcome.name, reason
        if done is not None:
            end = protocol.end_of_event(done)
            error = done.get("error") or ""
            if end is End.LOST:
                detail = error
            else:
                detail = next((line for line in reversed(error.splitlines()) if line.strip()), "")
        outcome, reason = finish_for(end, stop_reason=stop_reason, time_limit=time_limit, detail=detail,
                                     where=where)
        return outcome.name, reason

    def _auth(self) -> dict:
        return {"node": self.config["node"], "token": self.token}

    def _path(self, suffix: str) -> str:
        return f"node/attempts/{self.attempt_id}/{suffix}"

    def claim(self) -> dict | None:
        try:
            claim = self.client.post(self._path("claim/"), self._auth())
        except ApiError as error:
            if error.status in (404, 409):
                log.info("attempt %s is no longer runnable: %s", self.attempt_id, error)
                return None
            raise
        # Listed in the node's heartbeats from the claim on (its processes are added once they start): the
        # control plane ends a started attempt its node stops listing (cluster.services._reconcile_unreported).
        self.running_file.parent.mkdir(parents=True, exist_ok=True)
        self.running_file.write_text(json.dumps({"attempt": self.attempt_id, "pids": {}}))
        return claim

    def _pump(self, stream, rank: int) -> None:
        for line in iter(stream.readline, ""):
            line = line.rstrip("\n")
            self.tail.append(line)
            with self.logs_lock:
                self.pending_logs.append({"level": "stdout", "message": storable_text(f"[rank {rank}] {line}")})
        stream.close()

    def start(self, claim: dict) -> None:
        self.elastic = elastic_ranks(str(claim.get("kind")))
        mine = [a for a in claim["allocations"] if a["node"] == self.config["node"]]
        ranks = sorted({a["rank"] for a in mine}) or [0]
        for rank in ranks:
            # A rank that holds no GPU (gpus: 0) is listed with device None: it runs on the node's CPUs.
            devices = [a["device"] for a in mine if a["rank"] == rank and a.get("device")]
            device = devices[0] if devices else None
            # Never the node's or the control plane's credentials (the node token, the database's URL ...).
            env = sandbox.user_environment(dict(os.environ))
            # Where the ranks meet is not known here: rank 0 publishes it through the control plane
            # (components.runtime.node.gang.init_gang).
            env.update({"RANK": str(rank), "WORLD_SIZE": str(claim["world_size"]), "PYTHONUNBUFFERED": "1"})
            cuda = [str(d["index"]) for d in devices if d["kind"] == "cuda"]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(cuda) if cuda else ""
            project = self.projects.get(rank)
            if project is not None:
                env.update(project.env)
                env.update(self._torchrun_env(claim, mine, rank))
            # The team's secrets the job asked for (spec.environment.secrets), as environment variables.
            env.update({str(k): str(v) for k, v in (claim.get("secrets") or {}).items()})
            # ``device``: the rank's first device (what single-device code reads); ``devices``: all of them (a
            # rank given several whole GPUs sees every one, in the order CUDA_VISIBLE_DEVICES lists them). The
            # claim's attempt ``credential`` rides along: the child authenticates with it, never the node token.
            payload = {**claim, "server": self.config["server"], "node": self.config["node"],
                       "fencing_token": self.token, "rank": rank, "device": device,
                       "devices": devices, "node_address": self.config.get("address", "")}
            payload.pop("secrets", None)  # in the environment already, not in the payload too
            python, cwd = sys.executable, None
            if project is not None:
                # -P: the working directory is not put first on sys.path before the runtime's own packages are
                # imported (the child adds it after them).
                python, cwd = project.python, str(project.workdir)
                payload["workdir"] = str(project.workdir)
            argv, preexec = [python, "-P", "-m", "components.runtime.node.child"], _set_parent_death_signal
            box = self._sandbox(claim, rank, project, mine)
            if box is not None:
                env["HOME"] = str(box.cwd)
                argv, preexec = box.command(argv), box.preexec(_set_parent_death_signal)
            child = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=cwd, preexec_fn=preexec)
            child.stdin.write(json.dumps(payload))
            child.stdin.close()
            threading.Thread(target=self._pump, args=(child.stdout, rank), daemon=True).start()
            self.children.append((device, child))
            self.ranks.append(rank)
        self.running_file.parent.mkdir(parents=True, exist_ok=True)
        pids: dict[str, list[int]] = {}
        for device, child in self.children:
            if device is not None:
                pids.setdefault(str(device["index"]), []).append(child.pid)
        self.running_file.write_text(json.dumps({"attempt": self.attempt_id, "pids": pids}))

    def _hidden(self) -> list[Path]:
        """What a sandbox hides: the node's state, the agent's home (its ~/.strata client configuration) and the
        control plane's home on a one-machine cluster (strata up)."""
        hide = [Path(self.config["state_dir"]), Path.home()]
        if os.environ.get("STRATA_HOME"):
            hide.append(Path(os.environ["STRATA_HOME"]).expanduser())
        return hide

    def _build_wrap(self, claim: dict):
        """How the job's environment is built in the sandbox: the installer (and any requirement's build code)
        runs as the team's uid, writing only the environment being built, which goes back to the agent, read-only,
        once the installer ended."""
        uid = sandbox.team_uid(claim.get("team")) if os.geteuid() == 0 else None

        def wrap(command: list[str], target: Path, readable: Path | None):
            hidden = self._hidden()
            # Local files the install names (a wheel's path in `pip`, a find-links or index directory of the node's
            # pip settings), read-only, unless they lie in what stays hidden; the team's uid still needs the right
            # to read them.
            named = [arg for arg in command if arg.startswith("/")]
            for variable in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_INDEX_URL",
                             "UV_FIND_LINKS"):
                named += [v.removeprefix("file://") for v in os.environ.get(variable, "").split()
                          if v.startswith(("/", "file:///"))]
            local = [path for path in sandbox.readable_paths(named) if path != target
                     and not any(path.is_relative_to(h) for h in hidden) and path != Path("/")]
            local = [p for p in local if not any(p != q and p.is_relative_to(q) for q in local)]
            box = sandbox.Sandbox(bwrap=self.config.get("bwrap") or sandbox.find_bwrap() or "bwrap",
                                  hide=hidden, writable=[target],
                                  readable=([readable] if readable else []) + local, uid=uid, cwd=readable or target)
            box.prepare()

            def after() -> None:
                if uid is not None:
                    sandbox.chown_tree(target, os.geteuid())

            return box.command(command), box.preexec(_set_parent_death_signal), after

        return wrap

    def _sandbox(self, claim: dict, rank: int, project: Project | None, mine: list[dict]) -> sandbox.Sandbox | None:
        """The sandbox this rank runs in, prepared (its directories given to the team's uid), or None: the node's
        sandbox is off, or the attempt runs no code of the team's (a built-in workload)."""
        if self.sandbox_mode != "bwrap" or not runs_user_code(claim):
            return None
        state_dir = Path(self.config["state_dir"])
        hide = self._hidden()
        shm = state_dir / "work" / f"{self.attempt_id}-shm"  # the attempt's ranks on this node share it
        shm.mkdir(parents=True, exist_ok=True)
        if project is not None:
            work = project.workdir.parent
            home = work / "home"
            home.mkdir(exist_ok=True)
            writable, readable = [work], sandbox.readable_paths(lease.path for lease in project.leases)
        else:  # an entry point of the node's own packages: a private home, and the data sets it reads
            home = state_dir / "work" / f"{self.attempt_id}-{rank}" / "home"
            home.mkdir(parents=True, exist_ok=True)
            writable, readable = [home.parent], sandbox.readable_paths(lease.path for lease in self.data_leases)
        memory = [a.get("memory") for a in mine if a["rank"] == rank and a.get("device") is None and a.get("memory")]
        cgroup_root = sandbox.cgroup_root()
        box = sandbox.Sandbox(
            bwrap=self.config.get("bwrap") or sandbox.find_bwrap() or "bwrap", hide=hide, writable=writable,
            readable=readable, shm=shm, uid=sandbox.team_uid(claim.get("team")) if os.geteuid() == 0 else None,
            memory=int(memory[0]) if memory else None, cwd=project.workdir if project is not None else home,
            cgroup=cgroup_root / f"attempt-{self.attempt_id}-{rank}" if cgroup_root is not None else None)
        box.prepare()
        self.sandboxes.append(box)
        return box

    @staticmethod
    def _torchrun_env(claim: dict, mine: list[dict], rank: int) -> dict[str, str]:
        """What torchrun would set for ``rank`` beside RANK and WORLD_SIZE: its place among this node's ranks and
        this node's place among the gang's nodes (ordered by their first rank). On CUDA, every local rank sees
        the node's granted devices in local-rank order, so ``cuda:LOCAL_RANK`` is its own."""
        local = sorted({a["rank"] for a in mine}) or [0]
        first_rank: dict[str, int] = {}
        for allocation in claim["allocations"]:
            node = allocation["node"]
            first_rank[node] = min(first_rank.get(node, allocation["rank"]), allocation["rank"])
        nodes = sorted(first_rank, key=first_rank.get)
        here = mine[0]["node"] if mine else None
        group = nodes.index(here) if here in nodes else 0
        env = {"LOCAL_RANK": str(local.index(rank) if rank in local else 0), "LOCAL_WORLD_SIZE": str(len(local)),
               "GROUP_RANK": str(group), "NODE_RANK": str(group)}
        per_rank = {r: [a["device"] for a in mine if a["rank"] == r and a.get("device")] for r in local}
        if len(local) > 1 and all(len(d) == 1 and d[0]["kind"] == "cuda" for d in per_rank.values()):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(per_rank[r][0]["index"]) for r in local)
        return env

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
                if self.sandboxes:  # the rank's own process, inside its bwrap (SIGKILL takes the whole sandbox)
                    sandbox.signal_tree(child.pid, sig)
                    continue
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
        first_failure: tuple[int, int] | None = None  # (rank, exit code) of the first rank to fail
        # A kind whose ranks are independent peers (KindSpec.elastic_ranks) loses only the rank that failed.
        elastic = self.elastic
        # Poll every child (a list, not a short-circuiting generator): a rank that died behind a running one
        # must be seen at once, so that its siblings are stopped.
        while any([child.poll() is None for _, child in self.children]):  # noqa: C419
            now = time.monotonic()
            if first_failure is None:
                for (_, child), rank in zip(self.children, self.ranks, strict=True):
                    if child.returncode not in (None, 0):
                        first_failure = (rank, child.returncode)
                        break
                if first_failure is not None and stop_sent_at is None and len(self.children) > 1 and not elastic:
                    # One rank of a gang died: the others would wait for it in their next collective. Stop
                    # them now, so the attempt ends (and is retried from its checkpoint) instead of hanging.
                    self._note(f"rank {first_failure[0]} exited with code {first_failure[1]}; stopping the "
                               "attempt's other ranks")
                    self._signal_all(signal.SIGTERM)
                    stop_sent_at = now
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
        if stop_reason or all(code == 0 for code in codes) or (elastic and any(code == 0 for code in codes)):
            if elastic and first_failure is not None:
                self._note(f"rank {first_failure[0]} exited with code {first_failure[1]}; the other ranks carried on")
            outcome, reason = finish_for(End.SUCCEEDED, stop_reason=stop_reason, time_limit=time_limit)
            return outcome.name, reason
        if first_failure is None:
            first_failure = next((rank, code) for rank, code in zip(self.ranks, codes, strict=True) if code != 0)
        rank, bad = first_failure
        if self.sandboxes and bad > 128 and bad - 128 in signal.valid_signals():
            bad = -(bad - 128)  # bwrap exits with 128 + N when its command was killed by signal N
        who = f"rank {rank} " if len(self.children) > 1 else ""
        detail = next((line for line in reversed(self.tail) if line.strip()), "")
        if bad < 0:
            return protocol.FAILED.name, f"{who}killed by signal {-bad}. {detail}"[:500]
        if bad == protocol.EXIT_USER_ERROR:  # the job's own deterministic error: fails once, not retried
            return protocol.USER_ERROR.name, f"{who}{detail.removeprefix('UserError: ')}"[:500]
        return protocol.FAILED.name, f"{who}exit code {bad}: {detail}"[:500]

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
        runner.finish(protocol.FAILED.name, "stopped before it started")
        return "stopped"
    try:
        try:
            runner.prepare(claim)
        except UserError as error:  # a failed build, a damaged bundle: fails once, never retried
            runner.cleanup()
            runner.finish(protocol.USER_ERROR.name, str(error)[:500])
            return protocol.USER_ERROR.name
        except Exception as error:  # noqa: BLE001 - the network, the disk: the attempt fails and is retried
            log.exception("attempt %s: the project could not be prepared", attempt_id)
            runner.cleanup()
            runner.finish(protocol.FAILED.name, f"the project could not be prepared on this node: {error}"[:500])
            return protocol.FAILED.name
        # A team's own code runs in its own (sandboxed) processes, never in a node service shared with others.
        host = runner.find_host(claim) if not runs_user_code(claim) else None
        if host is not None and runner.start_hosted(claim, host):
            outcome, reason = runner.supervise_hosted(float(claim["time_limit"]))
        else:
            runner.start(claim)
            outcome, reason = runner.supervise(float(claim["time_limit"]))
    except BaseException:
        runner.kill_all()
        runner.cleanup()
        raise
    runner.cleanup()
    runner.finish(outcome, reason)
    log.info("attempt %s ended: %s %s", attempt_id, outcome, reason)
    return outcome
