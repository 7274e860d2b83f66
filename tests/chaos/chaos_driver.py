"""The chaos driver: a stream of real jobs of every kind on a multi-host cluster (network namespaces, PostgreSQL,
Redis), faults injected while they run, every step written down, and the history checked at the end.

One :class:`ChaosRun` does, in order:

1. starts the control plane on host ``cp`` (its own redis-server with an append-only file, ``strata server``,
   ``strata scheduler``, PostgreSQL through the machine's Unix socket) with the operation history on
   (``STRATA_HISTORY_LOG``), and a ``strata node`` with two virtual GPUs on each node host;
2. trains the two models the later jobs need (digits for serving, DLRM for compression);
3. submits the stream (``Scale.rounds`` times): train jobs short and long (checkpointed), a tuning sweep, a
   2-worker DDP job, a decentralized (hivemind) swarm, an embedding compression, a serve deployment with two
   replicas called continuously by a client, and short jobs cancelled just as they complete;
4. meanwhile injects the faults (:data:`FAULTS`), each once per round, each where it hurts (a host running a job,
   the replica being called...);
5. cancels what runs forever (the deployment), waits until every job the control plane recorded has ended, reads
   each one's record and the teams' billed GPU-seconds from the API, and checks the history
   (:func:`benchmarks.core.history_check.check`).

The client's history (``client.jsonl``) holds what the driver asked and was told; the control plane's
(``history.jsonl``) what it committed. Every API call of the driver retries through faults (same
Idempotency-Key for a submit) and records each 5xx or connection error it met.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from benchmarks.core.history_check import TERMINAL, Report, check, read_lines
from benchmarks.core.hosts import HostCluster, Hosts

FAULTS = ("sigkill-node-worker", "kill-sharing-service", "broker-restart", "postgres-connections-killed",
          "kill-serving-replica", "kill-hivemind-peer", "sigstop-node", "broker-wipe", "cancel-at-completion")


@dataclass
class Scale:
    name: str
    node_hosts: tuple[str, ...]
    rounds: int
    short_jobs: int  # short train jobs per round
    long_jobs: int  # long, checkpointed train jobs per round
    cancels: int  # jobs cancelled as they complete, per round
    deadline_s: float  # for the whole run to end


SCALES = {
    # CI (.ci/run): every kind and every fault once.
    "bounded": Scale("bounded", ("n1", "n2"), rounds=1, short_jobs=3, long_jobs=2, cancels=3, deadline_s=900),
    # make chaos: three node hosts, every fault three times over a longer stream.
    "full": Scale("full", ("n1", "n2", "n3"), rounds=3, short_jobs=6, long_jobs=3, cancels=4, deadline_s=2400),
}


def train(name: str, epochs: int, *, gpus: float = 0.5, max_attempts: int = 3, **spec: Any) -> dict:
    return {"name": name, "kind": "train", "max_attempts": max_attempts, "resources": {"gpus": gpus},
            "spec": {"workload": "mlp-digits", "epochs": epochs, "batch_size": 32, "log_every": 20, **spec}}


def long_train(name: str) -> dict:
    # A few thousand steps, checkpointed every 250: long enough to be hit by a fault, resumed on a retry.
    return train(name, 20, batch_size=16, log_every=100, checkpoint_every=250)


def sweep(name: str) -> dict:
    return {"name": name, "kind": "tune", "max_attempts": 3, "resources": {"gpus": 1},
            "spec": {"space": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.05}},
                     "metric": "test_accuracy", "mode": "max", "trials": 2, "max_iterations": 2, "packing": 2,
                     "seed": 5, "searcher": {"name": "random"},
                     "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}",
                                                             "batch_size": 32}}}}


def ddp(name: str) -> dict:
    body = train(name, 3, gpus=1)
    body["resources"]["workers"] = 2
    body["spec"]["distributed"] = {"strategy": "ddp"}
    return body


def swarm(name: str) -> dict:
    return {"name": name, "kind": "decentralized-train", "max_attempts": 3, "resources": {"gpus": 0.25, "workers": 2},
            "spec": {"model": "tiny", "steps": 300, "batch_size": 8, "eval_every": 50, "peers": {"min": 2, "max": 4},
                     "averaging": {"period_s": 2.0}}}


def compress(name: str, source: str) -> dict:
    return {"name": name, "kind": "compress-embeddings", "max_attempts": 3, "resources": {"gpus": 0.5},
            "spec": {"source": {"job": source}, "ratio": 4, "finetune": {"steps": 10}}}


def serve(name: str, model: str) -> dict:
    return {"name": name, "kind": "serve", "max_attempts": 5, "resources": {"gpus": 0.5},
            "spec": {"model": {"job": model}, "replicas": 2, "slo_ms": 5000}}


@dataclass
class ChaosRun:
    home: Path
    scale: Scale
    database: str = "postgres"
    seed: int = 18
    hosts: Hosts | None = None
    cluster: HostCluster | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)  # name -> id of what the driver submitted
    _log_lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the client's history --------------------------------------------------------------------------------
    @property
    def client_log(self) -> Path:
        return self.home / "client.jsonl"

    @property
    def server_log(self) -> Path:
        return self.home / "history.jsonl"

    def note(self, op: str, **fields: Any) -> None:
        line = json.dumps({"op": op, "time": time.time(), **fields}, default=str)
        with self._log_lock, self.client_log.open("a") as out:
            out.write(line + "\n")

    def say(self, message: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)

    # -- the cluster -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.hosts = Hosts(["cp", *self.scale.node_hosts])
        self.cluster = HostCluster(self.hosts, self.home, database=self.database, persistent_broker=True,
                                   extra_env={"STRATA_HISTORY_LOG": str(self.server_log),
                                              "STRATA_DISPATCH_REPUBLISH_SECONDS": "5",
                                              "STRATA_CLAIM_TIMEOUT_SECONDS": "20"})
        self.cluster.start()
        for host in self.scale.node_hosts:
            self.cluster.start_node(host, virtual_gpus=2)
        self.cluster.wait(lambda: len(self.up_nodes()) == len(self.scale.node_hosts), 180, "every node to register")
        self.say(f"cluster up: {self.scale.name}, nodes {self.scale.node_hosts}, database {self.database}")

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        if self.cluster is not None:
            self.cluster.stop()
        if self.hosts is not None:
            self.hosts.close()

    # -- the API, through faults -------------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        local = threading.current_thread()
        session = getattr(local, "strata_session", None)
        if session is None:
            self.hosts.enter("cp")  # this thread's sockets are the control-plane host's from now on
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {self.cluster.credentials['token']}"
            local.strata_session = session
        return session

    def api(self, method: str, path: str, *, patience: float = 120.0, ok: tuple[int, ...] = (200, 201),
            **kwargs: Any) -> Any:
        """A REST call that retries through faults (connection errors, 5xx) for ``patience`` seconds; each
        failure is recorded. A 4xx other than those in ``ok`` raises at once."""
        session = self._session()
        deadline = time.monotonic() + patience
        while True:
            try:
                response = session.request(method, f"{self.cluster.url}/api/v1/{path}", timeout=30, **kwargs)
            except requests.RequestException as error:
                self.note("api-error", method=method, path=path, error=type(error).__name__)
                problem = f"{type(error).__name__}: {error}"
            else:
                if response.status_code in ok:
                    return response.json() if response.content else None
                if response.status_code < 500:
                    raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
                self.note("api-error", method=method, path=path, status=response.status_code)
                problem = f"{response.status_code} {response.text[:300]}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: still failing after {patience:g} s: {problem}")
            time.sleep(1.0)

    def submit(self, body: dict) -> str:
        key = str(uuid.uuid4())
        self.note("submit-invoke", key=key, name=body["name"], kind=body["kind"])
        try:
            job = self.api("POST", "jobs/", json=body, headers={"Idempotency-Key": key})
        except Exception as error:
            self.note("submit-fail", key=key, error=str(error)[:300])
            raise
        self.note("submit-ack", key=key, job=job["id"], name=body["name"])
        self.jobs[body["name"]] = job["id"]
        return job["id"]

    def job(self, job_id: str) -> dict:
        return self.api("GET", f"jobs/{job_id}/")

    def cancel(self, job_id: str) -> dict:
        self.note("cancel-invoke", job=job_id)
        answer = self.api("POST", f"jobs/{job_id}/cancel/")
        self.note("cancel-ack", job=job_id, state=answer.get("state"))
        return answer

    def up_nodes(self) -> list[dict]:
        return [node for node in self.api("GET", "nodes/")["results"] if node["lease_valid"]]

    def wait(self, condition, timeout: float, message: str) -> Any:
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {message}")
            time.sleep(0.5)
        raise RuntimeError("stopped")

    def wait_ended(self, job_id: str, timeout: float) -> dict:
        return self.wait(lambda: (record := self.job(job_id))["state"] in TERMINAL and record, timeout,
                         f"job {job_id} to end")

    # -- background work -------------------------------------------------------------------------------------
    def spawn(self, name: str, target, *args: Any) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except Exception:  # noqa: BLE001 - reported at the end
                if not self.stop.is_set():
                    self.errors.append(f"{name}: {traceback.format_exc()}")

        thread = threading.Thread(target=run, name=f"chaos-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def call_replicas(self, deployment: str) -> None:
        """Call the deployment continuously, as an application would (the Balancer fails over between replicas);
        every call is recorded with its answer or status."""
        import numpy as np

        from components.runtime.client.client import ControlPlaneClient
        from components.serving.client import Balancer, ServingError

        self._session()  # enter the control-plane host
        token = self.api("POST", f"jobs/{deployment}/tokens/", json={"name": "chaos"})["token"]
        api = ControlPlaneClient(self.cluster.url, self.cluster.credentials["token"])
        balancer = Balancer.for_job(api, deployment, token=token, refresh_s=1.0, retry_after_s=2.0)
        rows = np.random.default_rng(self.seed).random((2, 64), dtype=np.float32)
        while not self.stop.is_set():
            rid = str(uuid.uuid4())
            try:
                endpoints = balancer.endpoints()
            except Exception:  # noqa: BLE001 - the control plane is under faults too
                time.sleep(1.0)
                continue
            if not endpoints:
                time.sleep(0.5)
                continue
            self.note("request", rid=rid, endpoints=endpoints)
            try:
                answer = balancer.predict(rows, timeout=10)
            except ServingError as error:
                self.note("status", rid=rid, code=error.code.name)
                time.sleep(0.2)
            except Exception as error:  # noqa: BLE001 - still a status the caller got, not a hang
                self.note("status", rid=rid, code=f"client:{type(error).__name__}")
                time.sleep(0.2)
            else:
                self.note("answer", rid=rid, rows=int(answer.shape[0]))
                time.sleep(0.1)

    # -- faults ------------------------------------------------------------------------------------------------
    def host_of(self, node_name: str | None) -> str | None:
        return node_name[len("host-"):] if node_name and node_name.startswith("host-") else None

    def running(self, names: list[str] | None = None) -> list[dict]:
        """Jobs of the driver that are RUNNING now, with a started attempt."""
        found = []
        for name, job_id in list(self.jobs.items()):
            if names is not None and not any(name.startswith(prefix) for prefix in names):
                continue
            record = self.job(job_id)
            if record["state"] == "RUNNING" and record["attempts"] and record["attempts"][-1]["started_at"]:
                found.append(record)
        return found

    def processes(self, host: str, needle: str) -> list[psutil.Process]:
        found = []
        for pid in self.hosts.pids(host):
            try:
                process = psutil.Process(pid)
                if needle in " ".join(process.cmdline()):
                    found.append(process)
            except psutil.Error:
                continue
        return found

    def attempt_pids(self, host: str, attempt_id: str) -> list[int]:
        """The processes running an attempt on ``host`` (the node worker writes them to its state directory)."""
        path = self.home / f"node-{host}" / "running" / f"{attempt_id}.json"
        try:
            return [pid for pids in json.loads(path.read_text())["pids"].values() for pid in pids]
        except (OSError, ValueError, KeyError):
            return []

    def fault(self, name: str, target: str, **fields: Any) -> None:
        self.note("fault", name=name, target=target, **fields)
        self.say(f"fault {name} on {target}")

    def sigkill_node_worker(self) -> None:
        record = self.wait(lambda: self.running(["long"]), 180, "a long job to run")[0]
        host = self.host_of(record["attempts"][-1]["node"])
        workers = self.processes(host, "components.runtime.node.worker")
        main = [p for p in workers if "celery" in " ".join(p.cmdline())]
        for process in main[:1]:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        self.fault("sigkill-node-worker", host, job=record["id"], pids=[p.pid for p in main[:1]])

    def kill_sharing_service(self) -> None:
        def shared_host():
            for host in self.scale.node_hosts:
                running = self.home / f"node-{host}" / "running"
                for path in running.glob("*.json") if running.exists() else ():
                    with contextlib.suppress(OSError, ValueError):
                        if json.loads(path.read_text()).get("shared"):
                            return host
            return None

        host = self.wait(shared_host, 180, "an attempt hosted by a sharing service")
        services = self.processes(host, "components.gpushare.service")
        for process in services[:1]:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        self.fault("kill-sharing-service", host, pids=[p.pid for p in services[:1]])

    def restart_broker(self, wipe: bool) -> None:
        self.cluster.stop_broker(wipe=wipe)
        self.fault("broker-wipe" if wipe else "broker-restart", "cp")
        time.sleep(3.0)
        self.cluster.start_broker()

    def kill_database_connections(self) -> None:
        killed = self.cluster.database_connections(terminate=True)
        self.fault("postgres-connections-killed", "cp", connections=killed)

    def kill_serving_replica(self, deployment: str) -> None:
        def replica():
            answer = self.api("GET", f"jobs/{deployment}/replicas/")
            return len(answer["endpoints"]) >= 2 and answer["replicas"]

        rows = self.wait(replica, 240, "two serving replicas")
        # Let the client call both for a while first.
        time.sleep(3.0)
        victim = rows[-1]
        record = self.job(victim["job"])
        attempt = record["attempts"][-1]
        host = self.host_of(attempt["node"])
        pids = self.attempt_pids(host, attempt["id"])
        for pid in pids[:1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.fault("kill-serving-replica", host, job=victim["job"], pids=pids[:1])

    def kill_hivemind_peer(self, job_id: str) -> None:
        def peers():
            record = self.job(job_id)
            if record["state"] != "RUNNING" or not record["attempts"]:
                return None
            attempt = record["attempts"][-1]
            # Training: the swarm's report (its latest attempt's) lists both peers.
            swarm = ((attempt.get("reports") or {}).get("decentral") or {}).get("payload") or {}
            if len(swarm.get("peers") or []) < 2:
                return None
            found = [(host, pid) for host in self.scale.node_hosts for pid in self.attempt_pids(host, attempt["id"])]
            return len(found) >= 2 and found

        found = self.wait(peers, 240, "two hivemind peers training")
        time.sleep(3.0)  # let them average at least once
        host, pid = found[-1]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.fault("kill-hivemind-peer", host, job=job_id, pid=pid)

    def sigstop_node(self) -> None:
        record = self.wait(lambda: self.running(), 180, "a job to run")[0]
        host = self.host_of(record["attempts"][-1]["node"])
        pids = self.hosts.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self.fault("sigstop-node", host, job=record["id"], processes=len(pids))
        # Past the node's lease (6 s here) and a reaper tick: its attempts end node_lost and move elsewhere.
        time.sleep(12.0)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.note("resume", host=host)

    def attempt_seconds(self, job_id: str) -> float | None:
        """How long the last attempt of a finished job ran (its start to its end, the server's clock)."""
        from datetime import datetime

        record = self.job(job_id)
        attempt = (record.get("attempts") or [{}])[-1]
        if record["state"] != "SUCCEEDED" or not attempt.get("started_at") or not attempt.get("ended_at"):
            return None
        began, ended = (datetime.fromisoformat(attempt[key].replace("Z", "+00:00")) for key in ("started_at", "ended_at"))
        return (ended - began).total_seconds()

    def cancel_at_completion(self, names: list[str], rng: random.Random, duration: float) -> None:
        """Submit the jobs ``names`` one after another and cancel each around the moment it completes, so the
        cancel races the last steps, the upload of the model and the child's exit: each job must end exactly once.

        ``duration`` is how long the same job ran before (a calibration run). Each is cancelled at ``factor`` times
        the current estimate after its attempt started (the server's clock, the same machine's), and the factor
        follows a staircase: up after a cancel that won (the job ended CANCELLED), down after one that lost (the
        job SUCCEEDED first, and its own run becomes the estimate). Whatever the load, the cancels straddle the
        completion, and each race's outcome is in the client's history (``cancel-race``)."""
        from datetime import datetime

        factor, step = 1.0, 0.15
        for name in names:
            if self.stop.is_set():
                return
            job_id = self.submit(train(name, 2, max_attempts=2))

            def started(job_id=job_id):
                record = self.job(job_id)
                attempt = (record.get("attempts") or [{}])[-1]
                if attempt.get("started_at"):
                    return datetime.fromisoformat(attempt["started_at"].replace("Z", "+00:00")).timestamp()
                return time.time() if record["state"] in TERMINAL else None

            jitter = rng.uniform(0.95, 1.05)
            # Polled every 20 ms, not wait()'s 0.5 s: a shared attempt runs in the node's service in well under a
            # second, and a start seen late would make every cancel lose.
            deadline = time.monotonic() + 400
            while (began := started()) is None:
                if time.monotonic() > deadline or self.stop.is_set():
                    raise TimeoutError(f"job {job_id} did not start within 400 s")
                time.sleep(0.02)
            target = began + factor * jitter * duration
            while time.time() < target and not self.stop.is_set():
                time.sleep(min(0.02, max(0.0, target - time.time())))
            state = self.job(job_id)["state"]
            answer = self.cancel(job_id)
            self.fault("cancel-at-completion", job_id, state_before=state, answered=answer.get("state"),
                       factor=round(factor * jitter, 3), estimate_s=round(duration, 3))
            record = self.wait_ended(job_id, self.scale.deadline_s)
            won = record["state"] == "CANCELLED"
            self.note("cancel-race", job=job_id, won=won, factor=round(factor * jitter, 3))
            if won:
                factor += step
            else:
                factor = max(0.3, factor - step)
                duration = self.attempt_seconds(job_id) or duration

    # -- the run -----------------------------------------------------------------------------------------------
    def execute(self) -> Report:
        """:meth:`run` on a thread of its own (the driver's threads move into the control-plane host's network
        namespace for good; the caller's stays where it is)."""
        result: dict[str, Any] = {}

        def body() -> None:
            try:
                result["report"] = self.run()
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller
                result["error"] = error

        thread = threading.Thread(target=body, name="chaos-run", daemon=True)
        thread.start()
        thread.join(self.scale.deadline_s + 600)
        if thread.is_alive():
            self.stop.set()
            raise TimeoutError(f"the chaos run did not end within {self.scale.deadline_s + 600:g} s")
        if "error" in result:
            raise result["error"]
        return result["report"]

    def run(self) -> Report:
        rng = random.Random(self.seed)
        self.start()
        model = self.submit(train("model-digits", 2, max_attempts=3))
        dlrm_body = train("model-dlrm", 1, max_attempts=3)
        dlrm_body["spec"] = {"workload": "dlrm-movielens", "epochs": 1}
        dlrm = self.submit(dlrm_body)
        for job_id in (model, dlrm):
            record = self.wait_ended(job_id, 400)
            if record["state"] != "SUCCEEDED":
                raise RuntimeError(f"a model the stream needs did not train: {record['state']} {record['reason']}")
        for round_ in range(self.scale.rounds):
            self.say(f"round {round_ + 1}/{self.scale.rounds}")
            self.one_round(round_, model, dlrm, rng)
        return self.finish()

    def one_round(self, round_: int, model: str, dlrm: str, rng: random.Random) -> None:
        r = f"r{round_}"
        deployment = self.submit(serve(f"serve-{r}", model))
        self.spawn(f"client-{r}", self.call_replicas, deployment)
        swarm_id = self.submit(swarm(f"swarm-{r}"))
        for i in range(self.scale.long_jobs):
            self.submit(long_train(f"long-{r}-{i}"))
        self.submit(ddp(f"ddp-{r}"))
        self.submit(sweep(f"sweep-{r}"))
        self.submit(compress(f"compress-{r}", dlrm))
        for i in range(self.scale.short_jobs):
            self.submit(train(f"short-{r}-{i}", 1 + i % 2))

        faults = [self.sigkill_node_worker, self.kill_sharing_service, lambda: self.restart_broker(wipe=False),
                  self.kill_database_connections, lambda: self.kill_serving_replica(deployment),
                  lambda: self.kill_hivemind_peer(swarm_id), self.sigstop_node,
                  lambda: self.restart_broker(wipe=True)]
        order = list(range(len(faults)))
        rng.shuffle(order[2:])  # the first two need long jobs running early on
        for index in order:
            try:
                faults[index]()
            except TimeoutError as error:
                self.note("fault-skipped", index=index, reason=str(error)[:300])
                self.say(f"fault skipped: {error}")
            time.sleep(2.0)
        # Calibrate: how long this job runs here, now; then cancel its copies as they complete.
        calibration = self.submit(train(f"calibrate-{r}", 2, max_attempts=2))
        self.wait_ended(calibration, self.scale.deadline_s)
        duration = self.attempt_seconds(calibration) or 5.0
        self.cancel_at_completion([f"cancel-{r}-{i}" for i in range(self.scale.cancels)], rng, duration)
        # More work after the faults: the cluster must have recovered to run it.
        for i in range(2):
            self.submit(train(f"after-{r}-{i}", 1))
        # The deployment runs until cancelled: after the other jobs of the round ended. A swarm that lost a peer
        # before it formed waits for another (a volunteer may join) up to its time limit: it is cancelled if it has
        # not ended a while after the rest of the round.
        for name, job_id in list(self.jobs.items()):
            if (name.endswith(r) or f"-{r}-" in name) and job_id not in (deployment, swarm_id):
                self.wait_ended(job_id, self.scale.deadline_s)
        try:
            self.wait_ended(swarm_id, 180)
        except TimeoutError:
            self.note("swarm-cancelled", job=swarm_id)
            self.cancel(swarm_id)
            self.wait_ended(swarm_id, 120)
        self.cancel(deployment)
        self.wait_ended(deployment, 120)

    def finish(self) -> Report:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        self.stop.clear()
        server = read_lines(self.server_log)
        every = {line["job"] for line in server if line.get("op") == "submit"}
        deadline = time.monotonic() + 300
        final: dict[str, dict] = {}
        while True:
            final = {job_id: self.job(job_id) for job_id in sorted(every)}
            # A cancelled job is terminal at once, but its running attempt holds its devices (and is billed) until
            # its node confirms the processes are gone: wait for the attempts' ends too.
            settled = all(record["state"] in TERMINAL and all(a.get("ended_at") for a in record.get("attempts") or [])
                          for record in final.values())
            if settled or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        team = self.cluster.credentials.get("team", "demo")
        usage = self.api("GET", f"quotas/{team}/usage/")["usage"]
        # Read the history again: the last jobs' lines were written while we waited.
        server = read_lines(self.server_log)
        report = check(server, read_lines(self.client_log), final, {team: usage["gpu_hours_total"] * 3600})
        client = read_lines(self.client_log)
        api_errors = [line for line in client if line.get("op") == "api-error"]
        report.figures["API errors met by the client (retried)"] = {
            "5xx": sum(1 for line in api_errors if line.get("status")),
            "connection": sum(1 for line in api_errors if not line.get("status"))}
        raced = [self.jobs[name] for name in self.jobs if name.startswith("cancel-")]
        report.figures["cancelled as they completed: ended"] = dict(sorted(
            Counter(final[job_id]["state"] for job_id in raced if job_id in final).items()))
        report.figures["swarms cancelled after waiting for a lost peer"] = sum(
            1 for line in client if line.get("op") == "swarm-cancelled")
        report.figures["faults skipped"] = sum(1 for line in client if line.get("op") == "fault-skipped")
        report.figures["driver errors"] = len(self.errors)
        return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run the chaos suite's stream and faults, then check the history.")
    parser.add_argument("--scale", choices=sorted(SCALES), default="bounded")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    home = args.home or Path(f"/tmp/strata-chaos-{os.getpid()}")
    run = ChaosRun(home, SCALES[args.scale])
    try:
        report = run.execute()
    finally:
        run.close()
    print(report.summary())
    if args.output:
        args.output.write_text(json.dumps(report.as_dict(), indent=2))
    return 0 if report.ok and not run.errors else 1


if __name__ == "__main__":
    sys.exit(main())
