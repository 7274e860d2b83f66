"""Real Ray Tune on the tuning benchmark's sweep: ``strata bench tuning --peers`` runs this module with the
peers' interpreter (``make bench-peers`` builds ``.venv-peers`` with ``ray[tune]==2.60.0``; Ray is never in
``make test``'s install).

    python -m benchmarks.tuning.peers --workload cnn-synthetic --trials 16 --iterations 9 --seed 0 \\
        --gpus 2 --packing 4 [--reuse-actors] --output result.json

Ray Tune runs the same trials as the tune job: the configurations the job's seeded random searcher draws, in
the same order (:func:`benchmarks.tuning.bench.drawn_configs`, given to Tune as a grid over their indices, so
Tune's own sampler draws nothing), the same trainable code (:func:`benchmarks.tuning.bench.train_trial`, the
train kind's loop and workload, one ``tune.report`` per epoch), Tune's ``ASHAScheduler`` with the same grace
period and reduction factor, and the same slots: ``gpus`` logical GPUs (Ray schedules logical GPUs where none
exist) packed ``packing`` trials to a GPU with ``tune.with_resources`` (``{"gpu": 1/packing, "cpu":
cores/slots}``), ``max_concurrent_trials`` the slots, each trial's torch on one thread. ``--reuse-actors`` is
Tune's best configuration (one actor reused across trials); without it, Tune's default (a new actor per trial).

Ray's defaults are changed only where this machine needs it: its head listens on loopback
(``_node_ip_address``), token authentication is off (``RAY_AUTH_MODE=disabled``, a local, single-user cluster)
and usage statistics are not sent anywhere (``RAY_USAGE_STATS_ENABLED=0``). ``ray.init()`` starts a local
instance on free ports, so Ray's usual port 6379 (Redis's here) is never asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any


def ray_sweep(*, workload: str, trials: int, iterations: int, seed: int, gpus: int, packing: int,
              reuse_actors: bool, cores: int) -> dict[str, Any]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from benchmarks.tuning.bench import SWEEP_METRIC, drawn_configs, train_trial

    configs = drawn_configs(trials, seed, workload)
    scratch = tempfile.mkdtemp(prefix="strata-bench-ray-")
    slots = gpus * packing

    def trainable(config: dict[str, Any]) -> None:
        import torch

        torch.set_num_threads(1)
        params = configs[config["index"]]

        def report(iteration: int, value: float) -> None:
            tune.report({SWEEP_METRIC: value})

        train_trial(params, workload=workload, iterations=iterations, workdir=scratch, report=report,
                    name=f"ray-{config['index']}")

    began = time.perf_counter()
    ray.init(num_cpus=cores, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    init_s = time.perf_counter() - began
    try:
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=iterations, grace_period=1,
                                  reduction_factor=3)
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": cores / slots, "gpu": 1 / packing}),
            param_space={"index": tune.grid_search(list(range(trials)))},
            tune_config=tune.TuneConfig(metric=SWEEP_METRIC, mode="max", scheduler=scheduler,
                                        max_concurrent_trials=slots, reuse_actors=reuse_actors),
            run_config=tune.RunConfig(storage_path=scratch, verbose=0),
        )
        began = time.perf_counter()
        grid = tuner.fit()
        makespan = time.perf_counter() - began
    finally:
        ray.shutdown()
    best, stopped, errors, busy = None, 0, 0, 0.0
    for result in grid:
        if result.error:
            errors += 1
            continue
        frame = result.metrics_dataframe
        values = [float(v) for v in frame[SWEEP_METRIC]] if frame is not None and SWEEP_METRIC in frame else []
        if values:
            best = max(values) if best is None else max(best, max(values))
        stopped += int(len(values) < iterations)
        busy += float(result.metrics.get("time_total_s") or 0.0)
    return {"makespan_s": makespan, "init_s": init_s, "best": best, "trials": len(grid), "stopped": stopped,
            "errors": errors, "gpu_seconds": busy / packing, "reuse_actors": reuse_actors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tuning.peers", description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="mlp-digits")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--packing", type=int, default=4)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--reuse-actors", action="store_true")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    try:
        import ray  # noqa: F401
    except ImportError:
        print("Ray Tune is not installed in this interpreter: run `make bench-peers`", file=sys.stderr)
        return 2
    result = ray_sweep(workload=args.workload, trials=args.trials, iterations=args.iterations, seed=args.seed,
                       gpus=args.gpus, packing=args.packing, reuse_actors=args.reuse_actors, cores=args.cores)
    with open(args.output, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
