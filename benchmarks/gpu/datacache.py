"""gpu-check part ``datacache``: PerFect with the model trained on a CUDA device, against the plain stream.

Both ways are the real train loop of a ``train`` job (:class:`components.train.component.TrainComponent`, the
``cnn-dataset`` workload, the generated-JPEG ``shapes-jpeg`` pipeline at a smaller size:
:func:`benchmarks.datacache.bench.small_definition`) with a context that grants the device, the same seed, epochs,
batch, learning rate and loader workers:

- **PerFect**: ``data: {cache: true, perfect: {}}`` (all automatic) on a cold node cache holding only the raw
  images;
- **plain**: ``data: {cache: false}``: every epoch preprocessed afresh by the same workers (the loop's own stream;
  the datacache benchmark's torch DataLoader way runs on the CPU only).

Figures: the wall time to the accuracy both ways reach (the lower of their best evaluations; the benchmark's
"time to the accuracy both finish at"), target 1.5x; and the final accuracy (mean of the last 3 evaluations).
On a GPU the training is fast next to the JPEG pipeline on the host, which is PerFect's premise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

DRY = {"train": 128, "test": 64, "epochs": 2, "workers": 1}
GPU = {"train": 2400, "test": 600, "epochs": 8, "workers": 8}
TARGET = 1.5
HIDDEN, BATCH, LR = 8, 128, 0.003


def train_way(definition: dict[str, Any], rec, sizes: dict[str, Any], cache_dir: Path, *, perfect: bool
              ) -> dict[str, Any]:
    import torch

    from components.runtime.contract.context import DeviceHandle, LocalContext
    from components.train.component import TrainComponent
    from components.train.spec import TrainSpec

    os.environ["STRATA_DATACACHE_DIR"] = str(cache_dir)
    data: dict[str, Any] = {"dataset": {"name": definition["dataset"], "definition": definition}, "cache": perfect,
                            "workers": sizes["workers"]}
    if perfect:
        data["perfect"] = {}
    spec = TrainSpec().validate({"workload": "cnn-dataset", "epochs": sizes["epochs"], "batch_size": BATCH, "lr": LR,
                                 "hidden": HIDDEN, "log_every": 10_000, "checkpoint_every": 10**6, "data": data})
    handles = []
    if rec.cuda:
        index = torch.device(rec.device).index or 0
        handles = [DeviceHandle("cuda", index, int(torch.cuda.get_device_properties(index).total_memory))]
    curve: list[list[float]] = []
    began = time.perf_counter()

    class Timed(LocalContext):
        def metrics(self, values, step):
            super().metrics(values, step)
            if "test_accuracy" in values:
                curve.append([time.perf_counter() - began, float(values["test_accuracy"])])

    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-datacache-") as directory:
        ctx = Timed(job_id="gpu-check", attempt_id="c" * 32, spec=spec, workdir=Path(directory), devices=handles)
        TrainComponent().run(ctx)
        reuse = [value for metric, value, _ in ctx.metric_points if metric == "data_reuse"]
    return {"curve": curve, "wall_s": time.perf_counter() - began, "reuse": reuse[-1] if reuse else 1,
            "device": rec.device}


def run(rec) -> None:
    from benchmarks.datacache.bench import small_definition

    sizes = rec.size(DRY, GPU)
    rec.detail("sizes", sizes)
    definition = small_definition(sizes["train"], sizes["test"])
    home = Path(tempfile.mkdtemp(prefix="strata-gpu-check-datacache-"))
    try:
        measure(rec, sizes, definition, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def measure(rec, sizes: dict[str, Any], definition: dict[str, Any], home: Path) -> None:
    from benchmarks.benchkit import Figure
    from benchmarks.datacache.bench import _fresh_cache, final_accuracy, seed_raw, time_to

    seeded = home / "seeded"
    if rec.step("generate", seed_raw, seeded, definition) is None and "generate" in rec.errors:
        return
    plain = rec.step("plain", train_way, definition, rec, sizes, _fresh_cache(seeded, home / "plain"), perfect=False)
    rec.detail("plain", plain)
    perfect = rec.step("perfect", train_way, definition, rec, sizes, _fresh_cache(seeded, home / "perfect"),
                       perfect=True)
    rec.detail("perfect", perfect)
    if not plain or not perfect or not plain["curve"] or not perfect["curve"]:
        return
    common = min(max(a for _, a in plain["curve"]), max(a for _, a in perfect["curve"]))
    ours, theirs = time_to(perfect["curve"], common), time_to(plain["curve"], common)
    rec.say(f"to accuracy {common:.3f}: PerFect {ours:.1f} s, plain {theirs:.1f} s (reuse {perfect['reuse']})")
    rec.figure(Figure("time_to_accuracy", f"wall time to the accuracy both reach ({common:.3f}): PerFect vs the "
                      "plain stream, training on the device", ours, theirs, "s", target=TARGET,
                      extra={"accuracy": common, "reuse": perfect["reuse"]}))
    rec.figure(Figure("final_accuracy", "final accuracy (mean of the last 3 evaluations): PerFect vs the plain stream",
                      final_accuracy(perfect["curve"]), final_accuracy(plain["curve"]), "accuracy",
                      lower_is_better=False))
