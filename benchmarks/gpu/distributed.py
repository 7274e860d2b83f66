"""gpu-check part ``distributed``: the train kind's data-parallel path (``distributed: {strategy: ddp}``) with its
tensors on a CUDA device.

Each rank is a process running the train loop (:class:`components.train.loop.TrainLoop`) with a
:class:`~components.runtime.contract.context.LocalContext` that grants it the device (the rendezvous through a
shared file, as local runs do), so the loop joins its process group through
:func:`components.runtime.node.gang.init_gang` and wraps the model in DDP exactly as a node's rank does. The ways:

- ``single``: one process, no process group (the baseline);
- ``gloo``: 2 ranks on the one device, gloo all-reducing CUDA tensors (NCCL refuses two ranks on one GPU);
- ``nccl``: 1 rank with NCCL (the NCCL path as far as one device allows: the group, the DDP wrapping and its
  all-reduces), only on CUDA.

Figures: the samples per second of 2 gloo ranks against one process (a report: two ranks share one device), and
NCCL's one-rank step time against the plain loop's (the cost of the NCCL path itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DRY = {"workload": "mlp-digits", "steps": 20, "batch_size": 32, "hidden": 32}
GPU = {"workload": "cnn-synthetic", "steps": 300, "batch_size": 128, "hidden": 64}


def rank_main(arguments: argparse.Namespace) -> None:
    import torch

    from components.runtime.contract.context import DeviceHandle, LocalContext
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    device = arguments.device
    if device == "cpu":
        torch.set_num_threads(1)
        handles = []
    else:
        index = torch.device(device).index or 0
        handles = [DeviceHandle("cuda", index, int(torch.cuda.get_device_properties(index).total_memory))]
    spec = TrainSpec().validate(json.loads(arguments.spec))
    ctx = LocalContext(job_id="gpu-check", attempt_id="gpu-check-1", spec=spec, rank=arguments.rank,
                       world_size=arguments.world, workdir=Path(arguments.workdir), devices=handles)
    loop = TrainLoop(builtin_workload(spec["workload"]), spec, ctx)
    loop.start()
    for _ in range(3):  # warm-up steps (kernels, allocator, the group's first all-reduce)
        loop.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    began, steps = time.perf_counter(), loop.step_count
    loop.run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    if arguments.rank == 0:
        gang = getattr(loop, "gang", None)
        result = {"seconds": seconds, "steps": loop.step_count - steps, "world": arguments.world,
                  "backend": getattr(gang, "backend", None), "device": str(loop.device),
                  "batch_size": spec["batch_size"]}
        result["step_s"] = seconds / max(result["steps"], 1)
        result["samples_per_s"] = result["steps"] * spec["batch_size"] * arguments.world / seconds
        Path(arguments.output).write_text(json.dumps(result))


def gang(device: str, sizes: dict[str, Any], world: int, backend: str | None) -> dict[str, Any]:
    spec = {"workload": sizes["workload"], "max_steps": sizes["steps"], "batch_size": sizes["batch_size"],
            "hidden": sizes["hidden"], "log_every": 10**6, "checkpoint_every": 10**9, "epochs": 1000}
    if backend:
        spec["distributed"] = {"strategy": "ddp", "backend": backend}
    from benchmarks.straggler.bench import run_ranks

    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-ddp-") as directory:
        output = Path(directory) / "result.json"
        run_ranks(lambda rank: [sys.executable, "-m", "benchmarks.gpu.distributed", "--rank", str(rank), "--world",
                                str(world), "--workdir", directory, "--spec", json.dumps(spec), "--device", device,
                                "--output", str(output)],
                  world, 600, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
        return json.loads(output.read_text())


def run(rec) -> None:
    from benchmarks.benchkit import Figure

    sizes = rec.size(DRY, GPU)
    rec.detail("sizes", sizes)
    single = rec.step("single", gang, rec.device, sizes, 1, None)
    rec.detail("single", single)
    gloo = rec.step("gloo", gang, rec.device, sizes, 2, "gloo")
    rec.detail("gloo", gloo)
    if single and gloo:
        rec.figure(Figure("ddp_gloo", f"samples/s, DDP over gloo with {'CUDA' if rec.cuda else 'CPU'} tensors, 2 ranks "
                          "on one device, vs one process", gloo["samples_per_s"], single["samples_per_s"],
                          "samples/s", lower_is_better=False, extra={"backend": gloo["backend"]}))
    if not rec.cuda:
        rec.detail("nccl", "not run: NCCL needs a CUDA device (dry run)")
        return
    nccl = rec.step("nccl", gang, rec.device, sizes, 1, "nccl")
    rec.detail("nccl", nccl)
    if single and nccl:
        rec.figure(Figure("ddp_nccl_one_rank", "step time, DDP over NCCL with one rank (all the path one device "
                          "allows) vs the plain loop", nccl["step_s"], single["step_s"], "s",
                          extra={"backend": nccl["backend"]}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of gpu-check's distributed part")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", required=True)
    rank_main(parser.parse_args())
