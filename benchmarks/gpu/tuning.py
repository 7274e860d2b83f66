"""gpu-check part ``tuning``: a sweep's trials packed onto one GPU, against one trial per GPU and against Ray Tune
with fractional ``num_gpus``, on the same device.

The trials are the tune job's: the configurations its seeded random searcher draws
(:func:`benchmarks.tuning.bench.drawn_configs`), each the train kind's own loop and workload
(:class:`components.train.loop.TrainLoop`) for ``iterations`` epochs on the device, no early stopping (equal work
every way). The ways:

- **packed** (Fluid's slots on a GPU): ``packing`` trial processes share the device at once, each capped at
  ``1/packing`` of its memory (``torch.cuda.set_per_process_memory_fraction``, as the node's child process does for
  a fractional share), each taking the next trial from the sweep as it finishes one (a shared queue);
- **one per GPU** (the baseline of "packing adds compute"): one trial process, the trials one after another;
- **Ray Tune** (in ``.venv-peers``, built by ``make bench-peers``; without it the part records "peer missing"):
  ``tune.with_resources(trainable, {"gpu": 1/packing, "cpu": cores/packing})``, ``reuse_actors=True`` (its best
  configuration), ``max_concurrent_trials=packing``, the same trainable code on the device Ray assigns.

Makespan: from the first process started to the last trial finished (Ray: ``Tuner.fit``, its actor starts
included, ``ray.init`` not). This is not the tune job through the control plane: the local stack the tuning
benchmark runs gives virtual GPUs only, so the tune job's water-filling on a real GPU is not measured here.
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

DRY = {"workload": "mlp-digits", "trials": 2, "iterations": 1, "packing": 2}
GPU = {"workload": "cnn-synthetic", "trials": 12, "iterations": 2, "packing": 4}
TARGET_PACKED = 1.67  # issue 35: on a GPU, where packing adds compute
TARGET_VS_RAY = 1.0
METRIC = "test_accuracy"
ROOT = Path(__file__).resolve().parents[2]


def one_trial(params: dict[str, Any], *, workload: str, iterations: int, device: str, workdir: str,
              report=None) -> dict[str, Any]:
    """One trial: the train loop with ``params`` for ``iterations`` epochs on ``device``; its best accuracy."""
    from components.runtime.contract.context import LocalContext
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    spec = TrainSpec().validate({"workload": workload, "batch_size": 64, **params, "epochs": iterations,
                                 "checkpoint_every": 10**9})
    ctx = LocalContext(job_id="trial", attempt_id="a", spec=spec, workdir=Path(workdir))
    began = time.perf_counter()
    loop = TrainLoop(builtin_workload(workload), spec, ctx, device=device, owns_process=False)
    loop.start()
    best, reported = None, 0
    while not loop.done:
        loop.step()
        epochs = loop.step_count // loop.steps_per_epoch
        if epochs > reported and loop.last_eval:
            reported = epochs
            value = float(loop.last_eval[METRIC])
            best = value if best is None else max(best, value)
            if report is not None:
                report(reported, value)
    return {"best": best, "seconds": time.perf_counter() - began, "steps": loop.step_count}


def _claim(queue: Path, index: int) -> bool:
    try:
        os.close(os.open(queue / f"{index}.claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def trials_main(arguments: argparse.Namespace) -> None:
    """A trial process: take trials from the queue directory until none is left; one JSON line per trial."""
    import torch

    device = arguments.device
    if device.startswith("cuda") and arguments.share < 1:
        torch.cuda.set_per_process_memory_fraction(arguments.share, torch.device(device))
    if device == "cpu":
        torch.set_num_threads(1)
    configs = json.loads(Path(arguments.configs).read_text())
    queue = Path(arguments.queue)
    for index, params in enumerate(configs):
        if not _claim(queue, index):
            continue
        with tempfile.TemporaryDirectory(prefix="strata-gpu-check-trial-") as workdir:
            result = one_trial(params, workload=arguments.workload, iterations=arguments.iterations, device=device,
                               workdir=workdir)
        print("TRIAL " + json.dumps({"index": index, **result}), flush=True)


def strata_way(device: str, configs: list[dict[str, Any]], sizes: dict[str, Any], processes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-sweep-") as directory:
        path = Path(directory) / "configs.json"
        path.write_text(json.dumps(configs))
        queue = Path(directory) / "queue"
        queue.mkdir()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        began = time.perf_counter()
        children = [subprocess.Popen(
            [sys.executable, "-m", "benchmarks.gpu.tuning", "--configs", str(path), "--queue", str(queue),
             "--device", device, "--share", str(1 / processes), "--workload", sizes["workload"],
             "--iterations", str(sizes["iterations"])], env=env, cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for _ in range(processes)]
        trials = []
        for child in children:
            out, err = child.communicate(timeout=900)
            if child.returncode != 0:
                raise RuntimeError(f"a trial process failed ({child.returncode}): {err.strip()[-2000:]}")
            trials += [json.loads(line[len("TRIAL "):]) for line in out.splitlines() if line.startswith("TRIAL ")]
        makespan = time.perf_counter() - began
    if len(trials) != len(configs):
        raise RuntimeError(f"{len(trials)} of {len(configs)} trials reported")
    best = [trial["best"] for trial in trials if trial["best"] is not None]
    return {"makespan_s": makespan, "processes": processes, "trials": len(trials), "best": max(best, default=None),
            "trial_seconds": sorted(trial["seconds"] for trial in trials)}


def ray_main(arguments: argparse.Namespace) -> None:
    """In the peers' interpreter: Ray Tune on the same trials with fractional GPUs; writes the result JSON."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["PYTHONPATH"] = str(ROOT)
    import ray
    from ray import tune

    configs = json.loads(Path(arguments.configs).read_text())
    workload, iterations, packing = arguments.workload, arguments.iterations, int(1 / arguments.share + 0.5)
    cores = os.cpu_count() or 1
    scratch = tempfile.mkdtemp(prefix="strata-gpu-check-ray-")
    gpu = arguments.device.startswith("cuda")

    def trainable(config: dict[str, Any]) -> None:
        import torch

        if not gpu:
            torch.set_num_threads(1)
        device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
        one_trial(configs[config["index"]], workload=workload, iterations=iterations, device=device,
                  workdir=os.path.join(scratch, str(config["index"])),
                  report=lambda _iteration, value: tune.report({METRIC: value}))

    ray.init(num_cpus=cores, num_gpus=1, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    try:
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": cores / packing, "gpu": 1 / packing}),
            param_space={"index": tune.grid_search(list(range(len(configs))))},
            tune_config=tune.TuneConfig(metric=METRIC, mode="max", max_concurrent_trials=packing, reuse_actors=True),
            run_config=tune.RunConfig(storage_path=scratch, verbose=0),
        )
        began = time.perf_counter()
        grid = tuner.fit()
        makespan = time.perf_counter() - began
    finally:
        ray.shutdown()
    best = [float(result.metrics[METRIC]) for result in grid if not result.error and METRIC in (result.metrics or {})]
    Path(arguments.output).write_text(json.dumps({
        "makespan_s": makespan, "trials": len(grid), "errors": sum(1 for result in grid if result.error),
        "best": max(best, default=None), "gpu_fraction": 1 / packing, "reuse_actors": True}))
    shutil.rmtree(scratch, ignore_errors=True)


def ray_way(python: str, device: str, configs: list[dict[str, Any]], sizes: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="strata-gpu-check-ray-") as directory:
        path, output = Path(directory) / "configs.json", Path(directory) / "result.json"
        path.write_text(json.dumps(configs))
        done = subprocess.run([python, "-m", "benchmarks.gpu.tuning", "--ray", "--configs", str(path), "--device",
                               device, "--share", str(1 / sizes["packing"]), "--workload", sizes["workload"],
                               "--iterations", str(sizes["iterations"]), "--output", str(output)],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
                              timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"Ray Tune failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
        return json.loads(output.read_text())


def sweep_configs(rec, trials: int, workload: str) -> list[dict[str, Any]]:
    """The tune job's draws; where its searcher cannot run (Optuna is not in a lent GPU machine's image), a seeded
    draw of gpu-check's own from the same space (every way still runs the same configurations)."""
    import math
    import random

    from benchmarks.tuning.bench import SWEEP_SPACES, drawn_configs

    try:
        return drawn_configs(trials, 0, workload)
    except ImportError as error:
        rec.lack(f"the tune job's searcher ({error}): configurations drawn by gpu-check's own seeded draw")
    rng = random.Random(0)
    configs = []
    for _ in range(trials):
        config: dict[str, Any] = {}
        for name, domain in SWEEP_SPACES[workload].items():
            if domain["type"] == "choice":
                config[name] = rng.choice(domain["values"])
            elif domain["type"] == "loguniform":
                config[name] = math.exp(rng.uniform(math.log(domain["low"]), math.log(domain["high"])))
            else:
                config[name] = rng.uniform(domain["low"], domain["high"])
        configs.append(config)
    return configs


def run(rec) -> None:
    from benchmarks.benchkit import Figure, peers_python

    sizes = rec.size(DRY, GPU)
    rec.detail("sizes", sizes)
    configs = sweep_configs(rec, sizes["trials"], sizes["workload"])
    rec.detail("configs", configs)
    packed = rec.step("packed", strata_way, rec.device, configs, sizes, sizes["packing"])
    rec.detail("packed", packed)
    single = rec.step("one_per_gpu", strata_way, rec.device, configs, sizes, 1)
    rec.detail("one_per_gpu", single)
    if packed and single:
        rec.figure(Figure("packing", f"sweep makespan, {sizes['trials']} trials x {sizes['iterations']} epochs of "
                          f"{sizes['workload']}: {sizes['packing']} trials packed on the device vs one at a time",
                          packed["makespan_s"], single["makespan_s"], "s", target=TARGET_PACKED,
                          extra={"best_packed": packed["best"], "best_one_per_gpu": single["best"]}))
    try:
        python = peers_python()
    except RuntimeError as error:
        rec.lack(f"Ray Tune: peer missing ({error})")
        return
    ray = rec.step("ray_tune", ray_way, python, rec.device, configs, sizes)
    rec.detail("ray_tune", ray)
    if packed and ray:
        rec.figure(Figure("vs_ray_tune", f"sweep makespan: {sizes['packing']} trials packed vs Ray Tune with "
                          f"num_gpus={1 / sizes['packing']:g} and reuse_actors", packed["makespan_s"],
                          ray["makespan_s"], "s", target=TARGET_VS_RAY,
                          extra={"best_packed": packed["best"], "best_ray": ray["best"]}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="gpu-check's trial processes (and Ray Tune's sweep with --ray)")
    parser.add_argument("--configs", required=True)
    parser.add_argument("--queue")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--share", type=float, default=1.0)
    parser.add_argument("--workload", default="mlp-digits")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--ray", action="store_true")
    parser.add_argument("--output")
    parsed = parser.parse_args()
    ray_main(parsed) if parsed.ray else trials_main(parsed)
