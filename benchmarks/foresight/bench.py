"""``strata bench foresight``: start-time estimates and what-if replays of the queue simulator (issue 37).

Everything runs in simulated time on a simulated cluster through :mod:`strata.scheduling.foresight` (the
scheduler's own decision core); no database, no node.

1. **Start-time estimate error.** A day of mixed jobs (1/2/4/8 GPUs and half GPUs, three teams with fair-share
   weights 1, 1 and 2, log-normal run times, time limits 1.5-5x the run time, arrivals heavier mid-day) is replayed
   on 100 nodes of 8 GPUs with the true run times: that is what actually happens. Every ``SNAPSHOT`` seconds the
   queue is copied and the first ``TARGETS`` waiting jobs are estimated from it, knowing nothing of later
   submissions: ours (:func:`foresight.estimate`: run times as quantiles around a noisy prediction of the truth,
   log-normal sigma 0.35, as the history model gives; ``SAMPLES`` samples) and a Slurm-style estimate (every run
   time is its time limit; of a running job, the limit less what it ran). The figure is the median absolute error
   of the estimated start against the actual one, over all snapshots; ratio Slurm / ours, target >= 3. The 80 %
   interval's coverage (the share of actual starts within it) is reported beside it (target 0.70-0.90).
   With ``arrivals=True`` ours also models later submissions (:class:`foresight.Arrivals`): each team's rate by
   hour of day and its jobs, learned from a preceding day generated with another seed (never from the day being
   predicted). Off by default: at the quick size it made both the error and the coverage worse (see
   docs/benchmarks.md).
2. **What-if replay time**: 7 days of 10,000 jobs (quick: 2,000) replayed twice (current and a doubled quota of
   one team, :func:`whatif.compare`) on the same cluster, seconds; against the 60 s budget (ratio 60 / ours,
   target >= 1).
3. **Work lost to preemption** (:func:`lost_work`): a day with 15 % urgent jobs and 40 % elastic ones, replayed
   by ours (shrink before stop, checkpoint before stop) and preempt-only (kill; keep the last periodic
   checkpoint); GPU-hours lost, ratio preempt-only / ours, target >= 2.

Each figure is measured once per seed (0, 1, 2) in one invocation; the document holds the medians and ranges.

Run ``strata bench foresight`` (``--quick`` for smaller sizes, ``--output F`` for the common JSON).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time

from benchmarks import benchkit

NODES, GPUS = 100, 8
SNAPSHOT = 3600.0
TARGETS = 40
SAMPLES = 16
SIGMA = 0.35
SIZES = {False: {"day_jobs": 3000, "week_jobs": 10_000, "nodes": NODES},
         True: {"day_jobs": 600, "week_jobs": 2000, "nodes": 20}}


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
    import django

    django.setup()


def _nodes(count: int = NODES):
    from strata.scheduling.foresight import SimNode

    return [SimNode(id=n, name=f"node-{n}", labels={}, devices=[(n * 100 + i, i, 80 * 2**30) for i in range(GPUS)])
            for n in range(count)]


def _history(count: int, days: float, seed: int):
    """``count`` jobs over ``days``: (Past, time limit) pairs."""
    from strata.scheduling.whatif import Past

    rng = random.Random(seed)
    span = days * 86400.0
    jobs = []
    for index in range(count):
        # Heavier mid-day: a mixture of uniform arrivals and a bump around each day's noon.
        day = rng.randrange(max(int(days), 1))
        moment = (day * 86400.0 + rng.gauss(43200.0, 14000.0)) if rng.random() < 0.6 else rng.uniform(0, span)
        submit = min(max(moment, 0.0), span)
        gpus = rng.choice([0.5, 1, 1, 1, 2, 2, 4, 8])
        runtime = max(60.0, math.exp(rng.gauss(math.log(7200.0), 0.9)))
        limit = max(1800.0, runtime * rng.uniform(1.5, 5.0))
        team = rng.choice([1, 1, 2, 3, 3, 3])
        past = Past(id=index, team_id=team, kind="train", resources={"gpus": float(gpus), "workers": 1},
                    priority=0, submit=submit, runtime=runtime, wait=0.0)
        jobs.append((past, limit))
    return jobs


def _quotas():
    from strata.quotas.models import Quota

    return {1: Quota(team_id=1, weight=1.0), 2: Quota(team_id=2, weight=1.0), 3: Quota(team_id=3, weight=2.0)}


def learned_arrivals(count: int, seed: int):
    """What ours knows of later submissions: each team's rate by hour of day and its jobs (shapes and run times),
    learned from the preceding day (the same generator, another seed: never the day being predicted)."""
    from strata.scheduling.foresight import Arrivals, RunTime

    rows = [(past.team_id, past.submit - 86400.0, past.kind, past.resources, past.priority,
             RunTime.exact(past.runtime)) for past, _ in _history(count, 1.0, seed + 7919)]
    return Arrivals.learn(rows, since=-86400.0, until=0.0, bins=24, period=86400.0)


def estimate_error(count: int, seed: int = 0, nodes_count: int = NODES, arrivals: bool = False) -> dict:
    """Figure 1: the day replayed with true run times, snapshots estimated by ours and by the Slurm-style rule."""
    from strata.scheduling.foresight import QUEUED, RUNNING, RunTime, WaitCalibration, estimate, runtime_for
    from strata.scheduling.whatif import replay

    nodes, quotas = _nodes(nodes_count), _quotas()
    jobs = _history(count, 1.0, seed)
    later = learned_arrivals(count, seed) if arrivals else None
    limits = {past.id: limit for past, limit in jobs}
    truth = {past.id: past.runtime for past, _ in jobs}
    noise = random.Random(seed + 1)
    guess = {past.id: min(past.runtime * math.exp(noise.gauss(0.0, SIGMA)), limits[past.id]) for past, _ in jobs}
    snapshots: list = []
    due = [SNAPSHOT]

    def observe(sim) -> None:
        if sim.now < due[0]:
            return
        due[0] = sim.now + SNAPSHOT
        copies = []
        for job in sim.jobs.values():
            if job.state not in (RUNNING, QUEUED, "pending"):
                continue
            copies.append((job.id, job.state, job.team_id, dict(job.resources), job.queued_at, job.created,
                           job.started, list(job.allocs), job.share, job.stopping, job.ends))
        snapshots.append((sim.now, copies))

    actual = replay(nodes, [past for past, _ in jobs], quotas, observe=observe).starts

    def state(now: float, copies, ours: bool):
        from strata.scheduling.foresight import SimJob

        built = []
        for job_id, state_, team, resources, queued_at, created, started, allocs, share, stopping, ends in copies:
            elapsed = max(now - (started if started is not None else now), 0.0) if state_ == RUNNING else 0.0
            if ours:
                p50 = guess[job_id]
                history = RunTime(min(p50 * 0.55, limits[job_id]), p50, min(p50 * 1.8, limits[job_id]), "history")
                runtime = runtime_for(time_limit=limits[job_id], elapsed=elapsed, history=history)
            else:
                runtime = RunTime.exact(max(limits[job_id] - elapsed, 0.0), "time_limit")
            built.append(SimJob(id=job_id, team_id=team, kind="train", resources=resources, runtime=runtime,
                                state=state_, queued_at=queued_at, created=created, started=started,
                                allocs=allocs, share=share, stopping=stopping,
                                ends=ends if stopping else None, attempts=1 if state_ == RUNNING else 0))
        return built

    errors: dict[str, list[float]] = {"ours": [], "slurm": []}
    covered = total = 0
    # Online split-conformal recalibration (WaitCalibration): at each snapshot, from the earlier estimates whose
    # jobs have started by then (what a running cluster knows), never from the outcome being predicted.
    recorded: list[tuple[float, float, float]] = []  # (actual start, estimated wait, actual wait)
    calibrated_covered = calibrated_total = 0
    for now, copies in snapshots:
        waiting = [c for c in copies if c[1] != RUNNING and c[0] in actual]
        waiting.sort(key=lambda c: (c[4] if c[1] == QUEUED else math.inf, c[5]))
        targets = {c[0] for c in waiting[:TARGETS]}
        if not targets:
            continue
        for label, ours in (("ours", True), ("slurm", False)):
            answers = estimate(nodes, state(now, copies, ours), quotas, now=now, targets=targets,
                               samples=SAMPLES, quantum=30.0, horizon=3 * 86400.0,
                               arrivals=later if ours else None)
            calibration = WaitCalibration.learn([(est, act) for started, est, act in recorded if started <= now])
            fresh = []
            for job_id in targets:
                answer = answers.get(job_id)
                start = answer.start if answer is not None and answer.start is not None else now + 3 * 86400.0
                errors[label].append(abs(start - actual[job_id]))
                if not ours:
                    continue
                total += 1
                calibrated_total += 1
                if answer is not None and answer.low is not None:
                    high = answer.high if answer.high is not None else math.inf
                    covered += answer.low - 1.0 <= actual[job_id] <= high + 1.0
                    low, high = calibration.interval(now, start) if calibration is not None else (answer.low, high)
                    calibrated_covered += low - 1.0 <= actual[job_id] <= high + 1.0
                fresh.append((actual[job_id], start - now, actual[job_id] - now))
            recorded.extend(fresh)
    return {"jobs": count, "snapshots": len(snapshots), "estimates": len(errors["ours"]),
            "ours_median_abs_error_s": statistics.median(errors["ours"]) if errors["ours"] else None,
            "slurm_median_abs_error_s": statistics.median(errors["slurm"]) if errors["slurm"] else None,
            "coverage_80_simulated": covered / total if total else None,
            "coverage_80": calibrated_covered / calibrated_total if calibrated_total else None,
            "actual_wait_p50_s": statistics.median([actual[p.id] - p.submit for p, _ in jobs if p.id in actual]),
            "truth_runtime_p50_s": statistics.median(truth.values())}


def replay_time(count: int, seed: int = 0) -> dict:
    """Figure 2: 7 days of ``count`` jobs replayed under the current quotas and with team 1's doubled."""
    from strata.scheduling.whatif import compare

    nodes, quotas = _nodes(), _quotas()
    history = [past for past, _ in _history(count, 7.0, seed)]
    for quota in quotas.values():
        quota.max_gpus = 400.0
    cleaned = {"days": 7.0, "changes": {1: {"max_gpus": 800.0}}, "add": [], "remove": []}
    began = time.perf_counter()
    result = compare(nodes, history, quotas, cleaned)
    seconds = time.perf_counter() - began
    began = time.perf_counter()
    compare(nodes, history, quotas, cleaned, quantum=300.0)  # passes on a 5-minute grid instead of 30 s
    coarse = time.perf_counter() - began
    return {"jobs": count, "seconds": seconds, "seconds_300s_grid": coarse,
            "teams": {str(k): v for k, v in result["teams"].items()}, "cluster": result["cluster"]}


HIGH = 10  # the priority of the urgent arrivals of figure 3
PREEMPT_DELAY, CHECKPOINT_WRITE = 30.0, 60.0  # seconds: a stop, and a checkpoint written before a stop


def lost_work(count: int, seed: int = 0, nodes_count: int = NODES) -> dict:
    """Figure 3: the same kind of day with 15 % urgent (priority 10) jobs and 40 % elastic ones (``elastic:
    {min_share: half}``, among the jobs that can checkpoint), replayed twice through the simulator: ours (the
    victim choice shrinks elastic jobs before it stops any; a job that must stop writes a checkpoint first, 60 s)
    and preempt-only (no shrink; a victim is killed and keeps what its last periodic checkpoint saved). Every
    job checkpoints every 20-60 minutes of run, except 20 % that cannot checkpoint at all (a stop loses all they
    ran, in both). Work lost = GPU-hours run since the last checkpoint kept."""
    from strata.scheduling.whatif import replay

    nodes, quotas = _nodes(nodes_count), _quotas()
    rng = random.Random(seed + 31)
    history = []
    for past, _ in _history(count, 1.0, seed):
        past.priority = HIGH if rng.random() < 0.15 else 0
        past.can_checkpoint = rng.random() >= 0.2
        past.checkpoint_every = rng.uniform(1200.0, 3600.0)
        if past.can_checkpoint and rng.random() < 0.5:
            past.resources = {**past.resources, "elastic": {"min_share": float(past.resources["gpus"]) / 2}}
        history.append(past)
    figures = {}
    for label, preempt_only in (("ours", False), ("preempt_only", True)):
        run = replay(nodes, history, quotas, preempt_delay=PREEMPT_DELAY, checkpoint_write=CHECKPOINT_WRITE,
                     preempt_only=preempt_only)
        jct = [run.ends[past.id] - past.submit for past in history if past.id in run.ends]
        urgent = [run.ends[past.id] - past.submit for past in history if past.id in run.ends
                  and past.priority == HIGH]
        figures[label] = {"lost_gpu_hours": run.lost_gpu_seconds / 3600.0, "preemptions": len(run.preempted),
                          "shrinks": len(run.shrunk),
                          "checkpoint_write_gpu_hours": run.checkpoint_gpu_seconds / 3600.0,
                          "jct_p50_s": statistics.median(jct) if jct else None,
                          "urgent_jct_p50_s": statistics.median(urgent) if urgent else None,
                          "never_ended": len(history) - len(jct)}
    return {"jobs": count, "elastic": sum(1 for past in history if "elastic" in past.resources),
            "cannot_checkpoint": sum(1 for past in history if not past.can_checkpoint),
            "urgent": sum(1 for past in history if past.priority == HIGH), **figures}


SEEDS = (0, 1, 2)


def _median_range(values: list) -> tuple:
    found = [value for value in values if value is not None]
    if not found:
        return None, None, None
    return statistics.median(found), min(found), max(found)


def main(quick: bool = False, output: str | None = None, seeds: tuple = SEEDS) -> int:
    """All three figures once per seed (each seed: its own day, week and noise); the document's figures are the
    medians, with each seed's numbers and the range in ``details``."""
    _setup()
    sizes = SIZES[quick]
    say = benchkit.progress("foresight")
    runs: dict[str, list] = {"estimates": [], "replay": [], "lost_work": []}
    for seed in seeds:
        say(f"seed {seed}: [1/3] start-time estimates: a day of {sizes['day_jobs']} jobs on {sizes['nodes']} nodes "
            f"x {GPUS} GPUs")
        first = estimate_error(sizes["day_jobs"], seed=seed, nodes_count=sizes["nodes"])
        say(f"  ours {first['ours_median_abs_error_s']} s, Slurm-style {first['slurm_median_abs_error_s']} s, "
            f"coverage {first['coverage_80']}, {first['estimates']} estimates")
        say(f"seed {seed}: [2/3] what-if replay: 7 days of {sizes['week_jobs']} jobs, twice")
        second = replay_time(sizes["week_jobs"], seed=seed)
        say(f"  {second['seconds']:.1f} s (30 s pass grid), {second['seconds_300s_grid']:.1f} s (300 s grid)")
        say(f"seed {seed}: [3/3] work lost to preemption: a day of {sizes['day_jobs']} jobs, ours and preempt-only")
        third = lost_work(sizes["day_jobs"], seed=seed, nodes_count=sizes["nodes"])
        say(f"  {third['ours']['lost_gpu_hours']:.1f} GPU-h lost (ours), "
            f"{third['preempt_only']['lost_gpu_hours']:.1f} GPU-h (preempt-only)")
        runs["estimates"].append(first)
        runs["replay"].append(second)
        runs["lost_work"].append(third)
    error, error_low, error_high = _median_range([run["ours_median_abs_error_s"] for run in runs["estimates"]])
    slurm, _, _ = _median_range([run["slurm_median_abs_error_s"] for run in runs["estimates"]])
    ratios = [run["slurm_median_abs_error_s"] / run["ours_median_abs_error_s"] for run in runs["estimates"]
              if run["ours_median_abs_error_s"] and run["slurm_median_abs_error_s"]]
    coverage = _median_range([run["coverage_80"] for run in runs["estimates"]])
    seconds = _median_range([run["seconds"] for run in runs["replay"]])
    ours_lost = _median_range([run["ours"]["lost_gpu_hours"] for run in runs["lost_work"]])
    baseline_lost = _median_range([run["preempt_only"]["lost_gpu_hours"] for run in runs["lost_work"]])
    lost_ratios = [run["preempt_only"]["lost_gpu_hours"] / run["ours"]["lost_gpu_hours"]
                   for run in runs["lost_work"] if run["ours"]["lost_gpu_hours"]]
    figures = [
        benchkit.Figure("estimate_error", "start-time estimate median absolute error (a replayed day)",
                        error, slurm, "s", target=3.0,
                        extra={"coverage_80": coverage[0], "coverage_80_range": list(coverage[1:]),
                               "coverage_target": [0.7, 0.9], "error_range_s": [error_low, error_high],
                               "ratio_range": [min(ratios), max(ratios)] if ratios else None,
                               "median_of_ratios": statistics.median(ratios) if ratios else None}),
        benchkit.Figure("whatif_replay", f"what-if replay of 7 days of {sizes['week_jobs']} jobs (two replays)",
                        seconds[0], 60.0, "s", target=1.0, baseline_text="60 s budget",
                        extra={"seconds_range": list(seconds[1:])}),
        benchkit.Figure("lost_work", "GPU-hours of work lost to preemption (a replayed day)", ours_lost[0],
                        baseline_lost[0], "GPU-h", target=2.0, baseline_text="preempt-only",
                        extra={"ours_range": list(ours_lost[1:]), "baseline_range": list(baseline_lost[1:]),
                               "ratio_range": [min(lost_ratios), max(lost_ratios)] if lost_ratios else None,
                               "median_of_ratios": statistics.median(lost_ratios) if lost_ratios else None}),
    ]
    doc = benchkit.document("foresight", quick, figures, details={"seeds": list(seeds), **runs})
    print(benchkit.figures_table(doc))
    if output:
        benchkit.write(doc, output)
    return 0
