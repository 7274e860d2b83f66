"""A swarm of local peers, each its own process on 127.0.0.1, for tests, benchmarks and demos (node side).

Credentials come from a key this harness holds (``components.runtime.shared.credentials.sign_with``), as the control
plane's would: a peer started with ``credentialed=False`` gets none and cannot join. Every peer writes its summary
(:meth:`SwarmPeer.summary` plus its last swarm view) to ``<workdir>/<name>.json`` when it ends; :meth:`kill` sends
SIGKILL (a crash), :meth:`close` stops and reaps every process.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import secrets
import signal
import time
from pathlib import Path
from typing import Any

from components.runtime.shared.credentials import public_key_hex, sign_with

DEFAULT_SPEC: dict[str, Any] = {"model": "tiny", "steps": 300, "batch_size": 16, "lr": 3e-3, "seed": 0,
                                "peers": {"min": 2, "max": 16}, "averaging": {"period_s": 2.0, "max_update_ratio": 10.0},
                                "swap": {"budget_mb": None, "pcie_gbps": 16.0}, "eval_every": 50,
                                "target_loss": None, "threads": 1, "faults": {"corrupt": None}}


def _peer_main(name: str, spec: dict[str, Any], job: str, seed: bytes, credentialed: bool, initial: list[str],
               workdir: str, corrupt: dict | None, announce_port: int | None, listen_port: int,
               ready) -> None:
    import logging

    from hivemind.utils.mpfuture import MPFuture

    # hivemind's MPFuture guards its pipes with multiprocessing locks made when hivemind is imported, so every
    # process forked from the importer shares them. A peer SIGKILLed while holding one (a crash test, a chaos
    # kill) would leave them held for the whole family: no DHT in the parent or in any later peer would ever get
    # its "ready". Each peer (and what it forks) gets locks of its own.
    MPFuture.reset_backend()

    logging.basicConfig(level=logging.WARNING)
    from components.decentral.component import peer_config
    from components.decentral.peer import PeerIO, SwarmPeer

    class LocalIO(PeerIO):
        def log(self, message: str) -> None:
            print(f"[{name}] {message}", flush=True)

        def credential(self, subject: str) -> dict[str, Any]:
            if not credentialed:
                return {"credential": "", "public_key": public_key_hex(seed), "expires": time.time() + 60}
            return sign_with(seed, job=job, subject=subject, holder=f"local {name}", ttl_s=60)

    config = peer_config(spec, job=job, name=name, public_key=public_key_hex(seed), rank=None)
    config.corrupt = corrupt
    config.announce_port, config.listen_port = announce_port, listen_port
    peer = SwarmPeer(config, LocalIO(), initial_peers=initial, workdir=Path(workdir) / name)
    out = Path(workdir) / f"{name}.json"
    try:
        peer.start()
        ready.put({"name": name, "maddrs": peer.maddrs, "p2p": peer.peer_id})
        started = time.time()
        summary = peer.run()
        summary.update(wall_s=time.time() - started, view=peer.view, p2p=peer.peer_id)
        out.write_text(json.dumps(summary, default=str))
    except BaseException as error:
        ready.put({"name": name, "error": f"{type(error).__name__}: {error}"[:500]})
        out.write_text(json.dumps({"name": name, "error": f"{type(error).__name__}: {error}"[:500]}))
        raise
    finally:
        peer.close()


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
        victims = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for victim in victims:
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=10)


class LocalSwarm:
    """Start peers with :meth:`start`; the first one founds the swarm, later ones bootstrap from the first."""

    def __init__(self, workdir: Path | str, spec: dict[str, Any] | None = None, job: str = "local-swarm"):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        from components.decentral.spec import DecentralizedTrainSpec

        merged = json.loads(json.dumps(DEFAULT_SPEC))
        for key, value in (spec or {}).items():  # one level deep: {"averaging": {"period_s": 5}} keeps the rest
            merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key),
                                                                                           dict) else value
        self.spec = DecentralizedTrainSpec().validate(merged)
        self.job = job
        self.seed = secrets.token_bytes(32)
        self.context = mp.get_context("fork")  # hivemind's own processes are forked from each peer
        self.ready = self.context.Queue()
        self.processes: dict[str, Any] = {}
        self.info: dict[str, dict[str, Any]] = {}

    def start(self, name: str, *, corrupt: dict | None = None, credentialed: bool = True,
              initial: list[str] | None = None, wait: bool = True, announce_port: int | None = None,
              listen_port: int = 0, timeout: float = 120.0) -> dict[str, Any]:
        if initial is None:
            initial = [address for info in self.info.values() for address in info.get("maddrs", [])][:4]
        process = self.context.Process(
            target=_peer_main, name=f"peer-{name}", daemon=False,
            args=(name, self.spec, self.job, self.seed, credentialed, initial, str(self.workdir), corrupt,
                  announce_port, listen_port, self.ready))
        process.start()
        self.processes[name] = process
        if not wait:
            return {"name": name}
        return self.wait_ready(name, timeout)

    def wait_ready(self, name: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if name in self.info:
                return self.info[name]
            try:
                message = self.ready.get(timeout=1.0)
            except Exception:  # noqa: BLE001 - queue.Empty: keep waiting while the process lives
                if not self.processes[name].is_alive():
                    return {"name": name, "error": f"exited with code {self.processes[name].exitcode}"}
                continue
            self.info[message["name"]] = message
        raise TimeoutError(f"peer {name} did not start in {timeout:g} s")

    def kill(self, name: str) -> None:
        """A crash of the peer's machine: SIGKILL to the peer and to everything it started (hivemind's DHT and
        averager processes, the p2p daemon), so nothing of it lingers (its children would otherwise keep the
        process's sentinel open, and a join would wait for them)."""
        process = self.processes[name]
        _kill_tree(process.pid)
        process.join(10)
        self.info.pop(name, None)

    def wait(self, timeout: float = 300.0) -> None:
        deadline = time.time() + timeout
        for process in self.processes.values():
            process.join(max(0.1, deadline - time.time()))

    def result(self, name: str) -> dict[str, Any] | None:
        path = self.workdir / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def close(self) -> None:
        """Stop the peers still running as :meth:`kill` does (SIGKILL to each and to everything it started), then
        reap every peer. SIGTERM would end a peer alone (it has no handler: no summary either way), and its
        hivemind processes, holding its sentinel open, would make the join wait its whole timeout and then live on."""
        for process in self.processes.values():
            if process.is_alive():
                _kill_tree(process.pid)
        for process in self.processes.values():
            process.join(10)
        self.ready.close()

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
