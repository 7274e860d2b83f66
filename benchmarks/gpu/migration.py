"""gpu-check part ``migration``: SwitchFlow's stage migration (issue 35, item 4) from the CUDA device to the CPU.

A low-priority staged training job (tiny-gpt, ``layers`` blocks, one stage per half block) runs on the device's
executor (PRIORITY policy); after 3 of its steps a high-priority job arrives and holds the device for
``hold_steps`` iterations. Preempt-only: the low job yields at its next stage boundary and waits. Migration
(``StagedWorkloadSession(..., migrate_to=MigrationTarget("cpu"))``, :mod:`components.gpushare.migration`): its next
stages run on a replica on the CPU -- the other device a one-GPU machine has -- synced after each optimizer step,
and it comes back when the device is free. Compared: the low job's completion time and its steps during the hold,
and how far the two runs' final weights are apart (the same steps on the same data; on CUDA against the CPU the
kernels differ, so not bit for bit).

The measurement is the gpushare benchmark's own (``benchmarks.gpushare.bench.held_by_job``, figure e, which runs
on two virtual devices) with the CUDA device passed through. While ``components.gpushare.migration`` does not exist the part
records ``not built``.
"""

from __future__ import annotations

import inspect
from typing import Any

DRY = {"layers": 2, "train_spec": {"hidden": 32, "batch_size": 4}, "low_steps": 10, "hold_steps": 4}
GPU = {"layers": 8, "train_spec": {"hidden": 256, "batch_size": 64}, "low_steps": 120, "hold_steps": 60}


def held_by_job(device, sizes: dict[str, Any], target: Any) -> dict[str, Any]:
    """The gpushare benchmark's held-by-a-job run (:func:`benchmarks.gpushare.bench.held_by_job`) on ``device``:
    no virtual kernel stream, no memory budget."""
    from benchmarks.gpushare.bench import held_by_job as bench_held_by_job

    return bench_held_by_job({"deep_layers": sizes["layers"], "train_spec": sizes["train_spec"],
                              "migration_low_steps": sizes["low_steps"], "migration_hold_steps": sizes["hold_steps"]},
                             None, target, device=device, budget=None)


def run(rec) -> None:
    try:
        from components.gpushare.migration import MigrationTarget
        from components.gpushare.stages import StagedWorkloadSession
    except ImportError as error:
        rec.status = "not built"
        rec.detail("reason", f"components.gpushare.migration is not there: {error}")
        return
    if "migrate_to" not in inspect.signature(StagedWorkloadSession).parameters:
        rec.status = "not built"
        rec.detail("reason", "StagedWorkloadSession takes no migrate_to")
        return
    from benchmarks.benchkit import Figure

    sizes = rec.size(DRY, GPU)
    rec.detail("sizes", sizes)
    # Untimed: the corpus, the kernels and the allocator's first use out of the measured runs.
    rec.step("warm-up", held_by_job, rec.device, {**sizes, "low_steps": 5, "hold_steps": 2},
             MigrationTarget("cpu", name="cpu"))
    preempt = rec.step("preempt_only", held_by_job, rec.device, sizes, None)
    migrated = rec.step("migration", held_by_job, rec.device, sizes, MigrationTarget("cpu", name="cpu"))
    if not preempt or not migrated:
        return
    gap = max(float((a.float() - b.float()).abs().max()) for a, b in
              zip(preempt.pop("weights"), migrated.pop("weights"), strict=True))
    rec.details.update({"preempt_only": preempt, "migration": migrated, "max_weight_difference": gap})
    rec.say(f"low JCT preempt-only {preempt['low_jct_s']:.2f} s ({preempt['low_steps_during_hold']} steps during the "
            f"hold), migration {migrated['low_jct_s']:.2f} s ({migrated['low_steps_during_hold']} steps); weights "
            f"apart by at most {gap:.3g}")
    rec.figure(Figure("low_jct", "low-priority job's completion time while a high-priority job holds the device: "
                      "migration to the CPU vs preempt-only", migrated["low_jct_s"], preempt["low_jct_s"], "s",
                      extra={"steps_during_hold": migrated["low_steps_during_hold"],
                             "preempt_only_steps_during_hold": preempt["low_steps_during_hold"],
                             "max_weight_difference": gap}))
