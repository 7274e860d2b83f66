"""``strata bench tuning``: Fluid's execution against one trial per GPU, first in first out.

What this run measures (the rest of the issue's figures, on real trainings and against real Ray Tune and
Optuna, are not built yet; docs/components/tuning.md says so):

1. **A simulated sweep** of 1,000 trials on 64 GPUs (and 100 and 300 trials, to show how the ratio grows), with
   the real allocation rule (:func:`components.tuning.waterfill.allocate`) and the real ASHA scheduler deciding on
   learning curves, against one trial per whole GPU in arrival order (Ray Tune's default executor), with the
   same trials, the same curves and the same ASHA decisions. The makespan ratio is the figure.
2. **Scheduling overhead per trial**: the CPU time the engine's decisions (water-filling and the scheduler) took
   in the 1,000-trial sweep, divided by the trials.

The model of a trial (stated, since it decides the numbers): iteration ``k`` of trial ``i`` takes ``h_i`` seconds
on a whole GPU; a trial alone keeps ``u_i`` of a GPU busy (a small model cannot fill a GPU), so at a share
``s <= u_i`` it runs at ``s / u_i`` of its full speed and at ``u_i <= s <= 1`` at full speed; above one GPU (data
parallel across whole GPUs) a trial that fills a GPU speeds up by 0.9 per extra GPU. ``h_i`` is drawn from
0.5-4 s and ``u_i`` from 0.15-1.0 (seeded); a trial whose share changes loses the iteration in progress and pays
a restart of ``restart_s`` seconds, as Fluid's pause-and-restart does. The learning curves are the same kind of
saturating curves as the scheduler tests' recorded ones.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

from components.runtime.benchkit import Figure, document, figures_table, progress, write
from components.tuning.schedulers import ASHA, Action
from components.tuning.waterfill import Bounds, grow, start_share


def curves(count: int, iterations: int, seed: int) -> list[list[float]]:
    """Validation-accuracy-like curves: ``top - (top - start) * exp(-rate * k)`` plus noise."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        top, rate, start, noise = rng.uniform(0.55, 0.98), rng.uniform(0.08, 0.6), rng.uniform(0.1, 0.3), \
            rng.uniform(0.002, 0.02)
        found.append([top - (top - start) * math.exp(-rate * k) + rng.gauss(0, noise) for k in range(1, iterations + 1)])
    return found


@dataclass
class SimTrial:
    index: int
    seconds: float  # per iteration on a whole GPU
    utilization: float  # of one GPU, alone
    curve: list[float]
    share: float = 0.0
    done: int = 0  # iterations finished
    progress: float = 0.0  # of the current iteration
    stall: float = 0.0  # restart seconds left
    status: str = "waiting"  # waiting, running, stopped, completed

    def speed(self) -> float:
        """Iterations per second at the current share."""
        if self.share <= 0:
            return 0.0
        if self.share <= self.utilization:
            fraction = self.share / self.utilization
        elif self.share <= 1:
            fraction = 1.0
        else:
            fraction = 1 + 0.9 * (self.share - 1) if self.utilization >= 0.9 else 1.0
        return fraction / self.seconds


def simulate(count: int, gpus: int, *, fluid: bool, seed: int = 0, iterations: int = 27, packing: int = 4,
             max_gpus: int = 4, restart_s: float = 2.0) -> dict[str, Any]:
    """One sweep of ``count`` trials on ``gpus`` GPUs: makespan, GPU-seconds held, the best value, and the CPU
    seconds the decisions took."""
    rng = random.Random(seed)
    trials = [SimTrial(i, rng.uniform(0.5, 4.0), rng.uniform(0.15, 1.0), curve)
              for i, curve in enumerate(curves(count, iterations, seed + 1))]
    scheduler = ASHA(mode="max", max_iterations=iterations, grace_period=1, reduction_factor=3)
    for trial in trials:
        scheduler.add(str(trial.index), {})
    bounds = Bounds(low=1 / packing, high=float(max_gpus))
    waiting = list(trials)
    now, held, decide, restarts = 0.0, 0.0, 0.0, 0

    def running() -> list[SimTrial]:
        return [trial for trial in trials if trial.status == "running"]

    def place() -> None:
        nonlocal decide, restarts
        began = time.process_time()
        if fluid:
            room = int(gpus * packing)
            # Freed capacity goes to trials waiting to start first, then grows the running ones furthest behind.
            free = gpus - sum(t.share for t in running())
            starting = min(len(waiting), room - len(running()))
            share = start_share(free, starting, bounds)
            while waiting and len(running()) < room and free >= share - 1e-9 and share > 0:
                trial = waiting.pop(0)
                trial.status, trial.share = "running", share
                free -= share
            if not waiting:
                live = [t for t in running() if iterations - t.done > 1]
                work = {str(t.index): t.seconds * (iterations - t.done - t.progress) for t in live}
                grown = grow({str(t.index): t.share for t in live}, work,
                             gpus - sum(t.share for t in running() if t not in live), bounds)
                for trial in live:
                    if str(trial.index) in grown:
                        trial.share, trial.progress, trial.stall = grown[str(trial.index)], 0.0, restart_s
                        restarts += 1
        else:
            while waiting and len(running()) < gpus:
                trial = waiting.pop(0)
                trial.status, trial.share = "running", 1.0
        decide += time.process_time() - began

    place()
    while running() or waiting:
        live = running()
        # The next moment something happens: a restart ends or an iteration completes.
        steps = []
        for trial in live:
            speed = trial.speed()
            if trial.stall > 0:
                steps.append(trial.stall)
            elif speed > 0:
                steps.append((1 - trial.progress) / speed)
        step = min(steps) if steps else 0.0
        now += step
        held += step * sum(trial.share for trial in live)
        changed = False
        for trial in live:
            if trial.stall > 0:
                trial.stall = max(0.0, trial.stall - step)
                continue
            trial.progress += step * trial.speed()
            if trial.progress >= 1 - 1e-9:
                trial.done, trial.progress = trial.done + 1, 0.0
                began = time.process_time()
                decision = scheduler.result(str(trial.index), trial.done, trial.curve[trial.done - 1])
                decide += time.process_time() - began
                if decision.action is Action.STOP and trial.done < iterations:
                    trial.status, trial.share, changed = "stopped", 0.0, True
                elif trial.done >= iterations:
                    scheduler.complete(str(trial.index))
                    trial.status, trial.share, changed = "completed", 0.0, True
        if changed:
            place()
    best = max(max(t.curve[:t.done]) for t in trials if t.done)
    return {"makespan_s": now, "gpu_seconds": held, "best": best, "decision_cpu_s": decide, "restarts": restarts,
            "trials": count,
            "gpus": gpus, "stopped": sum(t.status == "stopped" for t in trials),
            "completed": sum(t.status == "completed" for t in trials)}


# The real sweeps: the same space shape on both workloads, the width scaled to each (the CNN's channels cost far
# more than the MLP's units). The MLP on digits trains an epoch in about 10 ms, so its sweep measures what each
# system costs per trial; the CNN's epochs take 0.15-0.6 s on one thread, so its trials last 1-5 s, as the
# issue's sweep does.
SWEEP_METRIC = "test_accuracy"
SWEEP_SPACES = {
    "mlp-digits": {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.05},
                   "hidden": {"type": "choice", "values": [32, 64, 128]}},
    "cnn-synthetic": {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.05},
                      "hidden": {"type": "choice", "values": [8, 16, 32]}},
}


def trainable_spec(workload: str) -> dict[str, Any]:
    """The train spec every system's trials start from (the searcher's parameters go on top)."""
    return {"workload": workload, "batch_size": 64}


def sweep_body(name: str, *, fluid: bool, gpus: int, trials: int, iterations: int, seed: int,
               workload: str = "mlp-digits") -> dict[str, Any]:
    """The same sweep both ways: Fluid packs up to 4 trials a GPU and water-fills; the baseline runs one trial per
    GPU, first in first out (``packing: 1``: each trial holds a whole GPU, ``gpus`` at a time)."""
    space = SWEEP_SPACES[workload]
    trainable = {**trainable_spec(workload), **{key: "{{" + key + "}}" for key in space}}
    return {"name": name, "kind": "tune", "resources": {"gpus": gpus}, "max_attempts": 1, "time_limit": 3600,
            "spec": {"space": space, "metric": SWEEP_METRIC, "mode": "max", "trials": trials,
                     "max_iterations": iterations, "seed": seed, "searcher": {"name": "random"},
                     "scheduler": {"name": "asha", "options": {"grace_period": 1, "reduction_factor": 3}},
                     "packing": 4 if fluid else 1, "max_concurrent": 4 * gpus if fluid else gpus,
                     "max_gpus_per_trial": 1,
                     "trainable": {"kind": "train", "spec": trainable}}}


def real_sweeps(runs: int, trials: int, iterations: int, gpus: int = 2) -> dict[str, Any]:
    """The same sweeps run for real on ``strata up`` (``gpus`` virtual GPUs), Fluid and the baseline in turn:
    makespan (the tune job's start to end), the best value reached, and the trials."""
    import tempfile
    from datetime import datetime
    from pathlib import Path

    from components.runtime.client import ControlPlaneClient
    from strata.bench.control_plane import Stack, _free_port

    say = progress("  ")
    home = Path(tempfile.mkdtemp(prefix="strata-bench-tuning-"))
    stack = Stack(home, _free_port(), gpus, {})
    results: dict[str, list] = {"fluid": [], "fifo": []}
    try:
        client = ControlPlaneClient(stack.url, stack.wait_ready()["token"], retries=3, timeout=30)
        for run_index in range(runs):
            for way in ("fluid", "fifo"):
                say(f"real sweep {run_index + 1}/{runs} ({way}): {trials} trials of mlp-digits, {iterations} epochs "
                    f"at most, on {gpus} virtual GPUs")
                job = client.post("jobs/", sweep_body(f"bench-{way}-{run_index}", fluid=way == "fluid", gpus=gpus,
                                                      trials=trials, iterations=iterations, seed=run_index))
                deadline = time.monotonic() + 1800
                while job["state"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sweep {job['id']} did not finish in 30 minutes; see {home}")
                    time.sleep(1.0)
                    job = client.get(f"jobs/{job['id']}/")
                if job["state"] != "SUCCEEDED":
                    raise RuntimeError(f"sweep {job['id']} ended {job['state']}: {job['reason']}; see {home}")
                table = client.get(f"jobs/{job['id']}/trials/")
                started = datetime.fromisoformat(job["started_at"].replace("Z", "+00:00"))
                finished = datetime.fromisoformat(job["finished_at"].replace("Z", "+00:00"))
                results[way].append({"job": job["id"], "makespan_s": (finished - started).total_seconds(),
                                     "best": (table.get("best") or {}).get("value"),
                                     "trials": len(table["trials"]),
                                     "stopped": sum(t["status"] == "stopped" for t in table["trials"])})
                say(f"  {way}: {results[way][-1]['makespan_s']:.1f} s, best {results[way][-1]['best']}")
    finally:
        stack.stop()
    return results


def train_trial(params: dict[str, Any], *, workload: str, iterations: int, workdir, report, name: str = "trial",
                lock=None) -> float | None:
    """One trial of the real sweep outside Strata, for the peers (Optuna's loop, Ray Tune): the train kind's own
    loop and workload with ``params`` in its spec (as the tune job's trainable gets them), ``report(iteration,
    value)`` after each epoch (the peer's pruning hook; it may raise to stop the trial). Returns the last value.
    ``lock`` serializes building the workload (its dataset loader is not made for threads building it at once)."""
    import contextlib
    from pathlib import Path

    from components.runtime.context import LocalContext
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    spec = TrainSpec().validate({**trainable_spec(workload), **params, "epochs": iterations,
                                 "checkpoint_every": 10**9})
    ctx = LocalContext(job_id=name, attempt_id="a", spec=spec, workdir=Path(workdir) / name)
    with lock or contextlib.nullcontext():
        loop = TrainLoop(builtin_workload(workload), spec, ctx, device="cpu", owns_process=False)
        loop.start()
    value, reported = None, 0
    while not loop.done:
        loop.step()
        epochs = loop.step_count // loop.steps_per_epoch
        if epochs > reported and loop.last_eval:
            reported, value = epochs, float(loop.last_eval[SWEEP_METRIC])
            report(reported, value)
    return value


def drawn_configs(trials: int, seed: int, workload: str = "mlp-digits") -> list[dict[str, Any]]:
    """The configurations the tune job's random searcher draws for ``seed``, in trial order (the searcher is not
    adaptive, so a peer given this list runs exactly the sweep's trials)."""
    from components.tuning.searchers import Searcher

    searcher = Searcher("random", SWEEP_SPACES[workload], mode="max", seed=seed, budget=trials)
    return [searcher.ask()[1] for _ in range(trials)]


def optuna_sweep(trials: int, iterations: int, seed: int, jobs: int = 2, workload: str = "mlp-digits") -> dict[str, Any]:
    """(d) Optuna's own loop on the same sweep: the same space, a seeded random sampler, its successive-halving
    pruner (ASHA's rule: min resource 1, reduction factor 3), the same trainable code (:func:`train_trial`),
    ``jobs`` trials at once in threads (``study.optimize(n_jobs=...)``, as Optuna's docs give for one machine),
    each torch op on one thread like a trial on a virtual GPU."""
    import tempfile
    import threading

    import optuna
    import torch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    scratch = tempfile.mkdtemp(prefix="strata-bench-optuna-")
    lock = threading.Lock()

    def objective(trial: optuna.Trial) -> float:
        space = SWEEP_SPACES[workload]
        params = {"lr": trial.suggest_float("lr", space["lr"]["low"], space["lr"]["high"], log=True),
                  "hidden": trial.suggest_categorical("hidden", space["hidden"]["values"])}

        def report(iteration: int, value: float) -> None:
            trial.report(value, iteration)
            if trial.should_prune():
                raise optuna.TrialPruned()

        return train_trial(params, workload=workload, iterations=iterations, workdir=scratch, report=report,
                           name=f"optuna-{trial.number}", lock=lock)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed),
                                pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3))
    began = time.perf_counter()
    study.optimize(objective, n_trials=trials, n_jobs=jobs)
    seconds = time.perf_counter() - began
    states = [trial.state.name for trial in study.trials]
    return {"makespan_s": seconds, "best": study.best_value, "trials": len(states), "stopped": states.count("PRUNED")}


def run(quick: bool = False, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    sizes = (60, 120) if quick else (100, 300, 1000)
    gpus = 8 if quick else 64
    results: dict[str, Any] = {"gpus": gpus, "sizes": {}}
    say = progress("  ")
    for count in sizes:
        runs = []
        for seed in seeds:
            say(f"simulated sweep: {count} trials on {gpus} GPUs, seed {seed}")
            fluid = simulate(count, gpus, fluid=True, seed=seed)
            fifo = simulate(count, gpus, fluid=False, seed=seed)
            runs.append({"fluid": fluid, "fifo": fifo, "ratio": fifo["makespan_s"] / fluid["makespan_s"]})
        ratios = sorted(run["ratio"] for run in runs)
        results["sizes"][count] = {"runs": runs, "ratio_median": ratios[len(ratios) // 2],
                                   "ratio_range": [ratios[0], ratios[-1]]}
    return results


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def figures(results: dict[str, Any]) -> list[Figure]:
    found = _simulated_figures(results)
    real = results.get("real")
    if real:
        fluid, fifo = [r["makespan_s"] for r in real["fluid"]], [r["makespan_s"] for r in real["fifo"]]
        ratios = sorted(b / a for a, b in zip(fluid, fifo, strict=True))
        found.insert(0, Figure(
            "makespan_vs_fifo", "real sweep on this machine: makespan against one trial per GPU (FIFO)",
            _median(fluid), _median(fifo), "s", target=2.0,
            mechanism_text="Fluid (packing 4, water-filling) on strata up",
            baseline_text="one trial per virtual GPU, first in first out",
            extra={"ratio_range": [ratios[0], ratios[-1]], "runs": len(ratios),
                   "best_fluid": _median([r["best"] or 0 for r in real["fluid"]]),
                   "best_fifo": _median([r["best"] or 0 for r in real["fifo"]])}))
        if real.get("optuna"):
            optuna_runs = [r["makespan_s"] for r in real["optuna"]]
            ratios = sorted(b / a for a, b in zip(fluid, optuna_runs, strict=True))
            found.insert(1, Figure(
                "makespan_vs_optuna", "real sweep on this machine: makespan against Optuna's own loop",
                _median(fluid), _median(optuna_runs), "s", target=None,
                mechanism_text="Fluid (packing 4, water-filling) on strata up",
                baseline_text="Optuna study.optimize, random sampler, successive-halving pruner, 2 threads",
                extra={"ratio_range": [ratios[0], ratios[-1]], "runs": len(ratios),
                       "best_optuna": _median([r["best"] or 0 for r in real["optuna"]])}))
    return found


def _simulated_figures(results: dict[str, Any]) -> list[Figure]:
    sizes = results["sizes"]
    largest = max(sizes)
    runs = sizes[largest]["runs"]
    middle = sorted(runs, key=lambda run: run["ratio"])[len(runs) // 2]
    growth = {str(count): round(item["ratio_median"], 3) for count, item in sizes.items()}
    overhead = sorted(run["fluid"]["decision_cpu_s"] / run["fluid"]["trials"] for run in runs)[len(runs) // 2]
    return [
        Figure("simulated_makespan", f"simulated sweep, {largest} trials on {results['gpus']} GPUs: makespan",
               middle["fluid"]["makespan_s"], middle["fifo"]["makespan_s"], "s", target=None,
               mechanism_text="Fluid water-filling (packing 4, up to 4 GPUs a trial)",
               baseline_text="one trial per GPU, first in first out",
               extra={"ratio_by_trials": growth, "ratio_range": sizes[largest]["ratio_range"],
                      "best_fluid": middle["fluid"]["best"], "best_fifo": middle["fifo"]["best"]}),
        Figure("decision_overhead", "scheduling overhead per trial (water-filling and ASHA decisions, CPU)",
               overhead, 0.05, "s", target=1.0, mechanism_text="the engine's decisions per trial",
               baseline_text="the 50 ms budget"),
    ]


def main(quick: bool = False, output: str | None = None, real: bool = True) -> int:
    """``strata bench tuning`` entry point: run, print, optionally write the common JSON. ``real``: also run the
    sweeps for real on a local ``strata up`` (the tests leave it out)."""
    results = run(quick)
    if real:
        runs, trials, iterations = (1, 4, 2) if quick else (3, 12, 4)
        results["real"] = real_sweeps(runs=runs, trials=trials, iterations=iterations)
        say = progress("  ")
        results["real"]["optuna"] = []
        for seed in range(runs):
            say(f"optuna sweep {seed + 1}/{runs}: {trials} trials, successive-halving pruner, 2 at once")
            results["real"]["optuna"].append(optuna_sweep(trials, iterations, seed))
            say(f"  optuna: {results['real']['optuna'][-1]['makespan_s']:.1f} s, "
                f"best {results['real']['optuna'][-1]['best']}")
    doc = document("tuning", quick, figures(results), details=results)
    print(figures_table(doc))
    write(doc, output)
    return 0
