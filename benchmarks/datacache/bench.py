"""``strata bench datacache``: PerFect and the shared node cache against a plain DataLoader and data echoing.

What one run measures, on this machine, with the same number of loader workers (2) and torch threads (2) every
way, and the same model (train's ``cnn-dataset`` CNN, width 8), optimizer (Adam, lr 0.003), batch size (128),
seed and epoch budget:

1. **Wall time to a target accuracy** on the built-in ``shapes-jpeg`` dataset (6,000 generated 128x128 JPEGs:
   decode, random resized crop, flip, rotation, colour jitter and blur at 96x96, resize to 32x32: about 2 ms of
   CPU a sample, three times what training a sample costs) three ways:

   - (a) **PerFect**: a real ``train`` job's loop (``data: {dataset: shapes-jpeg, cache: true, perfect: {}}``,
     all automatic) on a cold node cache;
   - (b) a plain **torch DataLoader** (2 worker processes, persistent, the default prefetch) whose Dataset does the
     same pipeline per sample, fresh every epoch;
   - (c) plain **data echoing** (Choi et al. 2019, batch echoing after augmentation): the same DataLoader, each
     fresh batch trained on ``e`` times, ``e`` = the reuse PerFect chose, for the same number of optimizer steps.

   Every way evaluates on the same held-out set after each epoch; the figure is the wall time from the start
   (test-set preprocessing included) to the first evaluation at or above the target, and the final accuracy
   after the whole budget is reported beside it (the target: within 0.5 point of the DataLoader's).
2. **Preprocessing CPU-seconds for N concurrent trials**: N train jobs on one pipeline started together, each in
   its own process, with the node cache (``cache: true``) against each preprocessing alone (``cache: false``):
   the CPU-seconds their loader workers spent, summed. Target: cut by (N-1)/N (ratio >= N).
3. **Sweep makespan with the cache**: a real ``tune`` job (Fluid, on a local ``strata up`` with 2 virtual GPUs)
   over ``cnn-dataset`` on a registered image-folder dataset, with ``data: {cache: true}`` against without; the
   tuning issue's Fluid result without the cache is the baseline. The ratio is reported (no target).

Each way runs in a fresh process, 3 runs; the figures are medians with the range.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.benchkit import Figure, document, figures_table, percentile, progress, write

WORKERS = 2
THREADS = 2
HIDDEN = 8
BATCH = 128
LR = 0.003
TARGET = 0.85
EPOCHS = {"full": 12, "quick": 2}
TRIALS = 4
TRIAL_EPOCHS = 2


def _builtin(name: str) -> dict[str, Any]:
    from components.datacache.datasets import BUILTINS, definition

    return definition({"name": name, **BUILTINS[name]})


def small_definition(train: int, test: int) -> dict[str, Any]:
    """A generated-JPEG dataset like shapes-jpeg, smaller (the quick run, the concurrent trials)."""
    return {**_builtin("shapes-jpeg"), "dataset": f"bench-shapes-{train}", "train": train, "test": test}


def seed_raw(root: Path, definition: dict[str, Any]) -> None:
    """Generate the dataset's raw JPEGs into the cache at ``root`` (not timed: it stands for the download)."""
    from components.datacache import pipeline as pipelines
    from components.datacache.source import DatasetEpochs
    from components.datacache.store import CacheStore

    store = CacheStore(root)
    key = DatasetEpochs._key_of(definition, "raw")
    pool = pipelines.worker_pool(WORKERS)
    try:
        store.get(key, lambda: pipelines.generate_raw(definition, pool), {"dataset": definition["dataset"],
                                                                         "part": "raw"})
    finally:
        pool.shutdown()


# -- one way, in a process of its own ----------------------------------------------------------------------------
def _timed_context(spec: dict[str, Any], workdir: Path, began: float):
    from components.runtime.contract.context import LocalContext

    class Timed(LocalContext):
        curve: list[list[float]] = []

        def metrics(self, values, step):
            super().metrics(values, step)
            if "test_accuracy" in values:
                self.curve.append([time.perf_counter() - began, float(values["test_accuracy"])])

    context = Timed(job_id="bench", attempt_id="b" * 32, spec=spec, workdir=workdir)
    context.curve = []
    return context


def way_perfect(definition: dict[str, Any], epochs: int, *, cache: bool = True, perfect: bool | dict = True,
                workers: int = WORKERS) -> dict[str, Any]:
    """The real train loop on the stream of epochs (PerFect, with its options when ``perfect`` is a dict, or
    plain with the cache when it is off)."""
    from components.train.component import TrainComponent
    from components.train.spec import TrainSpec

    data: dict[str, Any] = {"dataset": {"name": definition["dataset"], "definition": definition}, "cache": cache,
                            "workers": workers}
    if perfect is not False:  # True or a dict of options ({} is all automatic, not off)
        data["perfect"] = perfect if isinstance(perfect, dict) else {}
    spec = TrainSpec().validate({"workload": "cnn-dataset", "epochs": epochs, "batch_size": BATCH, "lr": LR,
                                 "hidden": HIDDEN, "log_every": 10_000, "checkpoint_every": 10**6, "data": data})
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="strata-bench-datacache-") as directory:
        ctx = _timed_context(spec, Path(directory), began)
        TrainComponent().run(ctx)
    points = {name: [value for metric, value, _ in ctx.metric_points if metric == name]
              for name in ("data_reuse", "data_phase", "data_prep_cpu_s", "data_wait_s")}
    return {"curve": ctx.curve, "wall_s": time.perf_counter() - began,
            "reuse": points["data_reuse"][-1] if points["data_reuse"] else 1,
            "phase_1_epochs": sum(1 for value in points["data_phase"] if value == 1),
            "prep_cpu_s": points["data_prep_cpu_s"][-1] if points["data_prep_cpu_s"] else 0.0,
            "waited_s": sum(points["data_wait_s"])}


def way_dataloader(definition: dict[str, Any], epochs: int, *, echo: int = 1) -> dict[str, Any]:
    """A plain torch DataLoader doing the same pipeline per sample, fresh each epoch; ``echo`` > 1 trains on
    every fresh batch ``echo`` times (batch echoing), reading ``epochs / echo`` fresh epochs for the same steps."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from components.datacache import pipeline as pipelines
    from components.datacache.source import DatasetEpochs
    from components.datacache.store import CacheStore
    from components.train.workloads import CNNDataset, derive_seed

    torch.set_num_threads(THREADS)
    raw_arrays, _ = CacheStore().get(DatasetEpochs._key_of(definition, "raw"),
                                     lambda: pipelines.generate_raw(definition), {})
    samples = pipelines.unpack_raw(raw_arrays)
    labels = np.asarray(raw_arrays["labels"], dtype=np.int64)
    train_rows = np.arange(int(definition["train"]))
    test_rows = np.arange(int(definition["train"]), len(samples))

    class Augmented(torch.utils.data.Dataset):
        def __len__(self):
            return len(train_rows)

        def __getitem__(self, item):
            epoch, index = item
            row = int(train_rows[index])
            x = pipelines.preprocess(samples[row], definition, epoch, row)
            return torch.from_numpy(x), int(labels[row])

    class EpochBatches(torch.utils.data.Sampler):
        """Batches of ``(epoch, index)``, epoch by epoch (a batch never straddles two epochs), shuffled per epoch."""

        def __init__(self, fresh_epochs: int):
            self.fresh_epochs = fresh_epochs

        def __len__(self):
            return self.fresh_epochs * -(-len(train_rows) // BATCH)

        def __iter__(self):
            for epoch in range(self.fresh_epochs):
                order = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(
                    derive_seed(0, "order", epoch))).tolist()
                for start in range(0, len(order), BATCH):
                    yield [(epoch, index) for index in order[start:start + BATCH]]

    began = time.perf_counter()
    raw = pipelines.Raw(samples, labels, train_rows, test_rows, int(definition["classes"]))
    pool = pipelines.worker_pool(WORKERS)
    try:
        test = pipelines.build_variant(raw, definition, pipelines.TEST_VARIANT, pool, WORKERS)
    finally:
        pool.shutdown()
    x_test, y_test = torch.from_numpy(test["x"]).float().div_(127.5).sub_(1.0), torch.from_numpy(test["y"])
    config = {"in_channels": 3, "size": int(definition["size"]), "hidden": HIDDEN, "classes": raw.classes}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(0, "init"))
        model = CNNDataset.from_config(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    steps_per_epoch = -(-len(train_rows) // BATCH)
    fresh_epochs = -(-epochs // echo)
    loader = torch.utils.data.DataLoader(Augmented(), batch_sampler=EpochBatches(fresh_epochs),
                                         num_workers=WORKERS, persistent_workers=True)
    curve, steps = [], 0

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        correct = sum(int((model(x_test[i:i + 1024]).argmax(1) == y_test[i:i + 1024]).sum())
                      for i in range(0, len(x_test), 1024))
        model.train()
        return correct / len(x_test)

    model.train()
    for images, targets in loader:
        inputs = images.float().div_(127.5).sub_(1.0)
        for _ in range(echo):
            loss = F.cross_entropy(model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % steps_per_epoch == 0:
                curve.append([time.perf_counter() - began, evaluate()])
            if steps >= epochs * steps_per_epoch:
                break
        if steps >= epochs * steps_per_epoch:
            break
    del loader
    return {"curve": curve, "wall_s": time.perf_counter() - began, "echo": echo}


def way_trial(definition: dict[str, Any], epochs: int, cache: bool) -> dict[str, Any]:
    """One tuning trial's data work: the train loop, plain epochs, with or without the node cache."""
    return way_perfect(definition, epochs, cache=cache, perfect=False, workers=1)


def _one(args: argparse.Namespace) -> None:
    definition = json.loads(args.definition)
    if args.way == "perfect":
        answer = way_perfect(definition, args.epochs, perfect=json.loads(args.perfect) if args.perfect else True)
    elif args.way == "dataloader":
        answer = way_dataloader(definition, args.epochs)
    elif args.way == "echo":
        answer = way_dataloader(definition, args.epochs, echo=args.echo)
    else:
        answer = way_trial(definition, args.epochs, cache=args.way == "trial-cached")
    print("RESULT " + json.dumps(answer))


def run_way(way: str, definition: dict[str, Any], epochs: int, cache_dir: Path, *, echo: int = 1,
            wait: bool = True, perfect: dict[str, Any] | None = None) -> Any:
    """``way`` in a fresh process with the node cache at ``cache_dir``: its result, or the running process."""
    env = {**os.environ, "STRATA_DATACACHE_DIR": str(cache_dir), "STRATA_TORCH_THREADS": str(THREADS),
           "OMP_NUM_THREADS": str(THREADS)}
    command = [sys.executable, "-m", "benchmarks.datacache.bench", "--way", way, "--epochs", str(epochs),
               "--echo", str(echo), "--definition", json.dumps(definition),
               *(["--perfect", json.dumps(perfect)] if perfect is not None else [])]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return _result(process, way) if wait else process


def _result(process: subprocess.Popen, way: str) -> dict[str, Any]:
    out, err = process.communicate(timeout=3600)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"bench way {way} failed (exit {process.returncode}): {err.strip()[-2000:]}")


def final_accuracy(curve: list[list[float]], last: int = 3) -> float | None:
    """The mean of the last ``last`` evaluations of a run (None for a run with none)."""
    tail = [accuracy for _, accuracy in curve[-last:]]
    return sum(tail) / len(tail) if tail else None


def time_to(curve: list[list[float]], target: float) -> float | None:
    return next((seconds for seconds, accuracy in curve if accuracy >= target), None)


def _fresh_cache(seeded: Path, into: Path) -> Path:
    """A cold node cache holding only the raw dataset (copied from ``seeded``)."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(seeded, into)
    return into


# -- the parts --------------------------------------------------------------------------------------------------
def accuracy_runs(runs: int, quick: bool, say) -> dict[str, Any]:
    definition = small_definition(600, 200) if quick else _builtin("shapes-jpeg")
    epochs = EPOCHS["quick" if quick else "full"]
    home = Path(tempfile.mkdtemp(prefix="strata-bench-datacache-"))
    try:
        say(f"generating {definition['dataset']} ({definition['train'] + definition['test']} JPEGs), once")
        seed_raw(home / "seeded", definition)
        results: dict[str, list[dict[str, Any]]] = {"perfect": [], "dataloader": [], "echo": []}
        for run in range(runs):
            say(f"run {run + 1}/{runs}: PerFect (train loop, cold node cache)")
            perfect = run_way("perfect", definition, epochs, _fresh_cache(home / "seeded", home / "cache"))
            results["perfect"].append(perfect)
            say(f"run {run + 1}/{runs}: torch DataLoader, {WORKERS} workers")
            results["dataloader"].append(run_way("dataloader", definition, epochs, home / "seeded"))
            echo = max(2, int(perfect["reuse"]))
            say(f"run {run + 1}/{runs}: data echoing x{echo}")
            results["echo"].append(run_way("echo", definition, epochs, home / "seeded", echo=echo))
        return {"definition": definition["dataset"], "epochs": epochs, "target": TARGET, "runs": results}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def trial_runs(runs: int, quick: bool, say) -> dict[str, Any]:
    definition = small_definition(400, 100) if quick else small_definition(1500, 300)
    trials = 2 if quick else TRIALS
    home = Path(tempfile.mkdtemp(prefix="strata-bench-datacache-trials-"))
    try:
        seed_raw(home / "seeded", definition)
        found: dict[str, list[float]] = {"cached": [], "alone": []}
        for run in range(runs):
            for way in ("cached", "alone") if run % 2 == 0 else ("alone", "cached"):
                say(f"run {run + 1}/{runs}: {trials} concurrent trials, {way}")
                cache = _fresh_cache(home / "seeded", home / f"cache-{way}")
                processes = [run_way(f"trial-{way}", definition, TRIAL_EPOCHS, cache, wait=False)
                             for _ in range(trials)]
                answers = [_result(process, f"trial-{way}") for process in processes]
                found[way].append(sum(answer["prep_cpu_s"] for answer in answers))
        return {"trials": trials, "epochs": TRIAL_EPOCHS, "cpu_s": found}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def sweep_runs(runs: int, quick: bool, say) -> dict[str, Any]:
    """A real tune job over a registered image-folder dataset, with and without the node cache."""
    from benchmarks.tuning.bench import StrataSweeps
    from components.datacache import pipeline as pipelines

    home = Path(tempfile.mkdtemp(prefix="strata-bench-datacache-sweep-"))
    count, trials, iterations = (300, 2, 2) if quick else (1000, 6, 3)
    folder = home / "images"
    for index in range(count):
        data, label = pipelines.generated_image(index, 128, 8, 1)
        (folder / f"class-{label}").mkdir(parents=True, exist_ok=True)
        (folder / f"class-{label}" / f"{index}.jpg").write_bytes(data)
    sweeps = StrataSweeps(gpus=2)
    try:
        sweeps.client.post("datasets/", {"name": "bench-folder", "source": {"path": str(folder)},
                                         "format": "image-folder", "size": 32})
        found: dict[str, list[float]] = {"cached": [], "plain": []}
        for run in range(runs):
            for way in ("cached", "plain") if run % 2 == 0 else ("plain", "cached"):  # neither always goes first
                say(f"run {run + 1}/{runs}: tune sweep, {trials} trials, {way}")
                body = {"name": f"bench-datacache-{way}-{run}", "kind": "tune", "resources": {"gpus": 2},
                        "max_attempts": 1, "time_limit": 3600,
                        "spec": {"space": {"lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2}},
                                 "metric": "test_accuracy", "mode": "max", "trials": trials,
                                 "max_iterations": iterations, "seed": run, "searcher": {"name": "random"},
                                 "scheduler": {"name": "asha", "options": {"grace_period": 1,
                                                                           "reduction_factor": 3}},
                                 "packing": 4, "max_gpus_per_trial": 1,
                                 "data": {"dataset": "bench-folder", "cache": way == "cached", "workers": 1},
                                 "trainable": {"kind": "train", "spec": {
                                     "workload": "cnn-dataset", "batch_size": BATCH, "hidden": HIDDEN,
                                     "lr": "{{lr}}"}}}}
                answer = sweeps.run(way, workload="cnn-dataset", trials=trials, iterations=iterations, seed=run,
                                    body=body)
                found[way].append(answer["makespan_s"])
        return {"trials": trials, "iterations": iterations, "images": count, "makespan_s": found}
    finally:
        sweeps.stop()
        shutil.rmtree(home, ignore_errors=True)


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return percentile(present, 0.5) if len(present) == len(values) and present else None


def _range(values: list[float | None]) -> list[float] | None:
    present = [value for value in values if value is not None]
    return [min(present), max(present)] if present else None


def figures(results: dict[str, Any]) -> list[Figure]:
    found: list[Figure] = []
    accuracy = results.get("accuracy")
    if accuracy:
        target, runs = accuracy["target"], accuracy["runs"]
        times = {way: [time_to(run["curve"], target) for run in runs[way]] for way in runs}
        # One evaluation swings by several points from epoch to epoch here (Adam at a constant rate): the final
        # accuracy is the mean of the last three, every way.
        finals = {way: [final_accuracy(run["curve"]) for run in runs[way]] for way in runs}
        reuse = [run["reuse"] for run in runs["perfect"]]
        for way, text in (("dataloader", f"torch DataLoader, {WORKERS} workers, fresh every epoch"),
                          ("echo", "data echoing (batch echoing after augmentation, e = PerFect's reuse)")):
            found.append(Figure(
                f"time_to_accuracy_vs_{way}", f"wall time to test accuracy {target:g} ({accuracy['definition']}, "
                f"{accuracy['epochs']}-epoch budget, median of {len(runs[way])})",
                _median(times["perfect"]), _median(times[way]), "s", lower_is_better=True,
                target=1.5 if way == "dataloader" else None,
                mechanism_text=f"PerFect (auto: reuse {reuse}), node cache",
                baseline_text=text,
                extra={"runs": {"mechanism": times["perfect"], "baseline": times[way]},
                       "range": {"mechanism": _range(times["perfect"]), "baseline": _range(times[way])},
                       "final_accuracy": {"mechanism": finals["perfect"], "baseline": finals[way]}}))
        # Echoing may never reach the target: compare at the accuracy both finish at (the lower of the two
        # median finals), the time each takes to first reach it.
        medians = [_median(finals["perfect"]), _median(finals["echo"])]
        if None not in medians:
            level = round(min(medians), 4)
            equal = {way: [time_to(run["curve"], level) for run in runs[way]] for way in ("perfect", "echo")}
            found.append(Figure(
                "time_to_equal_accuracy_vs_echo", f"wall time to the accuracy PerFect and data echoing both finish "
                f"at ({level:g}, the lower median final), {accuracy['definition']}, median of {len(runs['echo'])}",
                _median(equal["perfect"]), _median(equal["echo"]), "s", lower_is_better=True, target=1.2,
                mechanism_text=f"PerFect (auto: reuse {reuse}), node cache",
                baseline_text="data echoing (batch echoing after augmentation, e = PerFect's reuse)",
                extra={"level": level, "runs": {"mechanism": equal["perfect"], "baseline": equal["echo"]},
                       "range": {"mechanism": _range(equal["perfect"]), "baseline": _range(equal["echo"])}}))
        gap = [None if a is None or b is None else (a - b) * 100 for a, b in zip(finals["perfect"],
                                                                                finals["dataloader"], strict=True)]
        median_gap = _median(gap)
        found.append(Figure(
            "final_accuracy_gap", "final test accuracy (mean of the last 3 epochs' evaluations), PerFect against the "
            "DataLoader (target: no worse than 0.5 point below)", _median(finals["perfect"]), _median(finals["dataloader"]), "accuracy",
            lower_is_better=False, target=None,
            extra={"gap_points": median_gap, "gap_runs": gap,
                   "met": None if median_gap is None else median_gap >= -0.5}))
    trials = results.get("trials")
    if trials:
        cpu = trials["cpu_s"]
        count = trials["trials"]
        found.append(Figure(
            "trial_preprocessing_cpu", f"preprocessing CPU-seconds of {count} concurrent trials, "
            f"{trials['epochs']} epochs each (target: cut by {count - 1}/{count})",
            _median(cpu["cached"]), _median(cpu["alone"]), "cpu-s", lower_is_better=True, target=float(count),
            mechanism_text="one node cache shared by the trials", baseline_text="each trial preprocessing alone",
            extra={"runs": cpu, "range": {"mechanism": _range(cpu["cached"]), "baseline": _range(cpu["alone"])}}))
    sweep = results.get("sweep")
    if sweep:
        makespan = sweep["makespan_s"]
        found.append(Figure(
            "sweep_makespan", f"tune sweep makespan, {sweep['trials']} trials x {sweep['iterations']} epochs of "
            f"cnn-dataset on {sweep['images']} registered JPEGs (Fluid, 2 virtual GPUs)",
            _median(makespan["cached"]), _median(makespan["plain"]), "s", lower_is_better=True,
            mechanism_text="Fluid + the node cache (data: {cache: true})",
            baseline_text="Fluid without the cache (the tuning issue's result)",
            extra={"runs": makespan, "range": {"mechanism": _range(makespan["cached"]),
                                               "baseline": _range(makespan["plain"])}}))
    return found


def main(quick: bool = False, output: str | None = None, parts: tuple[str, ...] = ("accuracy", "trials", "sweep"),
         runs: int | None = None) -> int:
    say = progress("[datacache] ")
    runs = runs or (1 if quick else 3)
    results: dict[str, Any] = {}
    if "accuracy" in parts:
        results["accuracy"] = accuracy_runs(runs, quick, say)
    if "trials" in parts:
        results["trials"] = trial_runs(runs, quick, say)
    if "sweep" in parts:
        results["sweep"] = sweep_runs(runs, quick, say)
    doc = document("datacache", quick, figures(results), details=results)
    write(doc, output)
    print(figures_table(doc))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--way")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--echo", type=int, default=1)
    parser.add_argument("--perfect", help="PerFect's options for --way perfect, as JSON (default: all automatic)")
    parser.add_argument("--definition")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--parts", default="accuracy,trials,sweep")
    parser.add_argument("--runs", type=int)
    arguments = parser.parse_args()
    if arguments.way:
        _one(arguments)
    else:
        sys.exit(main(arguments.quick, arguments.output, tuple(arguments.parts.split(",")), arguments.runs))
