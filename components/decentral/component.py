"""A ``decentralized-train`` attempt on a node: each rank is one peer of the swarm (node side: torch, hivemind).

Rank 0 founds the swarm: it restores the job's checkpoint (if a retry), starts its DHT listener on the address its
node registered, and publishes ``host:port/p2p/<peer id>`` through the attempt's rendezvous; the other ranks read it
and join (downloading the current parameters from a peer first). Ranks are independent (``elastic_ranks``): one
that dies costs only itself. Rank 0 reports the swarm (``ctx.report("decentral", ...)``), checkpoints every
minute and at the end, and stores ``model.pt``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from components.decentral.peer import PeerConfig, PeerIO, SwarmPeer
from components.decentral.spec import PLUGIN
from components.runtime.contract.component import Component

CHECKPOINT_EVERY_S = 60.0


def peer_config(spec: dict[str, Any], *, job: str, name: str, public_key: str, rank: int | None,
                host: str = "127.0.0.1", volunteer: bool = False, device: str = "cpu") -> PeerConfig:
    """The peer's configuration from the job's normalized spec."""
    corrupt = (spec.get("faults") or {}).get("corrupt")
    hostile = corrupt if corrupt and rank is not None and rank in corrupt.get("ranks", []) else None
    return PeerConfig(job=job, name=name, public_key=public_key, model=spec["model"], steps=spec["steps"],
                      batch_size=spec["batch_size"], lr=spec["lr"], seed=spec["seed"],
                      min_peers=spec["peers"]["min"], max_peers=spec["peers"]["max"],
                      period_s=spec["averaging"]["period_s"], max_update_ratio=spec["averaging"]["max_update_ratio"],
                      eval_every=spec["eval_every"], target_loss=spec.get("target_loss"),
                      swap_budget_mb=spec["swap"]["budget_mb"], pcie_gbps=spec["swap"]["pcie_gbps"],
                      corrupt=hostile, host=host, threads=spec.get("threads", 1), volunteer=volunteer,
                      device=device)


def multiaddr(address: str) -> str:
    """``host:port/p2p/ID`` (a rendezvous address) as a libp2p multiaddr."""
    hostport, _, rest = address.partition("/")
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    proto = "ip6" if ":" in host else ("ip4" if host.replace(".", "").isdigit() else "dns")
    return f"/{proto}/{host}/tcp/{port}/{rest}"


class ContextIO(PeerIO):
    """A cluster peer's outside: the attempt's context."""

    def __init__(self, ctx, rank: int):
        self.ctx, self.rank = ctx, rank
        self._public_key = None

    def log(self, message: str) -> None:
        self.ctx.log(message)

    def metrics(self, values: dict[str, float], step: int) -> None:
        tagged = {f"peer{self.rank}.{name}": value for name, value in values.items()
                  if name in ("loss", "samples_per_s", "test_loss")}
        if self.rank == 0:  # rank 0 also speaks for the swarm
            tagged.update(values)
        self.ctx.metrics(tagged, step)

    def report(self, payload: dict[str, Any]) -> None:
        if self.rank == 0:
            self.ctx.report(PLUGIN, payload)

    def should_stop(self) -> bool:
        return self.ctx.should_stop()

    def credential(self, subject: str) -> dict[str, Any]:
        return self.ctx.identity.credential(subject)


class DecentralComponent(Component):
    def run(self, ctx) -> None:
        spec, rank = ctx.spec, int(ctx.rank)
        io = ContextIO(ctx, rank)
        public_key = str(ctx.identity.credential("probe")["public_key"])
        device = ctx.torch_device if torch.cuda.is_available() else "cpu"
        host = ctx.gang.node_address() or "127.0.0.1"
        config = peer_config(spec, job=str(ctx.job_id), name=f"rank{rank}", public_key=public_key, rank=rank,
                             host=host, device=device)
        base = getattr(ctx, "workdir", None)
        workdir = Path(base) / f"peer-{rank}" if base else Path(tempfile.mkdtemp(prefix=f"strata-peer-{rank}-"))
        initial: list[str] = []
        if rank != 0:
            initial = [multiaddr(ctx.gang.address())]
        peer = SwarmPeer(config, io, initial_peers=initial, workdir=workdir)
        restored = ctx.restore(weights_only=True) if rank == 0 else None
        try:
            peer.start()
            if restored and restored.get("params"):
                with torch.no_grad():
                    for param, value in zip(peer.params, restored["params"], strict=True):
                        param.copy_(value)
                peer.step = int(restored.get("step", 0))
                ctx.log(f"resumed the swarm from its checkpoint at step {peer.step}")
            if rank == 0:
                port = peer.maddrs[0].split("/tcp/")[1].split("/")[0]
                published = ctx.gang.publish(int(port), suffix=f"/p2p/{peer.peer_id}")
                ctx.log(f"the swarm's initial peer: {published}")
                self._run_with_checkpoints(ctx, peer)
            else:
                peer.run()
        finally:
            peer.close()

    def _run_with_checkpoints(self, ctx, peer: SwarmPeer) -> None:
        last = [time.time()]
        original = peer._publish

        def publish_and_checkpoint() -> None:
            original()
            if time.time() - last[0] > CHECKPOINT_EVERY_S:
                last[0] = time.time()
                self._checkpoint(ctx, peer)

        peer._publish = publish_and_checkpoint
        summary = peer.run()
        self._checkpoint(ctx, peer)
        path = Path(peer.workdir) / "model.pt"
        with peer.lock:
            torch.save({"config": peer.model_config.as_dict(), "state_dict": peer.model.state_dict()}, path)
        ctx.artifact(path, "model.pt")
        ctx.log(f"rank 0 finished: {summary['steps']} steps, held-out loss {summary['test_loss']:.3f}, "
                f"{summary['rounds_ok']} averaging rounds ({summary['rounds_failed']} failed)")

    def _checkpoint(self, ctx, peer: SwarmPeer) -> None:
        with peer.lock:
            state = {"params": [p.detach().cpu().clone() for p in peer.params], "step": peer.step}
        ctx.checkpoint(state)
