"""SAS's figures: the simulator (:mod:`benchmarks.straggler.simulator`) run ``runs`` times with different seeds.

Each run builds one cluster (100 nodes, time-varying availability) and one job stream from its seed and runs
every policy on exactly those: SAS, least-loaded (each worker where it would run fastest given the availability
*now*) and random. Figures, in the common benchmark shape (:mod:`benchmarks.benchkit`):

- ``sas-jct``: average job completion time, SAS (mechanism) against least-loaded (baseline); the median over the
  runs of each, ``ratio`` = baseline / mechanism (higher is better for SAS), target 1.3; ``range`` is the
  smallest and largest ratio of one run.
- ``sas-vs-random``: the same against random placement (reported, no target).
- ``sas-decision-ms``: SAS's mean decision latency (grouping when the forecasts changed, and the choice) against
  least-loaded's (reported, no target; the forecasts are made by the nodes and not counted).

Beside them (``details`` of each figure): p95 JCT, the straggler rate and the mean slowdown of every policy, and
of the ``oracle`` reference (the same rule on the true future availability: what perfect forecasts would give;
``sas-jct``'s ``note`` gives its ratio).

``world="trace"`` (:mod:`benchmarks.straggler.traceworld`: co-located jobs, a diurnal cycle and spot
preemptions, with statistics from published GPU-cluster studies) gives the same figures under ``sas-trace-*``
keys, plus ``sas-trace-vs-on-demand-first`` (least-loaded that fills on-demand nodes first), the gangs preempted
and the work lost per policy, and every world parameter with its source in ``details``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from benchmarks.benchkit import percentile
from benchmarks.straggler.simulator import POLICIES, TRACE_POLICIES, Config, jobs, run

REFERENCE = "oracle"  # run beside the policies: what perfect foresight of availability would give

JCT_TARGET = 1.3


def _median(values: list[float]) -> float:
    return float(percentile(values, 0.5))


def _ratio(baseline: float, mechanism: float) -> float | None:
    return baseline / mechanism if mechanism else None


def _figure(figure: str, mechanism: list[float], baseline: list[float], unit: str, target: float | None,
            mechanism_text: str, baseline_text: str, details: dict[str, Any]) -> dict[str, Any]:
    middle, base = _median(mechanism), _median(baseline)
    ratio = _ratio(base, middle)
    ratios = [r for r in (_ratio(b, m) for m, b in zip(mechanism, baseline, strict=True)) if r is not None]
    return {"figure": figure, "mechanism": middle, "baseline": base, "unit": unit, "lower_is_better": True,
            "ratio": ratio, "target": target, "met": None if target is None else (ratio is not None and ratio >= target),
            "mechanism_text": mechanism_text, "baseline_text": baseline_text,
            "runs": {"mechanism": mechanism, "baseline": baseline, "ratio": ratios},
            "range": [min(ratios), max(ratios)] if ratios else None, "details": details}


def sas_figures(runs: int = 3, seed: int = 0, progress: Callable[[str], None] | None = print,
                config: Config | None = None, world: str | None = None) -> dict[str, dict[str, Any]]:
    """Run the simulator ``runs`` times (seeds ``seed``, ``seed + 1`` ...) and return SAS's figures (see the
    module docstring). ``config`` overrides the simulated cluster (its seed is replaced per run); ``world``
    overrides its world ("synthetic" or "trace")."""
    base = config or Config()
    if world is not None:
        base = replace(base, world=world)
    trace = base.world == "trace"
    policies = TRACE_POLICIES if trace else POLICIES
    say = progress or (lambda line: None)
    results = []
    for number in range(runs):
        say(f"sas: {base.world} world, run {number + 1}/{runs} (seed {seed + number}): {base.nodes} simulated "
            "nodes, every policy on the same availability traces and jobs")
        results.append(run(replace(base, seed=seed + number), (*policies, REFERENCE), progress=say))
    per = {name: {key: [getattr(result[name], key) for result in results]
                  for key in ("avg_jct_s", "p95_jct_s", "avg_wait_s", "straggler_rate", "avg_slowdown",
                              "decision_ms", "finished", "jobs")}
           for name in (*policies, REFERENCE)}
    for name in per:
        per[name]["preempted"] = [result[name].details.get("preempted", 0) for result in results]
        per[name]["lost_work_s"] = [result[name].details.get("lost_work_s", 0.0) for result in results]
    details: dict[str, Any] = {
        "world": base.world,
        "policies": {name: {key: {"median": _median(values), "runs": values} for key, values in metrics.items()}
                     for name, metrics in per.items()},
        "sas": [result["sas"].details for result in results],
        "cluster": {"nodes": base.nodes, "slots": base.slots, "tick_s": base.tick_s, "arrivals_s": base.arrivals_s,
                    "load": base.load, "horizon_s": base.horizon_s, "theta": base.theta,
                    "bursty_fraction": base.bursty_fraction, "checkpoint_s": base.checkpoint_s,
                    "restart_s": base.restart_s}}
    if trace:
        from benchmarks.straggler.traceworld import parameters, spare_capacity

        details["world_parameters"] = parameters()
        details["cluster"]["load_of_spare_capacity"] = spare_capacity()
    what = (f"{base.nodes} simulated nodes, availability from published GPU-cluster statistics (co-located jobs, "
            "diurnal load, spot preemptions)" if trace else f"{base.nodes} simulated nodes, time-varying availability")
    prefix = "sas-trace" if trace else "sas"
    ceiling = _median([b / m for m, b in zip(per[REFERENCE]["avg_jct_s"], per["least-loaded"]["avg_jct_s"],
                                             strict=True)])
    jct = _figure(f"average JCT, {what}", per["sas"]["avg_jct_s"], per["least-loaded"]["avg_jct_s"],
                  "s", JCT_TARGET, "SAS: availability forecasts, KMeans node groups, P(adequate) >= "
                  f"{base.theta:g}", "least-loaded: highest availability now", details)
    # No placement can beat every job running at full speed from its arrival: the average JCT is at least the
    # average work, so least-loaded's JCT over it bounds any policy's ratio.
    work = [sum(job.work for job in stream) / len(stream) if stream else 0.0
            for stream in (jobs(replace(base, seed=seed + number)) for number in range(runs))]
    bounds = [jct_s / mean for jct_s, mean in zip(per["least-loaded"]["avg_jct_s"], work, strict=True) if mean]
    details["bound"] = {"mean_work_s": work, "least_loaded_over_work": bounds}
    jct["note"] = (f"reference: the same placement rule on the true future availability (no forecast error) "
                   f"reaches a median ratio of {ceiling:.2f} against least-loaded on these runs; no placement at "
                   f"all can beat every job running at full speed from its arrival, a ratio of at most "
                   f"{_median(bounds):.2f} (runs {', '.join(f'{b:.2f}' for b in bounds)})")
    found = {
        f"{prefix}-jct": jct,
        f"{prefix}-vs-least-allocated": _figure(
            f"average JCT against least-allocated placement (Kubernetes' default scoring: blind to measured "
            f"availability), {what}", per["sas"]["avg_jct_s"], per["least-allocated"]["avg_jct_s"], "s", None,
            "SAS", "least-allocated: fewest workers and least demand requested", details),
        f"{prefix}-vs-random": _figure(f"average JCT against random placement, {what}", per["sas"]["avg_jct_s"],
                                       per["random"]["avg_jct_s"], "s", None, "SAS", "random placement", details),
        f"{prefix}-decision-ms": _figure(f"placement decision latency, {what}", per["sas"]["decision_ms"],
                                         per["least-loaded"]["decision_ms"], "ms", None,
                                         "SAS: grouping (when forecasts change) and choice", "least-loaded", {}),
    }
    if trace:
        found[f"{prefix}-vs-on-demand-first"] = _figure(
            f"average JCT against least-loaded placement that fills on-demand nodes first, {what}",
            per["sas"]["avg_jct_s"], per["on-demand-first"]["avg_jct_s"], "s", None, "SAS",
            "on-demand first, then least-loaded", details)
    return found
