"""A rank's process group: the node side of the distributed-training seam (:mod:`components.runtime.contract.distributed`).

:func:`init_gang` joins the attempt's process group through the control plane's rendezvous: rank 0 starts a
``torch.distributed.TCPStore`` on a free port of its node's registered address and publishes the port
(``ctx.gang.publish``); the other ranks read the address (``ctx.gang.address``). gloo on the
CPU, NCCL on CUDA (``backend: auto``). Imports torch: nodes only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from components.runtime.contract.distributed import DEFAULT_TIMEOUT_S, RENDEZVOUS_WAIT_S


@dataclass
class Gang:
    """This rank's place in the process group :func:`init_gang` set up."""

    rank: int
    world_size: int
    backend: str
    device: str  # the torch device of this rank ("cpu", "cuda:0")
    address: str  # where rank 0's store listens (host:port)
    nodes: list[str] = field(default_factory=list)  # node of each rank, when known

    def any(self, flag: bool) -> bool:
        """Collective: True when ``flag`` is true on any rank (so that every rank stops at the same step)."""
        import torch
        import torch.distributed as dist

        device = self.device if self.backend == "nccl" else "cpu"
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def close(self, wait: bool = False) -> None:
        """Leave the group. ``wait`` (a run that ended normally): first wait for every rank to get here, so no
        rank tears its connections down while another still uses them (gloo then aborts the late process)."""
        import datetime

        import torch.distributed as dist

        if dist.is_initialized():
            if wait:
                with contextlib.suppress(Exception):
                    if self.backend == "gloo":
                        dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
                    else:
                        dist.barrier()
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def backend_for(requested: str, device: str) -> str:
    """``auto``: NCCL when this rank has a CUDA device (and torch has NCCL), else gloo."""
    if requested != "auto":
        return requested
    if device.startswith("cuda"):
        import torch.distributed as dist

        if dist.is_nccl_available():
            return "nccl"
    return "gloo"


def interface_of(address: str) -> str | None:
    """The network interface holding ``address`` (for gloo/NCCL to listen on the node's own address)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover -- psutil is a dependency
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(item.address == address for item in addresses):
            return name
    return None


def init_gang(ctx: Any, options: Mapping[str, Any] | None = None) -> Gang:
    """Join this attempt's process group through the control plane's rendezvous (see the module docstring)."""
    import datetime

    import torch.distributed as dist

    options = dict(options or {})
    timeout = datetime.timedelta(seconds=float(options.get("timeout_s", DEFAULT_TIMEOUT_S)))
    device = ctx.torch_device
    backend = backend_for(str(options.get("backend", "auto")), device)
    own = ctx.gang.node_address() or "127.0.0.1"
    interface = interface_of(own)
    if interface:  # listen on the node's registered address, not whatever the host name resolves to
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    if ctx.rank == 0:
        store = dist.TCPStore(own, 0, ctx.world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        address = ctx.gang.publish(int(store.port))
    else:
        address = ctx.gang.address(timeout=RENDEZVOUS_WAIT_S)
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host.strip("[]"), int(port), ctx.world_size, is_master=False, timeout=timeout)
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
    ctx.log(f"rank {ctx.rank}/{ctx.world_size} joined the {backend} group at {address}")
    nodes = ctx.gang.nodes() if ctx.rank == 0 else []  # rank 0 reports for the gang
    return Gang(rank=ctx.rank, world_size=ctx.world_size, backend=backend, device=device, address=address,
                nodes=nodes)


