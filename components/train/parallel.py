"""The node side of train's strategies (:mod:`components.train.strategies`): DDP and PostLocalSGD runtimes."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from components.runtime.contract.distributed import StrategyRuntime, ring_allreduce_bytes


def batch_samples(batch: Any) -> int:
    """The number of samples in a batch: the length of its first tensor."""
    first = batch[0] if isinstance(batch, tuple | list) else batch
    return int(len(first)) if hasattr(first, "__len__") else 1


def _counting_allreduce(runtime, bucket):  # DDP checks a hook's annotations: none, or its own types
    """DDP's default all-reduce, counting the bytes each rank sends and charging them to the emulated link."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buffer = bucket.buffer()
    sent = ring_allreduce_bytes(buffer.numel() * buffer.element_size(), runtime.world_size)
    runtime.bytes_sent += sent
    runtime.link.send(sent)
    return allreduce_hook(None, bucket)


class DDPRuntime(StrategyRuntime):
    """Bulk-synchronous data parallelism with :class:`torch.nn.parallel.DistributedDataParallel`.

    The workload's model is wrapped only while a step runs (``workload.model`` is the DDP module then), so the
    workload's checkpoints, evaluation and ``model.pt`` see the plain model."""

    def __init__(self, ctx: Any, options: dict[str, Any], gang: Any):
        super().__init__(ctx, options, gang)
        self.bytes_sent = 0
        self.module: torch.nn.Module | None = None
        self.ddp: Any = None

    def setup(self, workload: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.module = workload.model
        device = torch.device(self.gang.device)
        device_ids = [device.index] if device.type == "cuda" else None
        # Construction broadcasts rank 0's parameters and buffers: every rank starts from the same model.
        self.ddp = DistributedDataParallel(self.module, device_ids=device_ids,
                                           bucket_cap_mb=float(self.options.get("bucket_mb", 25)))
        self.register_hook()

    def register_hook(self) -> None:
        self.ddp.register_comm_hook(self, _counting_allreduce)

    def train_step(self, workload: Any, batch: Any) -> dict[str, Any]:
        began = time.perf_counter()
        samples = batch_samples(batch)
        self.slowdown.advance()
        self.slowdown.delay(samples)
        cpu = time.thread_time()
        workload.model = self.ddp
        try:
            values = workload.train_step(batch)
        finally:
            workload.model = self.module
        self.slowdown.observe(time.thread_time() - cpu, samples)
        self.after_step(workload)
        self.record_step((time.perf_counter() - began) * 1000.0)
        return values

    def after_step(self, workload: Any) -> None:
        """Work after the optimizer step (PostLocalSGD averages parameters here)."""


class PostLocalSGDRuntime(DDPRuntime):
    """PyTorch's PostLocalSGD: DDP's all-reduce for ``warmup`` steps, then purely local steps (each rank its own
    subgroup) with :class:`PeriodicModelAverager` averaging the parameters every ``period`` steps.

    On the CPU, ``PostLocalSGDState`` needs an explicit subgroup (its default needs CUDA), so every rank gets a
    subgroup of its own from ``dist.new_subgroups(group_size=1)``."""

    def register_hook(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState,
            post_localSGD_hook,
        )
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        warmup = int(self.options.get("warmup", 0))
        subgroup, _ = dist.new_subgroups(group_size=1)
        self.state = PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=warmup)
        self.ddp.register_comm_hook(self.state, post_localSGD_hook)
        self.averager = PeriodicModelAverager(period=int(self.options.get("period", 4)), warmup_steps=warmup)
        self.parameter_bytes = sum(p.numel() * p.element_size() for p in self.module.parameters())

    def after_step(self, workload: Any) -> None:
        warmup, period = int(self.options.get("warmup", 0)), int(self.options.get("period", 4))
        step = self.averager.step
        # Warm-up steps all-reduced their gradients (as DDP does); afterwards the averager all-reduces the
        # parameters on every period-th step (its own rule), and other steps send nothing.
        if step < warmup or (step - warmup) % period == 0:
            sent = ring_allreduce_bytes(self.parameter_bytes, self.world_size)
            self.bytes_sent += sent
            self.link.send(sent)
        self.averager.average_parameters(self.module.parameters())

    def synchronize(self, workload: Any) -> None:
        """Average the parameters now, so that rank 0 evaluates and saves the gang's model."""
        with torch.no_grad():
            for parameter in self.module.parameters():
                dist.all_reduce(parameter.data)
                parameter.data /= self.world_size
