"""``strata bench tuning``: Fluid's execution against one trial per GPU, Optuna's loop and real Ray Tune.

What one run measures:

1. **Real sweeps** on this machine, the same trials every way (the same space and searcher seed, trial budget,
   ASHA with grace period 1 and reduction factor 3, the train kind's loop and workload, 2 GPU slots), on two
   workloads: the MLP on digits (its epochs take about 10 ms, so the sweep measures what each system costs per
   trial) and the small CNN (trials of 1-5 s). The ways: (a) Fluid on a local ``strata up`` with 2 virtual GPUs
   (trials nested in the tune job, 4 to a GPU, water-filled); (b) one trial per virtual GPU, first in first out,
   on the same ``strata up``; (c) with ``--peers``, real Ray Tune 2.60 in its best configuration
   (``reuse_actors=True``) and its default, in ``.venv-peers`` (``make bench-peers``); (d) Optuna's own loop
   with its successive-halving pruner. Makespan, best accuracy and GPU-seconds each, 3 runs (seeds 0-2).
2. **A simulated sweep** of 1,000 trials on 64 GPUs (and 100 and 300 trials, to show how the ratio grows), with
   the real allocation rule (:func:`components.tuning.waterfill.allocate`) and the real ASHA scheduler deciding on
   learning curves, against one trial per whole GPU in arrival order (Ray Tune's default executor), with the
   same trials, the same curves and the same ASHA decisions. The makespan ratio is the figure.
3. **Scheduling overhead per trial**: the CPU time the engine's decisions (water-filling and the scheduler) took
   in the 1,000-trial sweep, divided by the trials; and the wall time per trial of the near-empty MLP sweep.

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

from benchmarks.benchkit import Figure, document, figures_table, peers_python, progress, write
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
               workload: str = "mlp-digits", runners: int | None = None) -> dict[str, Any]:
    """The same sweep both ways: Fluid packs up to 4 trials a GPU and water-fills; the baseline runs one trial per
    GPU, first in first out (``packing: 1``: each trial holds a whole GPU, ``gpus`` at a time, each placed as a job
    of its own: ``runners: 0``). ``runners``: Fluid's warm trial runners per GPU (None: the engine's default, one
    per virtual GPU; 0: every trial placed as a job of its own, water-filled, as before warm runners)."""
    space = SWEEP_SPACES[workload]
    trainable = {**trainable_spec(workload), **{key: "{{" + key + "}}" for key in space}}
    return {"name": name, "kind": "tune", "resources": {"gpus": gpus}, "max_attempts": 1, "time_limit": 3600,
            "spec": {"space": space, "metric": SWEEP_METRIC, "mode": "max", "trials": trials,
                     "max_iterations": iterations, "seed": seed, "searcher": {"name": "random"},
                     "scheduler": {"name": "asha", "options": {"grace_period": 1, "reduction_factor": 3}},
                     "packing": 4 if fluid else 1, "max_concurrent": 4 * gpus if fluid else gpus,
                     "max_gpus_per_trial": 1, "runners": runners if fluid else 0,
                     "trainable": {"kind": "train", "spec": trainable}}}


REAL_SWEEPS = {  # workload -> (trials, max iterations): full size, and --quick
    "full": {"mlp-digits": (16, 9), "cnn-synthetic": (16, 9)},
    "quick": {"mlp-digits": (4, 2)},
}
WAYS = ("fluid", "fluid_placed", "fifo", "optuna", "ray", "ray_default")
# What a plain ``--peers`` run measures (the targets need Fluid and Ray Tune's best); ``--ways`` picks others.
DEFAULT_WAYS = ("fluid", "fifo", "optuna", "ray", "ray_default")


def gpu_seconds(table: dict[str, Any]) -> float:
    """GPU-seconds the sweep's trials held: each trial's share integrated over its share timeline."""
    total = 0.0
    for trial in table["trials"]:
        shares = trial.get("shares") or []
        for (start, share), (end, _) in zip(shares, shares[1:], strict=False):
            total += share * max(end - start, 0.0)
    return total


class StrataSweeps:
    """The tune job run for real on a local ``strata up`` (``gpus`` virtual GPUs), Fluid or one trial per GPU."""

    def __init__(self, gpus: int):
        import tempfile
        from pathlib import Path

        from benchmarks.stack import Stack, free_port
        from components.runtime.client.client import ControlPlaneClient

        self.gpus = gpus
        self.home = Path(tempfile.mkdtemp(prefix="strata-bench-tuning-"))
        self.stack = Stack(self.home, free_port(), gpus, {})
        try:
            self.client = ControlPlaneClient(self.stack.url, self.stack.wait_ready()["token"], retries=3, timeout=30)
        except BaseException:
            self.stack.stop()
            raise

    def run(self, way: str, *, workload: str, trials: int, iterations: int, seed: int,
            body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One sweep, ``way`` (fluid or fifo) as :func:`sweep_body` builds it, or the tune job ``body`` given."""
        from datetime import datetime

        client = self.client
        job = client.post("jobs/", body or sweep_body(f"bench-{way}-{workload}-{seed}", fluid=way != "fifo",
                                                      gpus=self.gpus, trials=trials, iterations=iterations,
                                                      seed=seed, workload=workload,
                                                      runners=0 if way == "fluid_placed" else None))
        deadline = time.monotonic() + 1800
        while job["state"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sweep {job['id']} did not finish in 30 minutes; see {self.home}")
            time.sleep(0.5)
            job = client.get(f"jobs/{job['id']}/")
        if job["state"] != "SUCCEEDED":
            raise RuntimeError(f"sweep {job['id']} ended {job['state']}: {job['reason']}; see {self.home}")
        table = client.get(f"jobs/{job['id']}/trials/")
        started = datetime.fromisoformat(job["started_at"].replace("Z", "+00:00"))
        finished = datetime.fromisoformat(job["finished_at"].replace("Z", "+00:00"))
        return {"job": job["id"], "makespan_s": (finished - started).total_seconds(),
                "best": (table.get("best") or {}).get("value"), "trials": len(table["trials"]),
                "stopped": sum(t["status"] == "stopped" for t in table["trials"]), "gpu_seconds": gpu_seconds(table),
                "platform": table.get("platform"),
                "child_states": sorted({t.get("state") or "" for t in table["trials"]})}

    def stop(self) -> None:
        self.stack.stop()


def ray_sweep(python: str, *, workload: str, trials: int, iterations: int, seed: int, gpus: int,
              reuse_actors: bool) -> dict[str, Any]:
    """(c) Ray Tune on the same sweep, in the peers' interpreter (:mod:`benchmarks.tuning.peers`): one trial per
    logical GPU, ``reuse_actors`` on (its best configuration) or off (its default)."""
    import json
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="strata-bench-ray-") as scratch:
        output = os.path.join(scratch, "result.json")
        command = [python, "-m", "benchmarks.tuning.peers", "--workload", workload, "--trials", str(trials),
                   "--iterations", str(iterations), "--seed", str(seed), "--gpus", str(gpus), "--packing", "1",
                   "--output", output] + (["--reuse-actors"] if reuse_actors else [])
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                              cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"Ray Tune's sweep failed ({done.returncode}): {tail[0]}")
        with open(output) as handle:
            return json.load(handle)


def real_sweeps(runs: int, sizes: dict[str, tuple[int, int]], *, peers: bool, gpus: int = 2,
                ways: tuple[str, ...] = DEFAULT_WAYS) -> dict[str, Any]:
    """Every way on the same sweeps, ``runs`` times, one after another (never two at once): Fluid (on warm trial
    runners; ``fluid_placed``: every trial placed as a job of its own) and one trial per GPU on ``strata up``,
    Optuna's loop, and with ``peers`` Ray Tune in its best and default configurations. Run ``r`` of every way uses
    searcher seed ``r``. Returns ``{workload: {way: [run, ...]}}``."""
    say = progress("  ")
    python = peers_python() if peers else None
    ways = [way for way in ways if peers or not way.startswith("ray")]
    results: dict[str, Any] = {}
    strata = StrataSweeps(gpus)
    try:
        for workload, (trials, iterations) in sizes.items():
            found = results[workload] = {way: [] for way in ways}
            for run_index in range(runs):
                for way in ways:
                    say(f"{workload} sweep {run_index + 1}/{runs} ({way}): {trials} trials, {iterations} epochs at "
                        f"most, ASHA, {gpus} GPU slots")
                    if way in {"fluid", "fluid_placed", "fifo"}:
                        result = strata.run(way, workload=workload, trials=trials, iterations=iterations,
                                            seed=run_index)
                    elif way == "optuna":
                        result = optuna_sweep(trials, iterations, run_index, jobs=gpus, workload=workload)
                    else:
                        result = ray_sweep(python, workload=workload, trials=trials, iterations=iterations,
                                           seed=run_index, gpus=gpus, reuse_actors=way == "ray")
                    found[way].append(result)
                    say(f"  {way}: {result['makespan_s']:.1f} s, best {result['best']}")
    finally:
        strata.stop()
    return results


def train_trial(params: dict[str, Any], *, workload: str, iterations: int, workdir, report, name: str = "trial",
                lock=None) -> float | None:
    """One trial of the real sweep outside Strata, for the peers (Optuna's loop, Ray Tune): the train kind's own
    loop and workload with ``params`` in its spec (as the tune job's trainable gets them), ``report(iteration,
    value)`` after each epoch (the peer's pruning hook; it may raise to stop the trial). Returns the last value.
    ``lock`` serializes building the workload (its dataset loader is not made for threads building it at once)."""
    import contextlib
    from pathlib import Path

    from components.runtime.contract.context import LocalContext
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


@dataclass
class SweepFigure(Figure):
    """A makespan figure that counts as met only at equal best accuracy (within ``tolerance``)."""

    same_accuracy: bool = True

    @property
    def met(self) -> bool | None:
        met = Figure.met.fget(self)
        return met and self.same_accuracy if met is not None else None


PEERS_TEXT = {
    "fluid_placed": ("Fluid before warm runners: every trial placed as a job of its own (runners: 0), 4 a GPU, "
                     "water-filled, on strata up", None),
    "fifo": ("one trial per virtual GPU, first in first out (Ray Tune's default executor), on strata up", 2.0),
    "ray": ("Ray Tune 2.60, ASHA, reuse_actors=True (its best configuration), one trial per logical GPU", 1.0),
    "ray_default": ("Ray Tune 2.60, ASHA, its default (a new actor per trial), one trial per logical GPU", None),
    "optuna": ("Optuna's study.optimize, seeded random sampler, successive-halving pruner, 2 threads", None),
}


def _real_figures(real: dict[str, Any]) -> list[Figure]:
    found = []
    for workload, ways in real.items():
        fluid = ways["fluid"]
        for way, (text, target) in PEERS_TEXT.items():
            if not ways.get(way):
                continue
            mine, theirs = [r["makespan_s"] for r in fluid], [r["makespan_s"] for r in ways[way]]
            ratios = sorted(b / a for a, b in zip(mine, theirs, strict=True))
            best_mine, best_theirs = _median([r["best"] or 0 for r in fluid]), _median([r["best"] or 0 for r in ways[way]])
            gpu_mine = _median([r.get("gpu_seconds") or 0 for r in fluid])
            gpu_theirs = [r.get("gpu_seconds") for r in ways[way] if r.get("gpu_seconds") is not None]
            found.append(SweepFigure(
                f"{workload}_vs_{way}", f"{workload} sweep: makespan against {way.replace('_', ' ')}",
                _median(mine), _median(theirs), "s", target=target,
                mechanism_text="Fluid on strata up: trials on warm runners (1 per virtual GPU), each its own job",
                baseline_text=text,
                same_accuracy=abs(best_mine - best_theirs) <= 0.01,
                extra={"ratio_range": [ratios[0], ratios[-1]], "runs": len(ratios),
                       "makespan_range": [min(mine), max(mine)], "baseline_range": [min(theirs), max(theirs)],
                       "best": best_mine, "best_baseline": best_theirs,
                       "gpu_seconds": gpu_mine, "gpu_seconds_baseline": _median(gpu_theirs) if gpu_theirs else None,
                       "trials": fluid[0]["trials"]}))
    costs = [r["platform"]["per_trial_s"] for ways in real.values() for r in ways.get("fluid", [])
             if (r.get("platform") or {}).get("per_trial_s") is not None]
    if costs:  # measured by the engine, per trial: see components/tuning/pool.py
        by_workload = {workload: sorted(r["platform"]["per_trial_s"] for r in ways.get("fluid", [])
                                        if (r.get("platform") or {}).get("per_trial_s") is not None)
                       for workload, ways in real.items()}
        found.append(Figure(
            "platform_per_trial", "platform cost per trial: from a runner going free to the trial's first line, plus "
            "the runner's time on it outside the trial's own code (decisions, reports, files)",
            _median(costs), 0.05, "s", target=1.0,
            mechanism_text="Fluid on warm trial runners, every trial its own job (batched submits, points, ends)",
            baseline_text="the 50 ms budget",
            extra={"range": [min(costs), max(costs)], "runs": len(costs), "by_workload": by_workload,
                   "startup_s": sorted((r.get("platform") or {}).get("ready_s") or 0
                                       for ways in real.values() for r in ways.get("fluid", [])),
                   "batches": sorted((r.get("platform") or {}).get("batches") or 0
                                     for ways in real.values() for r in ways.get("fluid", []))}))
    if "mlp-digits" in real:  # its trials train for ~10 ms an epoch: wall time per trial is what each system costs
        ways = real["mlp-digits"]
        per_trial = {way: _median([r["makespan_s"] / r["trials"] for r in runs]) for way, runs in ways.items() if runs}
        baseline = per_trial.get("ray", per_trial.get("fifo"))
        found.append(Figure(
            "wall_per_trial", "wall time per trial: makespan / trials of the near-empty MLP sweep",
            per_trial["fluid"], baseline, "s", target=None,
            mechanism_text="Fluid on strata up (warm trial runners)",
            baseline_text="Ray Tune, reuse_actors=True" if "ray" in per_trial else "one trial per GPU",
            extra={"per_trial_s": per_trial, "budget_s": 0.05, "within_budget": per_trial["fluid"] < 0.05}))
    return found


def figures(results: dict[str, Any]) -> list[Figure]:
    return _real_figures(results.get("real") or {}) + (_simulated_figures(results) if results.get("sizes") else [])


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


def main(quick: bool = False, output: str | None = None, real: bool = True, peers: bool = False,
         ways: tuple[str, ...] = DEFAULT_WAYS, workloads: tuple[str, ...] | None = None, runs: int | None = None,
         simulate_sweeps: bool = True) -> int:
    """``strata bench tuning`` entry point: run, print, optionally write the common JSON. ``real``: also run the
    sweeps for real (a local ``strata up``, Optuna's loop; the tests leave it out); ``peers``: also real Ray
    Tune (``--peers``; needs ``make bench-peers``). ``ways``/``workloads``/``runs``: a part of the real sweeps
    (``python -m benchmarks.tuning.bench --ways fluid,ray``); ``simulate_sweeps``: also the simulated sweep."""
    if peers:
        peers_python()  # fail in one line before anything runs
    results = run(quick) if simulate_sweeps else {}
    if real:
        runs = runs or (1 if quick else 3)
        sizes = REAL_SWEEPS["quick" if quick else "full"]
        sizes = {name: size for name, size in sizes.items() if workloads is None or name in workloads}
        results["real"] = real_sweeps(runs, sizes, peers=peers, ways=tuple(ways))
    doc = document("tuning", quick, figures(results), details=results)
    print(figures_table(doc))
    write(doc, output)
    return 0


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tuning.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--peers", action="store_true", help="also real Ray Tune (make bench-peers)")
    parser.add_argument("--ways", default=",".join(DEFAULT_WAYS), help=f"some of {', '.join(WAYS)}")
    parser.add_argument("--workloads", default=None, help="mlp-digits,cnn-synthetic (default: both)")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--no-simulation", action="store_true", help="leave the simulated sweep out")
    args = parser.parse_args()
    sys.exit(main(args.quick, args.output, peers=args.peers, ways=tuple(args.ways.split(",")),
                  workloads=tuple(args.workloads.split(",")) if args.workloads else None, runs=args.runs,
                  simulate_sweeps=not args.no_simulation))
