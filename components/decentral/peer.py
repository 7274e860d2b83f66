"""One peer of a swarm (node side: torch and hivemind).

A :class:`SwarmPeer` trains a full copy of the model on its own batches and, every averaging period, averages its
parameters with whichever peers it finds (hivemind's DHT for discovery and matchmaking, its butterfly all-reduce
for the average, guarded by :mod:`components.decentral.averaging`). Averaging is **asynchronous** (Atom / delayed
parameter averaging): the peer hands a snapshot of its parameters to the averager and keeps training; when the
round ends it adds ``average - snapshot`` to its parameters, so the local steps taken meanwhile are kept.

How a swarm holds together:

- **Discovery and membership.** The first peer starts the DHT; the others bootstrap from its address (the
  rendezvous of the attempt, or the initial peers the control plane hands a volunteer). Every DHT request carries
  a hivemind ``AccessToken`` whose signature is a control-plane credential for ``rsa:<hash of the peer's RSA
  key>`` (:class:`SwarmAuthorizer`): a peer the control plane did not credential (no job token) is refused by every
  other peer. DHT records are signed (hivemind's ``RSASignatureValidator``): each peer's progress record is stored
  under its own key, so no one can forge another's.
- **Progress.** Every ~2 s each peer publishes ``{name, step, samples, samples/s, loss, rounds...}`` and reads
  everyone's: that is the swarm's view (who is in it, how fast each goes), which the job page shows.
- **Rounds** fall on a wall-clock grid (``period_s``): all peers aim at the same start time, so they meet.
  Matchmaking's target group size is the number of live peers, so a full group starts at once. The deadlines are
  not fixed (hivemind#676): the matchmaking lead is twice the slowest peer's step time (a peer can only join
  between its steps) plus a margin, and the all-reduce timeout is three times the measured duration of the recent
  rounds (plus a floor), both clamped to the period.
- **Newcomers** download the current parameters (and the swarm's step) from a peer before training.
- **Faults.** A peer that dies simply stops appearing; rounds go on with the others. Bad updates (NaN, infinite,
  ×1e6) are dropped and the sender reported (``rejections``).
- ``corrupt`` turns this peer into a hostile one for tests and demos: it contributes NaN, or its update times a
  factor, to every round.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from components.decentral.averaging import UpdateGuard, swarm_averager_class
from components.decentral.model import Corpus, ModelConfig, build_model, evaluate, lm_loss, model_layers

log = logging.getLogger(__name__)

PUBLISH_S = 2.0  # how often a peer publishes its progress and reads the swarm's
RECORD_TTL_S = 3 * PUBLISH_S + 4.0  # a progress record outlives this many seconds of silence, then the peer is gone
OWNER_SUBKEY = re.compile(rb"\[owner:[^\]]+\]")  # hivemind RSASignatureValidator's marker: only that key's holder writes it
MAX_ROUNDS_KEPT = 200
PEER_WAIT_S = 300.0  # how long a peer waits for the swarm's minimum of peers before it trains alone
MAX_REJECTIONS_KEPT = 100


@dataclass
class PeerConfig:
    """What one peer needs to know (from the job's normalized spec, plus who and where it is)."""

    job: str
    name: str
    public_key: str  # the job's credential key (hex): every peer checks the others' credentials with it
    model: str = "small"
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0
    min_peers: int = 2
    max_peers: int = 16
    period_s: float = 5.0
    max_update_ratio: float = 10.0
    eval_every: int = 25
    target_loss: float | None = None
    swap_budget_mb: float | None = None
    pcie_gbps: float = 16.0
    corrupt: dict[str, Any] | None = None
    host: str = "127.0.0.1"
    announce_port: int | None = None  # a port in front of the listener (a throttled link) to announce instead
    listen_port: int = 0
    threads: int = 1
    volunteer: bool = False
    device: str = "cpu"

    @property
    def prefix(self) -> str:
        return "strata-" + hashlib.sha256(self.job.encode()).hexdigest()[:16]


class PeerIO:
    """How a peer talks to the outside (the attempt's context, or a volunteer's participant session)."""

    def log(self, message: str) -> None:
        print(message, flush=True)

    def metrics(self, values: dict[str, float], step: int) -> None:
        pass

    def report(self, payload: dict[str, Any]) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def credential(self, subject: str) -> dict[str, Any]:
        """A control-plane credential for ``subject``: ``{"credential", "public_key", "expires"}``."""
        raise NotImplementedError


def credential_verifier(public_key: str, job: str) -> Callable[[str, str], str | None]:
    """``check(credential, subject) -> None | reason`` for this job's credentials."""
    from components.runtime.shared.credentials import verify

    def check(credential: str, subject: str) -> str | None:
        if not isinstance(credential, str) or not credential:
            return "no credential"
        _claims, reason = verify(credential, public_key, job=job, subject=subject)
        return reason

    return check


def rsa_subject(public_key_bytes: bytes) -> str:
    return "rsa:" + hashlib.sha256(public_key_bytes).hexdigest()[:40]


class CredentialStore:
    """Keeps this peer's credentials fresh in a file that the DHT's process reads (hivemind runs the DHT and the
    averager in child processes, which cannot call the control plane themselves)."""

    def __init__(self, fetch: Callable[[str], dict[str, Any]], path: Path):
        self.fetch, self.path = fetch, Path(path)
        self.current: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ensure(self, subject: str) -> dict[str, Any]:
        answer = self.fetch(subject)
        with self._lock:
            self.current[subject] = answer
            self._write()
        return answer

    def _write(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.current))
        os.replace(temporary, self.path)

    def get(self, subject: str) -> str:
        with self._lock:
            return str(self.current.get(subject, {}).get("credential", ""))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="credentials")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            for subject in list(self.current):
                expires = float(self.current[subject].get("expires") or 0)
                issued_for = max(1.0, expires - float(self.current[subject].get("issued", expires - 60)))
                if expires - time.time() < issued_for / 2:
                    try:
                        self.ensure(subject)
                    except Exception as error:  # noqa: BLE001 - keep the old one; it may still be valid
                        log.warning("could not renew the credential for %s: %s", subject, error)

    def stop(self) -> None:
        self._stop.set()


def _authorizer_class():
    from hivemind.proto.auth_pb2 import AccessToken
    from hivemind.utils.auth import TokenAuthorizerBase

    class SwarmAuthorizer(TokenAuthorizerBase):
        """hivemind's moderated-network protocol with the control plane as the authority: an ``AccessToken``'s
        signature is a control-plane credential for ``rsa:<hash of its public key>``, checked with the job's key."""

        def __init__(self, private_key, *, name: str, job: str, public_key: str, path: str):
            super().__init__(private_key)
            self.name, self.job, self.job_key, self.path = name, job, public_key, path
            self.subject = rsa_subject(self.local_public_key.to_bytes())

        async def get_token(self) -> AccessToken:
            found = json.loads(Path(self.path).read_text()).get(self.subject) or {}
            expires = float(found.get("expires") or 0)
            return AccessToken(username=self.name, public_key=self.local_public_key.to_bytes(),
                               expiration_time=datetime.fromtimestamp(expires, UTC).isoformat(),
                               signature=str(found.get("credential", "")).encode())

        def is_token_valid(self, access_token: AccessToken) -> bool:
            check = credential_verifier(self.job_key, self.job)
            reason = check(access_token.signature.decode(errors="replace"), rsa_subject(access_token.public_key))
            if reason is not None:
                log.debug("refused an access token of %s: %s", access_token.username, reason)
            return reason is None

        def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
            try:
                expires = datetime.fromisoformat(access_token.expiration_time).timestamp()
            except ValueError:
                return True
            return expires - time.time() < 20.0

    return SwarmAuthorizer


@dataclass
class Deadlines:
    """The averaging deadlines for the next round, from measured speeds (see the module docstring)."""

    period_s: float
    lead_s: float = 2.0
    allreduce_timeout_s: float = 10.0
    request_timeout_s: float = 1.0
    recent_rounds: deque = field(default_factory=lambda: deque(maxlen=8))

    def update(self, step_times: list[float], model_bytes: int, peers: int) -> Deadlines:
        slowest = max(step_times, default=0.5)
        self.lead_s = min(max(1.0, 0.5 + 2.0 * slowest), max(1.0, self.period_s * 0.6))
        if self.recent_rounds:
            measured = statistics.median(self.recent_rounds)
            timeout = 2.0 + 3.0 * measured
        else:  # nothing measured yet: the vector over a slow (10 MB/s) link, both ways, with room
            timeout = 5.0 + 2.0 * model_bytes * max(1, peers - 1) / max(1, peers) / 10e6
        self.allreduce_timeout_s = min(max(3.0, timeout), max(3.0, 4.0 * self.period_s))
        self.request_timeout_s = min(max(0.5, self.lead_s / 2), 3.0)
        return self

    def as_dict(self) -> dict[str, float]:
        return {"lead_s": round(self.lead_s, 3), "allreduce_timeout_s": round(self.allreduce_timeout_s, 3),
                "request_timeout_s": round(self.request_timeout_s, 3)}


def fingerprint(tensors) -> float:
    """A number that differs when the tensors do (tests compare peers' averages after one round)."""
    return float(sum(float(t.double().sum()) * (index + 1) for index, t in enumerate(tensors)))


class SwarmPeer:
    """One peer: :meth:`start` joins (or founds) the swarm, :meth:`run` trains, :meth:`close` leaves."""

    def __init__(self, config: PeerConfig, io: PeerIO, *, initial_peers: list[str] | None = None,
                 workdir: Path | str = "."):
        self.config, self.io = config, io
        self.initial_peers = list(initial_peers or [])
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.samples = 0
        self.loss_ema: float | None = None
        self.test_loss: float | None = None
        self.rounds: deque[dict[str, Any]] = deque(maxlen=MAX_ROUNDS_KEPT)
        self.rounds_ok = 0
        self.rounds_failed = 0
        self.rejections: deque[dict[str, Any]] = deque(maxlen=MAX_REJECTIONS_KEPT)
        self.view: list[dict[str, Any]] = []
        self.lock = threading.Lock()  # held around parameter updates
        self.control = None
        self.round_state: dict[str, Any] = {}
        self.next_round_at = 0.0
        self.step_times: deque[float] = deque(maxlen=20)
        self.deadlines = Deadlines(config.period_s)
        self.started_at = time.time()
        self.downloaded: dict[str, Any] | None = None
        self.history: deque[tuple[float, int, float]] = deque(maxlen=1000)  # (time, step, held-out loss)
        self._stop = threading.Event()
        self.dht = None
        self.averager = None
        self.swapped = None

    # -- joining -------------------------------------------------------------------------------------------
    def start(self) -> None:
        import hivemind
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.utils.crypto import RSAPrivateKey

        config = self.config
        torch.set_num_threads(max(1, int(config.threads)))
        self.model_config = ModelConfig.named(config.model)
        self.model = build_model(self.model_config, config.seed).to(config.device)
        self.params = [p for p in self.model.parameters()]
        self.model_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.corpus = Corpus(config.seed, self.model_config.context, device=config.device)
        self.optimizer = torch.optim.Adam(self.params, lr=config.lr)
        if config.swap_budget_mb:
            self._setup_swapping()
        self.check = credential_verifier(config.public_key, config.job)

        self.rsa = RSAPrivateKey()
        self.credentials = CredentialStore(self.io.credential, self.workdir / "credentials.json")
        self.credentials.ensure(rsa_subject(self.rsa.get_public_key().to_bytes()))
        authorizer = _authorizer_class()(self.rsa, name=config.name, job=config.job, public_key=config.public_key,
                                         path=str(self.credentials.path))
        self.validator = RSASignatureValidator(self.rsa)
        host_maddrs = [f"/ip4/{config.host}/tcp/{int(config.listen_port)}"]
        kwargs: dict[str, Any] = {}
        if config.announce_port:
            kwargs["announce_maddrs"] = [f"/ip4/{config.host}/tcp/{int(config.announce_port)}"]
        self.dht = hivemind.DHT(initial_peers=self.initial_peers or None, host_maddrs=host_maddrs,
                                authorizer=authorizer, record_validators=[self.validator], start=True,
                                startup_timeout=60, use_relay=False, use_auto_relay=False, **kwargs)
        self.peer_id = self.dht.peer_id.to_base58()
        self.p2p_subject = f"p2p:{self.peer_id}"
        self.credentials.ensure(self.p2p_subject)
        self.credentials.start()
        self.maddrs = [str(addr) for addr in self.dht.get_visible_maddrs()]

        check = self.check

        def authorize(peer: str, gathered: Any) -> str | None:
            credential = gathered.get("credential") if isinstance(gathered, dict) else None
            return check(str(credential or ""), f"p2p:{peer}")

        self.averaged = [p.detach().cpu().clone() for p in self.params]
        self.averager = swarm_averager_class()(
            self.averaged, self.dht, start=True, prefix=config.prefix, target_group_size=None,
            min_group_size=2, min_matchmaking_time=0.5, request_timeout=1.0, allreduce_timeout=30.0,
            guard=UpdateGuard(config.max_update_ratio), authorize=authorize, known_peer=self._known_peer,
            state_provider=self._state, declare_state_period=10.0)
        self.io.log(f"peer {config.name} ({self.peer_id[:12]}…) listens on {', '.join(self.maddrs)}"
                    + (f"; bootstrapped from {len(self.initial_peers)} peer(s)" if self.initial_peers else
                       "; it founded the swarm"))
        self._publish_progress()  # before any download: peers serve their state only to listed members
        self._monitor = threading.Thread(target=self._monitor_loop, daemon=True, name="swarm-monitor")
        self._monitor.start()
        if self.initial_peers:
            self._download_state()
        self.next_round_at = self._grid_after(time.time() + self.deadlines.lead_s)

    def _setup_swapping(self) -> None:
        """Atom: profile the layers on this device and plan the segments under the budget; the host parameters
        stay the model's own (what the optimizer and the averager see)."""
        from components.decentral import swap

        self.layers = model_layers(self.model)
        link = swap.HostLink(torch.device(self.config.device), self.config.pcie_gbps * 1e9 / 8)
        inputs, targets = self.corpus.batch(self.config.name, -1, self.config.batch_size)
        profiles = swap.profile_layers(self.layers, inputs, device=torch.device(self.config.device), link=link,
                                       targets=targets, loss_fn=lm_loss)
        plan = swap.plan_segments(profiles, int(self.config.swap_budget_mb * 2**20))
        self.swapped = swap.SwappedModel(self.layers, plan, device=torch.device(self.config.device), link=link,
                                         memory=swap.DeviceMemory(int(self.config.swap_budget_mb * 2**20)),
                                         timeline=True)
        self.io.log(f"layer swapping: {plan.as_dict().get('description', plan)}")

    def _download_state(self) -> None:
        """A newcomer takes the swarm's current parameters (and step) from a peer before it trains."""
        deadline = time.time() + 60
        while time.time() < deadline and not self._stopping():
            try:
                found = self.averager.load_state_from_peers(timeout=30)
            except Exception as error:  # noqa: BLE001 - no peer could send it yet: retry
                found = None
                log.debug("state download failed: %r", error)
            if found is not None:
                metadata, tensors = found
                with self.lock, torch.no_grad():
                    for param, tensor in zip(self.params, tensors, strict=True):
                        param.copy_(tensor.to(param.device))
                self.downloaded = {"from_step": int(metadata.get("step", 0)) if isinstance(metadata, dict) else 0,
                                   "at": time.time()}
                self.test_loss = evaluate(self.model, self.corpus)
                self.io.log(f"downloaded the swarm's state from a peer at its step {self.downloaded['from_step']}; "
                            f"held-out loss {self.test_loss:.3f}")
                return
            time.sleep(1.0)
        self.io.log("no peer could send the swarm's state; starting from the initial weights")

    def _state(self):
        with self.lock:
            return ({"step": self.step, "samples": self.samples, "name": self.config.name},
                    [p.detach().cpu().clone() for p in self.params])

    # -- the swarm's view ----------------------------------------------------------------------------------
    @property
    def progress_key(self) -> str:
        return f"{self.config.prefix}_progress"

    def _record(self) -> dict[str, Any]:
        step_s = statistics.median(self.step_times) if self.step_times else None
        return {"name": self.config.name, "p2p": self.peer_id, "credential": self.credentials.get(self.p2p_subject),
                "volunteer": bool(self.config.volunteer), "step": self.step, "samples": self.samples,
                "samples_per_s": (self.config.batch_size / step_s) if step_s else 0.0,
                "step_s": step_s or 0.0, "loss": self.loss_ema, "test_loss": self.test_loss,
                "rounds_ok": self.rounds_ok, "rounds_failed": self.rounds_failed, "time": time.time(),
                "maddrs": self.maddrs[:4]}

    def _monitor_loop(self) -> None:
        while not self._stop.wait(PUBLISH_S):
            try:
                self._publish_progress(wait=False)
                self.view = self._read_view()
                for rejection in self.averager.drain_rejections():
                    rejection["name"] = self._name_of(rejection["peer"])
                    self.rejections.append(rejection)
                    self.io.log(f"dropped a bad update from {rejection['name'] or rejection['peer'][:12]} "
                                f"({rejection['role']}): {rejection['problem']}")
            except Exception as error:  # noqa: BLE001 - one failed publish must not end the peer
                log.debug("swarm monitor: %r", error)

    def _publish_progress(self, wait: bool = True) -> None:
        from hivemind.utils.timed_storage import get_dht_time

        stored = self.dht.store(self.progress_key, subkey=self.validator.local_public_key, value=self._record(),
                                expiration_time=get_dht_time() + RECORD_TTL_S, return_future=True)
        if wait:
            stored.result(timeout=30)

    def _read_view(self) -> list[dict[str, Any]]:
        found = self.dht.get(self.progress_key, latest=True)
        records = []
        if found is not None and isinstance(found.value, dict):
            for subkey, item in found.value.items():
                # Only records under an owner-signed subkey ("[owner:<RSA key>]", which RSASignatureValidator lets
                # only that key's holder write): a record any DHT member stored under another subkey, say a
                # copy of a peer's record with a forged step or loss, is not part of the view.
                if not (isinstance(subkey, bytes) and OWNER_SUBKEY.fullmatch(subkey)):
                    continue
                value = getattr(item, "value", None)
                if not isinstance(value, dict) or "p2p" not in value:
                    continue
                if self.check(str(value.get("credential") or ""), f"p2p:{value['p2p']}") is not None:
                    continue  # an uncredentialed record: not a member
                records.append({key: value.get(key) for key in (
                    "name", "p2p", "volunteer", "step", "samples", "samples_per_s", "step_s", "loss", "test_loss",
                    "rounds_ok", "rounds_failed", "time", "maddrs")})
        return sorted(records, key=lambda record: str(record.get("name")))

    def _known_peer(self, peer: str) -> bool:
        try:
            return any(record.get("p2p") == peer for record in self._read_view())
        except Exception:  # noqa: BLE001 - cannot tell: refuse
            return False

    def _name_of(self, peer: str) -> str:
        return next((str(record["name"]) for record in self.view if record.get("p2p") == peer), "")

    def live_peers(self) -> list[dict[str, Any]]:
        now = time.time()
        return [record for record in self.view if now - float(record.get("time") or 0) < RECORD_TTL_S]

    # -- rounds ----------------------------------------------------------------------------------------
    def _grid_after(self, moment: float) -> float:
        period = self.config.period_s
        return (math.floor(moment / period) + 1) * period

    def _round_tick(self) -> None:
        now = time.time()
        if self.control is None:
            if now >= self.next_round_at - self.deadlines.lead_s:
                self._start_round(now)
        elif self.control.done():
            self._finish_round()

    def _start_round(self, now: float) -> None:
        scheduled = self.next_round_at
        self.next_round_at = self._grid_after(scheduled)
        live = self.live_peers()
        peers = max(len(live), 1 if not self.view else len(live))
        if peers < max(2, self.config.min_peers):
            return  # alone (or fewer than the minimum): train on, try at the next tick of the grid
        step_times = [float(record.get("step_s") or 0) for record in live] + list(self.step_times)[-3:]
        self.deadlines.update(step_times, self.model_bytes, peers)
        self.averager.set_deadlines(allreduce_timeout=self.deadlines.allreduce_timeout_s,
                                    request_timeout=self.deadlines.request_timeout_s,
                                    target_group_size=peers, min_group_size=2)
        with self.lock:
            snapshot = [p.detach().cpu().clone() for p in self.params]
        contributed = self._corrupted(snapshot)
        with self.averager.get_tensors() as tensors:
            for tensor, value in zip(tensors, contributed, strict=True):
                tensor.copy_(value)
        gather = {"name": self.config.name, "credential": self.credentials.get(self.p2p_subject),
                  "step": self.step, "samples": self.samples}
        timeout = max(scheduled - time.time(), 0.0) + self.deadlines.allreduce_timeout_s
        try:
            self.control = self.averager.step(gather=gather, scheduled_time=scheduled, timeout=timeout, wait=False)
        except Exception as error:  # noqa: BLE001 - the averager refused to start: count a failed round
            self._record_round({"round": int(round(scheduled / self.config.period_s)), "ok": False,
                                "error": f"{type(error).__name__}: {error}"[:200], "peers": peers})
            return
        self.round_state = {"round": int(round(scheduled / self.config.period_s)), "scheduled": scheduled,
                            "began": now, "contributed": contributed, "peers": peers,
                            "deadlines": self.deadlines.as_dict()}

    def _corrupted(self, snapshot: list[torch.Tensor]) -> list[torch.Tensor]:
        corrupt = self.config.corrupt
        if not corrupt:
            return snapshot
        if corrupt.get("mode") == "nan":
            return [torch.full_like(tensor, float("nan")) for tensor in snapshot]
        factor = float(corrupt.get("factor", 1e6))
        anchor = getattr(self, "_anchor", None) or [tensor.clone() for tensor in snapshot]
        return [a + factor * (s - a) + (factor * 1e-3 if (s - a).abs().max() == 0 else 0.0)
                for a, s in zip(anchor, snapshot, strict=True)]

    def _finish_round(self) -> None:
        control, state = self.control, self.round_state
        self.control, self.round_state = None, {}
        record = {"round": state["round"], "peers": state["peers"], "deadlines": state["deadlines"]}
        try:
            gathered = control.result()
        except BaseException as error:  # noqa: BLE001 - a failed round: train on
            record.update(ok=False, error=f"{type(error).__name__}: {error}"[:200])
            self._record_round(record)
            return
        if not gathered:
            record.update(ok=False, error="no group")
            self._record_round(record)
            return
        with self.averager.get_tensors() as tensors:
            averaged = [tensor.clone() for tensor in tensors]
        if not all(bool(torch.isfinite(tensor).all()) for tensor in averaged):
            # The guarded all-reduce keeps NaN and infinity out; this is the last line: never into the parameters.
            record.update(ok=False, error="the averaged parameters were not finite: the round was not applied")
            self._record_round(record)
            return
        with self.lock, torch.no_grad():
            for param, average, contributed in zip(self.params, averaged, state["contributed"], strict=True):
                param.add_((average - contributed).to(param.device))
            self._anchor = [p.detach().cpu().clone() for p in self.params]
        members = sorted(str(data.get("name")) for data in gathered.values() if isinstance(data, dict))
        # The same for every member of the group (each one's name and step as it joined): tests match peers'
        # records of one round by it.
        group = hashlib.sha1(json.dumps(sorted((str(data.get("name")), int(data.get("step") or 0))
                                               for data in gathered.values() if isinstance(data, dict))).encode())
        duration = max(0.0, time.time() - max(state["scheduled"], state["began"]))
        self.deadlines.recent_rounds.append(duration)
        record.update(ok=True, members=members, size=len(gathered), group=group.hexdigest()[:12],
                      fingerprint=fingerprint(averaged),
                      duration_s=round(duration, 3))
        self._record_round(record)

    def _record_round(self, record: dict[str, Any]) -> None:
        record["at"] = time.time()
        if record.get("ok"):
            self.rounds_ok += 1
        else:
            self.rounds_failed += 1
            log.info("round %s failed: %s", record.get("round"), record.get("error"))
        self.rounds.append(record)

    # -- training ----------------------------------------------------------------------------------------
    def _stopping(self) -> bool:
        return self._stop.is_set() or self.io.should_stop()

    def train_step(self) -> float:
        inputs, targets = self.corpus.batch(self.config.name, self.step, self.config.batch_size)
        with self.lock:
            self.optimizer.zero_grad(set_to_none=True)
            if self.swapped is not None:
                loss = float(self.swapped.train_step(inputs, targets, lm_loss))
            else:
                loss_tensor = lm_loss(self.model(inputs), targets)
                loss_tensor.backward()
                loss = float(loss_tensor.detach())
            self.optimizer.step()
        return loss

    def run(self) -> dict[str, Any]:
        """Train until ``steps`` local steps are done, the target loss is reached or a stop is asked for."""
        config = self.config
        self.wait_for_peers()
        self.training_started = time.time()
        last_report = 0.0
        while self.step < config.steps and not self._stopping():
            began = time.perf_counter()
            self._round_tick()
            loss = self.train_step()
            self.step += 1
            self.samples += config.batch_size
            self.step_times.append(time.perf_counter() - began)
            if math.isfinite(loss):
                self.loss_ema = loss if self.loss_ema is None else 0.9 * self.loss_ema + 0.1 * loss
            if self.step % config.eval_every == 0 or self.step == config.steps:
                self.test_loss = evaluate(self.model, self.corpus)
                self.history.append((time.time(), self.step, self.test_loss))
                if config.target_loss is not None and self.test_loss <= config.target_loss:
                    self.io.log(f"held-out loss {self.test_loss:.3f} reached the target {config.target_loss:g}")
                    break
            if time.time() - last_report > 2.0:
                last_report = time.time()
                self._publish()
        self._finish_pending_round()
        self.test_loss = evaluate(self.model, self.corpus)
        self._publish()
        return self.summary()

    def wait_for_peers(self, timeout: float | None = None) -> bool:
        """Wait until ``min_peers`` peers (this one included) are live before training (at most ``timeout``,
        default :data:`PEER_WAIT_S`); False when the swarm did not fill up in time (the peer trains anyway)."""
        wanted = max(1, self.config.min_peers)
        deadline = time.time() + (PEER_WAIT_S if timeout is None else timeout)
        announced = False
        while len(self.live_peers()) < wanted and not self._stopping():
            if time.time() > deadline:
                self.io.log(f"only {len(self.live_peers())} of the {wanted} peers needed came; training anyway")
                return False
            if not announced:
                self.io.log(f"waiting for {wanted} peers (spec.peers.min) before training")
                announced = True
            time.sleep(0.25)
        return True

    def _finish_pending_round(self) -> None:
        if self.control is None:
            return
        deadline = time.time() + self.deadlines.allreduce_timeout_s + self.deadlines.lead_s
        while not self.control.done() and time.time() < deadline:
            time.sleep(0.05)
        if self.control.done():
            self._finish_round()
        else:
            try:
                self.control.cancel()
            except Exception:  # noqa: BLE001 - already finishing
                pass
            self.control = None

    def _publish(self) -> None:
        step_s = statistics.median(self.step_times) if self.step_times else 0.0
        live = self.live_peers()
        values = {"loss": self.loss_ema if self.loss_ema is not None else float("nan"),
                  "samples_per_s": self.config.batch_size / step_s if step_s else 0.0,
                  "rounds_ok": float(self.rounds_ok), "rounds_failed": float(self.rounds_failed),
                  "peers": float(len(live)), "epoch": float(self.global_epoch(live)),
                  "swarm_samples_per_s": float(sum(float(r.get("samples_per_s") or 0) for r in live))}
        if self.test_loss is not None:
            values["test_loss"] = self.test_loss
        self.io.metrics({k: v for k, v in values.items() if math.isfinite(v)}, self.step)
        self.io.report(self.report_payload(live))

    def global_epoch(self, live: list[dict[str, Any]] | None = None) -> int:
        """The swarm's epoch: the most averaging rounds any live peer completed."""
        live = self.live_peers() if live is None else live
        return max([self.rounds_ok] + [int(record.get("rounds_ok") or 0) for record in live])

    def report_payload(self, live: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        live = self.live_peers() if live is None else live
        payload = {"peer": self.config.name, "p2p": self.peer_id, "maddrs": self.maddrs[:4],
                   "epoch": self.global_epoch(live), "step": self.step,
                   "peers": [{key: record.get(key) for key in ("name", "p2p", "volunteer", "step", "samples",
                                                               "samples_per_s", "loss", "test_loss", "rounds_ok",
                                                               "rounds_failed")} for record in live],
                   "rounds": [{key: value for key, value in record.items() if key != "contributed"}
                              for record in list(self.rounds)[-20:]],
                   "rejections": list(self.rejections)[-20:], "deadlines": self.deadlines.as_dict(),
                   "rounds_ok": self.rounds_ok, "rounds_failed": self.rounds_failed}
        if self.swapped is not None:
            payload["swap"] = self.swapped.timeline_summary()
        return payload

    def summary(self) -> dict[str, Any]:
        started = getattr(self, "training_started", None)
        return {"name": self.config.name, "steps": self.step, "samples": self.samples, "loss": self.loss_ema,
                "train_s": (time.time() - started) if started else None,
                "test_loss": self.test_loss, "rounds_ok": self.rounds_ok, "rounds_failed": self.rounds_failed,
                "rounds": list(self.rounds), "rejections": list(self.rejections), "downloaded": self.downloaded,
                "history": list(self.history)}

    def close(self) -> None:
        self._stop.set()
        if getattr(self, "credentials", None) is not None:
            self.credentials.stop()
        if self.swapped is not None:
            self.swapped.close()
        for part in (self.averager, self.dht):
            if part is not None:
                try:
                    part.shutdown()
                except Exception as error:  # noqa: BLE001 - leaving anyway
                    log.debug("shutdown: %r", error)
