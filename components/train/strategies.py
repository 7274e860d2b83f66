"""The train plugin's distributed strategies (light: the control plane checks ``spec.distributed`` with them).

- ``ddp``: PyTorch's DistributedDataParallel, bulk-synchronous: every step all-reduces every gradient, so every
  rank waits for the slowest one.
- ``post-local-sgd``: PyTorch's PostLocalSGD communication hook with a ``PeriodicModelAverager``: after
  ``warmup`` DDP steps each rank steps on its own and the ranks average their parameters every ``period``
  steps (a straggler then stalls the others only at averaging steps).
"""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.distributed import Strategy


class DDP(Strategy):
    name: ClassVar[str] = "ddp"
    description: ClassVar[str] = ("PyTorch DistributedDataParallel: gradients all-reduced every step "
                                  "(bulk-synchronous; gloo on CPU, NCCL on GPU).")
    options: ClassVar[frozenset[str]] = frozenset({"bucket_mb"})
    runtime: ClassVar[str] = "components.train.parallel:DDPRuntime"

    def validate(self, options: dict[str, Any]) -> dict[str, str]:
        bucket = options.get("bucket_mb", 25)
        if isinstance(bucket, bool) or not isinstance(bucket, int | float) or not 1 <= bucket <= 1024:
            return {"bucket_mb": "must be a number of MiB from 1 to 1024"}
        return {}

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"bucket_mb": float(options.get("bucket_mb", 25))}


class PostLocalSGD(Strategy):
    name: ClassVar[str] = "post-local-sgd"
    description: ClassVar[str] = ("PyTorch's PostLocalSGD: DDP for `warmup` steps, then local steps with the "
                                  "parameters averaged every `period` steps.")
    options: ClassVar[frozenset[str]] = frozenset({"period", "warmup"})
    runtime: ClassVar[str] = "components.train.parallel:PostLocalSGDRuntime"
    min_workers: ClassVar[int] = 2

    def validate(self, options: dict[str, Any]) -> dict[str, str]:
        errors = {}
        period = options.get("period", 4)
        if isinstance(period, bool) or not isinstance(period, int) or not 1 <= period <= 10_000:
            errors["period"] = "must be a whole number of steps from 1 to 10000"
        warmup = options.get("warmup", 0)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= 10**9:
            errors["warmup"] = "must be a whole number of steps, 0 or more"
        return errors

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"period": int(options.get("period", 4)), "warmup": int(options.get("warmup", 0))}
