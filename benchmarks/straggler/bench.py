"""``strata bench straggler``: SMS, Stanza and SAS against their baselines, side by side, on this machine.

Parts (``--parts``, all by default):

- ``sms``: wall time to a target test accuracy of a 2-worker gang (cnn-synthetic, batch 64 per worker, gloo on
  127.0.0.1) with one worker slowed 2x, and with random slow episodes on every worker; SMS against
  bulk-synchronous DDP (PyTorch's DistributedDataParallel) and PyTorch's PostLocalSGD hook with a periodic
  model averager, same workers, data, seed and injected slowdowns. Also the final accuracy of each.
- ``stanza``: bytes per iteration and iteration time of a CNN with large fully connected layers (cnn-fc) on 3
  workers over an emulated 100 Mbit/s link: Stanza (2 convolutional workers, 1 FC worker) against DDP; and the
  accuracy after the same number of epochs.
- ``sas``: average job completion time on a simulated 100-node cluster with time-varying availability: SAS
  placement against least-loaded placement (and random).
- ``sas-trace``: the same in a world whose availability statistics come from published GPU-cluster studies
  (co-located jobs, diurnal load, spot preemptions: :mod:`benchmarks.straggler.traceworld`).

Each run is real: every worker is its own process running the train loop (components.train.loop) through the
strategy's runtime, exactly as on a node; only the rendezvous goes through a shared directory instead of the
control plane. Figures: the median and range of ``--runs`` runs (default 3).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.benchkit import Figure, document, figures_table, percentile, progress, write

# Batch 256 per worker: the step's compute (what a slow machine is slow at) dominates its fixed costs, as in
# real training; with small steps the fixed costs hide most of a straggler's slowdown from any strategy.
SMS_WORKLOAD = {"workload": "cnn-synthetic", "hidden": 16, "batch_size": 256, "epochs": 24, "lr": 0.006,
                "log_every": 4, "checkpoint_every": 10**6}
# Well below the plateau (about 0.88-0.90 here), so every seed crosses it mid-run, not in the noise at the end.
SMS_TARGET = 0.8
SMS_LONGER = 1.5  # SMS runs this many times the epochs (see sms_runs)
SCENARIOS = {
    "one-slow": {"ranks": [1], "factor": 2.0},
    "random": {"random": 0.04, "duration": 12, "factor": 3.0},
}
SMS_WAYS = {"sms": {"strategy": "sms"}, "ddp": {"strategy": "ddp"},
            "post-local-sgd": {"strategy": "post-local-sgd", "period": 4}}
STANZA_WORKLOAD = {"workload": "cnn-fc", "hidden": 16, "batch_size": 32, "epochs": 2, "lr": 0.002,
                   "log_every": 8, "checkpoint_every": 10**6}
STANZA_MBIT = 100.0
WORKER_TIMEOUT_S = 900


# -- one gang, each rank a process -------------------------------------------------------------------------------
def run_ranks(command: Callable[[int], list[str]], world: int, timeout: float = WORKER_TIMEOUT_S,
              env: dict[str, str] | None = None, cwd: Path | None = None) -> list[str]:
    """Start ``world`` processes, ``command(rank)`` each, with one torch thread each (and ``env`` on top), wait
    for all of them (``timeout`` each; the rest are killed when one is not done) and return their outputs; a
    rank that fails raises with the tails of every output."""
    env = {**os.environ, "STRATA_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    children = [subprocess.Popen(command(rank), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
                for rank in range(world)]
    outputs = []
    try:
        for child in children:
            out, _ = child.communicate(timeout=timeout)
            outputs.append(out)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    failed = [(rank, child.returncode) for rank, child in enumerate(children) if child.returncode != 0]
    if failed:
        tail = "\n".join(out[-1500:] for out in outputs)
        raise RuntimeError(f"workers {failed} failed:\n{tail}")
    return outputs


def run_gang(spec: dict[str, Any], world: int, timeout: float = WORKER_TIMEOUT_S) -> dict[str, Any]:
    """Run ``spec`` on ``world`` worker processes; rank 0's result (see :func:`_worker`)."""
    with tempfile.TemporaryDirectory(prefix="strata-bench-gang-") as directory:
        run_ranks(lambda rank: [sys.executable, "-m", "benchmarks.straggler.bench", "--worker", str(rank),
                                "--world", str(world), "--workdir", directory, "--spec", json.dumps(spec)],
                  world, timeout)
        return json.loads((Path(directory) / "result-0.json").read_text())


def _worker(rank: int, world: int, workdir: str, spec: dict[str, Any]) -> None:
    """One rank: the train loop through the strategy runtime; rank 0 writes what the figures need."""
    import torch

    from components.runtime.contract.context import LocalContext
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    torch.set_num_threads(1)
    evaluations: list[tuple[float, int, float]] = []

    class Timed(LocalContext):
        def metrics(self, values, step):
            super().metrics(values, step)
            if "test_accuracy" in values:
                evaluations.append((time.perf_counter(), int(step), float(values["test_accuracy"])))

    spec = TrainSpec().validate(spec)
    # One directory for the gang: the rendezvous file; only rank 0 writes checkpoints and artifacts.
    ctx = Timed(job_id="bench", attempt_id="bench-1", spec=spec, rank=rank, world_size=world, workdir=Path(workdir))
    loop = TrainLoop(builtin_workload(spec["workload"]), spec, ctx)
    loop.start()
    began = time.perf_counter()
    loop.run()
    ended = time.perf_counter()
    if rank:
        return
    runtime = loop.parallel
    payload = ctx.reports.get(runtime.plugin) if runtime is not None and runtime.plugin else None
    steps = max(loop.step_count, 1)
    # Wall time per step (Stanza's own step_ms leaves out the waiting; its wall_ms is the step's wall time).
    wall = "rank0.wall_ms" if any(name == "rank0.wall_ms" for name, _, _ in ctx.metric_points) else "rank0.step_ms"
    step_ms = [value for name, value, _ in ctx.metric_points if name == wall]
    result = {
        "seconds": ended - began, "steps": loop.step_count,
        "evaluations": [(moment - began, step, accuracy) for moment, step, accuracy in evaluations],
        # One evaluation swings by a point or more from epoch to epoch: the final accuracy is the mean of the last 3.
        "final_accuracy": (sum(a for _, _, a in evaluations[-3:]) / len(evaluations[-3:])) if evaluations else None,
        "step_ms": percentile(step_ms[1:] or step_ms, 0.5),
        "report": payload,
        "bytes_per_iteration": (payload["bytes_sent"] if payload and "bytes_sent" in payload and payload.get(
            "strategy") == "stanza" else
            (getattr(runtime, "bytes_sent", 0) * world / steps if runtime is not None else None)),
    }
    if payload and payload.get("strategy") == "sms":
        result["bytes_per_iteration"] = payload["bytes_sent"] / steps
        result["full_bytes_per_iteration"] = payload["bytes_full"] / steps
    (Path(workdir) / "result-0.json").write_text(json.dumps(result))


def accuracy_at(evaluations: list, seconds: float) -> float | None:
    """The test accuracy at ``seconds`` into the run: the mean of the last 3 evaluations made by then (as the
    final accuracy is measured); None before the first."""
    made = [accuracy for moment, _, accuracy in evaluations if moment <= seconds]
    return sum(made[-3:]) / len(made[-3:]) if made else None


def accuracy_by_step(evaluations: list, step: int) -> float | None:
    """The test accuracy after ``step`` steps: the mean of the last 3 evaluations made by then."""
    made = [accuracy for _, at, accuracy in evaluations if at <= step]
    return sum(made[-3:]) / len(made[-3:]) if made else None


def time_to(evaluations: list, target: float) -> float | None:
    """Seconds from the first step until the test accuracy first reached ``target``: interpolated linearly between
    the last evaluation below it and the first at or above it (evaluations come once an epoch, so this is less
    coarse than the first epoch end above it); None when it was never reached."""
    previous = (0.0, 0.0)
    for seconds, _, accuracy in evaluations:
        if accuracy >= target:
            (before, low) = previous
            if accuracy == low:
                return seconds
            return before + (seconds - before) * max(0.0, target - low) / (accuracy - low)
        previous = (seconds, accuracy)
    return None


# -- the parts -----------------------------------------------------------------------------------------------------
def sms_runs(runs: int, quick: bool, say) -> dict[str, Any]:
    base = dict(SMS_WORKLOAD, epochs=4 if quick else SMS_WORKLOAD["epochs"])
    results: dict[str, Any] = {"target": SMS_TARGET, "workload": base, "scenarios": {}}
    for scenario, slow in SCENARIOS.items():
        per_way: dict[str, list] = {way: [] for way in SMS_WAYS}
        for run in range(runs):
            for way, options in SMS_WAYS.items():  # interleaved, so drift on the machine hits every way alike
                spec = {**base, "seed": run, "distributed": {**options, "slow": {**slow, "seed": run}}}
                if way == "sms":
                    # Longer, so that its accuracy can also be read at DDP's finishing time; its first
                    # base["epochs"] epochs are the same run (same data order, constant learning rate).
                    spec["epochs"] = int(base["epochs"] * SMS_LONGER)
                result = run_gang(spec, 2)
                result["time_to_target"] = time_to(result["evaluations"], SMS_TARGET)
                per_way[way].append(result)
                say(f"sms {scenario} run {run + 1}/{runs} {way}: to {SMS_TARGET:g} in "
                    f"{_text(result['time_to_target'])} s, final accuracy {result['final_accuracy']:.3f}, "
                    f"{result['steps']} steps in {result['seconds']:.1f} s")
        results["scenarios"][scenario] = {"slow": slow, "runs": per_way}
    return results


def stanza_runs(runs: int, quick: bool, say) -> dict[str, Any]:
    base = dict(STANZA_WORKLOAD, epochs=1 if quick else STANZA_WORKLOAD["epochs"])
    if quick:
        base["max_steps"] = 16
    per_way: dict[str, list] = {"stanza": [], "ddp": []}
    for run in range(runs):
        for way in per_way:
            spec = {**base, "seed": run, "distributed": {"strategy": way, "bandwidth_mbit": STANZA_MBIT}}
            result = run_gang(spec, 3)
            per_way[way].append(result)
            say(f"stanza run {run + 1}/{runs} {way}: {result['bytes_per_iteration'] / 1e6:.3f} MB per iteration, "
                f"{_text(result['step_ms'])} ms per iteration, final accuracy {_text(result['final_accuracy'])}")
    return {"workload": base, "mbit": STANZA_MBIT, "runs": per_way}


def sas_runs(runs: int, quick: bool, say, world: str = "synthetic") -> dict[str, Any]:
    from benchmarks.straggler.bench_sas import sas_figures

    return {"figures": sas_figures(runs=runs, progress=say, world=world)}


# -- figures -------------------------------------------------------------------------------------------------------
def _median(values: list) -> float | None:
    present = [value for value in values if value is not None]
    return percentile(present, 0.5) if present else None


def _range(values: list) -> list | None:
    present = [value for value in values if value is not None]
    return [min(present), max(present)] if present else None


def _text(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


def figures(results: dict[str, Any]) -> list[Figure]:
    found: list[Figure] = []
    sms = results.get("sms")
    if sms:
        target = sms["target"]
        for scenario, data in sms["scenarios"].items():
            runs = data["runs"]
            times = {way: [run["time_to_target"] for run in runs[way]] for way in runs}
            finals = {way: [run["final_accuracy"] for run in runs[way]] for way in runs}
            # SMS after the same steps as DDP (its run goes on longer; see sms_runs).
            finals["sms"] = [accuracy_by_step(sms_run["evaluations"], ddp_run["steps"])
                             for sms_run, ddp_run in zip(runs["sms"], runs["ddp"], strict=True)]
            what = ("one worker slowed 2x" if scenario == "one-slow"
                    else "random slow episodes (3x) on every worker")
            for way, text, goal in (("ddp", "bulk-synchronous DDP (PyTorch DistributedDataParallel)", 1 / 0.7),
                                    ("post-local-sgd", "PyTorch PostLocalSGD hook + PeriodicModelAverager(4)",
                                     None)):
                never = sum(value is None for value in times["sms"])
                found.append(Figure(
                    f"sms_time_to_accuracy_{scenario}_vs_{way}",
                    f"wall time to test accuracy {target:g}, 2 workers, {what} (target: >= 30% less time, "
                    f"i.e. ratio >= 1.43)" if goal else
                    f"wall time to test accuracy {target:g}, 2 workers, {what} (reported)",
                    _median(times["sms"]), _median(times[way]), "s", lower_is_better=True, target=goal,
                    mechanism_text="SMS: straggler prediction, batch dedup, gradient transfer control",
                    baseline_text=text,
                    extra={"runs": {"mechanism": times["sms"], "baseline": times[way]},
                           "range": {"mechanism": _range(times["sms"]), "baseline": _range(times[way])},
                           "never_reached": never}))
            # At equal time: SMS's accuracy when DDP ended (SMS runs the same epochs faster, so it had the
            # accuracy it had then; interpolated between evaluations).
            at_time = [accuracy_at(sms_run["evaluations"], ddp_run["seconds"])
                       for sms_run, ddp_run in zip(runs["sms"], runs["ddp"], strict=True)]
            ddp_final = finals["ddp"]
            time_gaps = [None if a is None or b is None else (a - b) * 100
                         for a, b in zip(at_time, ddp_final, strict=True)]
            time_gap = _median(time_gaps)
            found.append(Figure(
                f"sms_accuracy_at_equal_time_{scenario}", f"test accuracy at the wall time DDP took for its {runs['ddp'][0]['steps']} "
                f"steps, {what}: SMS then (it trains on) against DDP's final (target: within 0.5 point)",
                _median(at_time), _median(ddp_final), "accuracy", lower_is_better=False, target=None,
                extra={"gap_points": time_gap, "gap_runs": time_gaps,
                       "met": None if time_gap is None else time_gap >= -0.5}))
            gaps = [None if a is None or b is None else (a - b) * 100
                    for a, b in zip(finals["sms"], finals["ddp"], strict=True)]
            gap = _median(gaps)
            found.append(Figure(
                f"sms_final_accuracy_{scenario}", f"test accuracy (mean of the last 3 evaluations) after the same "
                f"steps, {what}: SMS against DDP (target: within 0.5 point)", _median(finals["sms"]), _median(finals["ddp"]), "accuracy",
                lower_is_better=False, target=None,
                extra={"gap_points": gap, "gap_runs": gaps, "met": None if gap is None else gap >= -0.5,
                       "post_local_sgd": _median(finals["post-local-sgd"])}))
    stanza = results.get("stanza")
    if stanza:
        runs = stanza["runs"]
        size = {way: [run["bytes_per_iteration"] for run in runs[way]] for way in runs}
        step = {way: [run["step_ms"] for run in runs[way]] for way in runs}
        finals = {way: [run["final_accuracy"] for run in runs[way]] for way in runs}
        found.append(Figure(
            "stanza_bytes_per_iteration", "bytes sent per iteration (all workers), cnn-fc on 3 workers (reported; "
            "the peers' study aims at >= 3x fewer)", _median(size["stanza"]), _median(size["ddp"]), "B",
            lower_is_better=True, target=None, mechanism_text="Stanza: 2 conv workers + 1 FC worker",
            baseline_text="DDP on 3 workers",
            extra={"runs": size, "range": {way: _range(size[way]) for way in size}}))
        found.append(Figure(
            "stanza_iteration_time", f"iteration time over an emulated {stanza['mbit']:g} Mbit/s link, cnn-fc on 3 "
            "workers (reported)", _median(step["stanza"]), _median(step["ddp"]), "ms", lower_is_better=True,
            target=None, mechanism_text="Stanza", baseline_text="DDP",
            extra={"runs": step, "range": {way: _range(step[way]) for way in step},
                   "final_accuracy": {way: _median(finals[way]) for way in finals}}))
    for sas in (results.get("sas"), results.get("sas-trace")):
        if not sas:
            continue
        for key, value in sas["figures"].items():
            found.append(Figure(key.replace("-", "_"), value["figure"], value.get("mechanism"),
                                value.get("baseline"), value.get("unit", ""),
                                lower_is_better=value.get("lower_is_better", True), target=value.get("target"),
                                mechanism_text=value.get("mechanism_text", "SAS"),
                                baseline_text=value.get("baseline_text", ""),
                                extra={k: v for k, v in value.items() if k in ("runs", "range", "note")}))
    return found


def main(quick: bool = False, output: str | None = None,
         parts: tuple[str, ...] = ("sms", "stanza", "sas", "sas-trace"),
         runs: int | None = None) -> int:
    say = progress("[straggler] ")
    runs = runs or (1 if quick else 3)
    results: dict[str, Any] = {}
    if "sms" in parts:
        results["sms"] = sms_runs(runs, quick, say)
    if "stanza" in parts:
        results["stanza"] = stanza_runs(runs, quick, say)
    if "sas" in parts:
        results["sas"] = sas_runs(runs, quick, say)
    if "sas-trace" in parts:
        results["sas-trace"] = sas_runs(runs, quick, say, world="trace")
    doc = document("straggler", quick, figures(results), details=results)
    write(doc, output)
    print(figures_table(doc))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=int)
    parser.add_argument("--world", type=int)
    parser.add_argument("--workdir")
    parser.add_argument("--spec")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--parts", default="sms,stanza,sas,sas-trace")
    parser.add_argument("--runs", type=int)
    arguments = parser.parse_args()
    if arguments.worker is not None:
        _worker(arguments.worker, arguments.world, arguments.workdir, json.loads(arguments.spec))
    else:
        sys.exit(main(arguments.quick, arguments.output, tuple(arguments.parts.split(",")), arguments.runs))
