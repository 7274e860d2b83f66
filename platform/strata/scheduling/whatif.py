"""What-if: replay the last days of real submissions under a proposed quota or cluster, through the queue simulator.

Every job submitted in the window that started (``Job.created_at``, its resources, priority and team) is submitted
again at the same moment; it runs for as long as its attempts actually ran (a preempted job resumes with what it had
left), and its waits (admission and queue) are recomputed by :class:`strata.scheduling.foresight.Simulator`, the
scheduler's own decision core. Two replays run on the same history: the current settings and the proposed ones
(quota fields and fair-share weights per team, nodes added or removed); each gives, per team, the median and 90th
percentile wait, the median job completion time (submit to end), the GPU utilization and the preemptions, beside
the waits that were recorded. There is no second scheduler here: only the input (history) and the tallies.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from strata.scheduling.foresight import (
    DONE,
    PENDING,
    QUEUED,
    RUNNING,
    RunTime,
    SimJob,
    SimNode,
    Simulator,
    replace_quota,
)

MAX_DAYS = 90.0
MAX_NODES = 1000  # nodes one change may add
PASS_QUANTUM = 30.0  # simulated passes run on this grid of seconds (as the scheduler's beat runs them)
# Seconds a preempted job takes to give its devices back. Never 0: with no delay a victim queues again in the very
# pass its preemptor still waits in, lower-priority jobs refill the room it was preempted for, and a replay with
# priorities can preempt the same jobs over and over without simulated time moving on.
PREEMPT_DELAY = 10.0
NODE_FIELDS = ("count", "gpus", "gpu_memory", "labels")
WHATIF_FIELDS = ("max_gpus", "max_gpu_memory", "max_cpus", "max_memory", "max_concurrent_jobs", "gpu_hours",
                 "window_hours", "priority", "weight")  # the quota fields a replay uses (not roots, keep, budgets)


class WhatIfInvalid(ValueError):
    """A malformed what-if request: ``errors`` maps every bad field (dotted) to what is wrong with it."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{name}: {text}" for name, text in errors.items()))
        self.errors = errors


@dataclass
class Past:
    """A job of the replayed history: when it was submitted and how long it ran (seconds from the window's start),
    and what actually happened (``wait``: submit to first start; ``jct``: submit to end, None if not ended)."""

    id: object
    team_id: int
    kind: str
    resources: dict
    priority: int
    submit: float
    runtime: float
    wait: float
    jct: float | None = None
    checkpoint_every: float | None = None  # seconds between its periodic checkpoints (None: it loses nothing)
    can_checkpoint: bool = True


@dataclass
class Replay:
    """One replay's outcome: job id -> first start and end (simulated seconds), the preempted jobs, and the
    GPUs each team held at each pass beside what it asked for (``timeline``: ``(time, {team: (held, demand)})``)."""

    starts: dict = field(default_factory=dict)
    ends: dict = field(default_factory=dict)
    preempted: list = field(default_factory=list)
    gpu_seconds: dict = field(default_factory=lambda: defaultdict(float))
    timeline: list = field(default_factory=list)
    span: float = 0.0
    gpus: float = 0.0
    shrunk: list = field(default_factory=list)  # the jobs shrunk (one entry per shrink)
    lost_gpu_seconds: float = 0.0  # work lost to preemption (Simulator.lost_gpu_seconds)
    checkpoint_gpu_seconds: float = 0.0  # GPU-seconds victims held while writing a checkpoint before they stopped


def _gpus(resources: dict) -> float:
    return float(resources.get("gpus", 0) or 0) * int(resources.get("workers", 1) or 1)


def replay(nodes: list[SimNode], history: list[Past], quotas: dict, *, quantum: float = PASS_QUANTUM,
           timeline: bool = False, observe=None, **options) -> Replay:
    """Submit ``history`` again at its submit times and run it to the end through the simulator. Finished jobs
    leave the simulation and future ones enter it only when submitted, so a pass sees what a real one would.
    ``observe(sim)``, if given, is called after every pass (a benchmark takes snapshots of the queue there).
    ``options``: the Simulator's (``preempt_delay``, PREEMPT_DELAY by default; ``preempt_only``,
    ``checkpoint_write``)."""
    future = sorted(history, key=lambda past: (past.submit, str(past.id)))
    start = future[0].submit if future else 0.0
    options = {"preempt_delay": PREEMPT_DELAY, **options}
    sim = Simulator(nodes, [], quotas, now=start, quantum=quantum, **options)
    result = Replay(gpus=float(sum(len(node.devices) for node in nodes)))
    upcoming = 0
    placed = 0
    while True:
        while upcoming < len(future) and future[upcoming].submit <= sim.now:
            past = future[upcoming]
            job = SimJob(id=past.id, team_id=past.team_id, kind=past.kind, resources=dict(past.resources),
                         runtime=RunTime.exact(past.runtime), priority=past.priority, state=PENDING,
                         created=past.submit, checkpoint_every=past.checkpoint_every,
                         can_checkpoint=past.can_checkpoint)
            job.duration = past.runtime
            sim.jobs[job.id] = job
            upcoming += 1
        before, shrinks_before = len(sim.preemptions), len(sim.shrinks)
        if any(job.state in (PENDING, QUEUED) for job in sim.jobs.values()):
            sim.step()  # (a pass with nothing waiting decides nothing)
        for placement in sim.placements[placed:]:
            result.starts.setdefault(placement.job_id, placement.time)
        placed = len(sim.placements)
        for _, _, victims in sim.preemptions[before:]:
            result.preempted.extend(victims)
        for _, _, shrunk in sim.shrinks[shrinks_before:]:
            result.shrunk.extend(victim for victim, _ in shrunk)
        if observe is not None:
            observe(sim)
        if timeline:
            held: dict = defaultdict(float)
            demand: dict = defaultdict(float)
            for job in sim.jobs.values():
                if job.state != DONE:
                    demand[job.team_id] += _gpus(job.resources)
                if job.state == RUNNING and not job.stopping:
                    held[job.team_id] += job.share
            result.timeline.append((sim.now, {team: (held[team], demand[team]) for team in demand}))
        for job_id in [job.id for job in sim.jobs.values() if job.state == DONE]:
            job = sim.jobs.pop(job_id)
            result.ends[job_id] = job.ended
        times = [job.ends for job in sim.jobs.values() if job.state == RUNNING and job.ends is not None]
        if upcoming < len(future):
            times.append(future[upcoming].submit)
        if not times:
            break
        moment = min(times)
        if quantum > 0:
            moment = sim.origin + math.ceil((moment - sim.origin) / quantum - 1e-9) * quantum
        # The GPU-seconds held until the next pass, by team (utilization).
        for job in sim.jobs.values():
            if job.state == RUNNING:
                result.gpu_seconds[job.team_id] += job.share * (max(moment, sim.now) - sim.now)
        sim.advance(moment)
    result.span = max([*result.ends.values(), start]) - start
    result.lost_gpu_seconds, result.checkpoint_gpu_seconds = sim.lost_gpu_seconds, sim.checkpoint_gpu_seconds
    return result


# --- the history and the proposed cluster ---------------------------------------------------------------------

def load_history(days: float, now: datetime) -> tuple[list[Past], float]:
    """The jobs submitted in the last ``days`` that started, with the seconds their attempts ran (to ``now`` for
    one still running), and the window's start as epoch seconds."""
    from strata.jobs.models import Attempt, Job

    since = now - timedelta(days=days)
    origin = since.timestamp()
    rows = list(Job.objects.filter(created_at__gte=since, created_at__lte=now, nested=False,
                                   started_at__isnull=False).values_list(
        "id", "team_id", "kind", "resources", "priority", "created_at", "started_at", "finished_at"))
    ran: dict = defaultdict(float)
    for job_id, started, ended in Attempt.objects.filter(job_id__in=[row[0] for row in rows],
                                                         started_at__isnull=False).values_list(
            "job_id", "started_at", "ended_at"):
        ran[job_id] += max(((ended or now) - started).total_seconds(), 0.0)
    history = []
    for job_id, team_id, kind, resources, priority, created, started, finished in rows:
        runtime = ran.get(job_id) or max(((finished or now) - started).total_seconds(), 0.0)
        history.append(Past(id=job_id, team_id=team_id, kind=kind, resources=resources or {}, priority=priority,
                            submit=created.timestamp() - origin, runtime=max(runtime, 1.0),
                            wait=max((started - created).total_seconds(), 0.0),
                            jct=None if finished is None else max((finished - created).total_seconds(), 0.0)))
    return history, origin


def change_nodes(nodes: list[SimNode], add: list[dict], remove: list[dict]) -> list[SimNode]:
    """``nodes`` with ``remove`` (each: ``count`` nodes whose labels include ``labels``, the last ones first) taken
    out and ``add`` (each: ``count`` nodes of ``gpus`` devices of ``gpu_memory`` bytes with ``labels``) put in."""
    kept = list(nodes)
    for change in remove:
        wanted = change.get("labels") or {}
        matching = [node for node in kept if all(node.labels.get(k) == v for k, v in wanted.items())]
        for node in matching[::-1][:change["count"]]:
            kept.remove(node)
    device_id = -1
    for number, change in enumerate(add):
        for copy in range(change["count"]):
            devices = []
            for index in range(change["gpus"]):
                devices.append((device_id, index, change["gpu_memory"]))
                device_id -= 1
            kept.append(SimNode(id=f"what-if-{number}-{copy}", name=f"what-if-{number}-{copy}",
                                labels=dict(change.get("labels") or {}), devices=devices))
    return kept


def clean_request(data) -> dict:
    """``{days, changes: {team slug: {quota field: value}}, nodes: {add: [...], remove: [...]}}`` typed and
    checked; raises WhatIfInvalid naming every bad field. ``changes`` maps to team ids."""
    from strata.accounts.models import Team
    from strata.quotas.services import QuotaInvalid, quota_clean

    errors: dict[str, str] = {}
    if not isinstance(data, dict):
        raise WhatIfInvalid({"body": "a JSON object"})
    for name in data:
        if name not in ("days", "changes", "nodes"):
            errors[name] = "not a what-if field (days, changes, nodes)"
    days = data.get("days", 7)
    if isinstance(days, str):
        try:
            days = float(days)
        except ValueError:
            pass
    if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days <= MAX_DAYS:
        errors["days"] = f"a number of days in (0, {MAX_DAYS:g}]"
        days = 7
    changes: dict = {}
    raw = data.get("changes", {})
    if not isinstance(raw, dict):
        errors["changes"] = "an object: {team slug: {quota field: value}}"
        raw = {}
    teams = {team.slug: team.pk for team in Team.objects.filter(slug__in=[str(slug) for slug in raw])}
    for slug, fields in raw.items():
        if slug not in teams:
            errors[f"changes.{slug}"] = "no such team"
            continue
        if not isinstance(fields, dict) or not fields:
            errors[f"changes.{slug}"] = "an object of quota fields: " + ", ".join(WHATIF_FIELDS)
            continue
        for name in fields:
            if name not in WHATIF_FIELDS:
                errors[f"changes.{slug}.{name}"] = "not a what-if quota field (" + ", ".join(WHATIF_FIELDS) + ")"
        try:
            changes[teams[slug]] = quota_clean({k: v for k, v in fields.items() if k in WHATIF_FIELDS})
        except QuotaInvalid as error:
            errors.update({f"changes.{slug}.{name}": text for name, text in error.errors.items()})
    nodes = data.get("nodes", {}) or {}
    added: list[dict] = []
    removed: list[dict] = []
    if not isinstance(nodes, dict):
        errors["nodes"] = "an object: {add: [...], remove: [...]}"
        nodes = {}
    for name in nodes:
        if name not in ("add", "remove"):
            errors[f"nodes.{name}"] = "not a nodes field (add, remove)"
    for verb, target in (("add", added), ("remove", removed)):
        entries = nodes.get(verb, [])
        entries = [entries] if isinstance(entries, dict) else entries
        if not isinstance(entries, list):
            errors[f"nodes.{verb}"] = "a list of {count, gpus, gpu_memory, labels}"
            continue
        for position, entry in enumerate(entries):
            where = f"nodes.{verb}.{position}"
            if not isinstance(entry, dict):
                errors[where] = "an object: {count, gpus, gpu_memory, labels}"
                continue
            for name in entry:
                if name not in NODE_FIELDS:
                    errors[f"{where}.{name}"] = "not a node field (" + ", ".join(NODE_FIELDS) + ")"
            shape = {"count": entry.get("count", 1), "gpus": entry.get("gpus", 8),
                     "gpu_memory": entry.get("gpu_memory", 80 * 2**30), "labels": entry.get("labels") or {}}
            for name, low, high in (("count", 1, MAX_NODES), ("gpus", 0, 64), ("gpu_memory", 1, 2**50)):
                value = shape[name]
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                    errors[f"{where}.{name}"] = f"a whole number in [{low}, {high}]"
            if not isinstance(shape["labels"], dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in shape["labels"].items()):
                errors[f"{where}.labels"] = "an object of string labels"
            target.append(shape)
    if errors:
        raise WhatIfInvalid(errors)
    return {"days": float(days), "changes": changes, "add": added, "remove": removed}


# --- the comparison -----------------------------------------------------------------------------------------------

def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def team_figures(run: Replay, history: list[Past]) -> dict[int, dict]:
    """Per team: jobs, median and 90th percentile wait, median JCT (seconds), GPU utilization (the share of the
    cluster's GPU-seconds over the replay it held), preemptions (victims), and jobs never placed."""
    by_team: dict = defaultdict(list)
    for past in history:
        by_team[past.team_id].append(past)
    preempted: dict = defaultdict(int)
    team_of = {past.id: past.team_id for past in history}
    for victim in run.preempted:
        preempted[team_of.get(victim)] += 1
    capacity = run.gpus * run.span
    figures = {}
    for team_id, jobs in by_team.items():
        waits = [run.starts[past.id] - past.submit for past in jobs if past.id in run.starts]
        jcts = [run.ends[past.id] - past.submit for past in jobs if past.id in run.ends]
        figures[team_id] = {
            "jobs": len(jobs), "wait_p50": _round(statistics.median(waits) if waits else None),
            "wait_p90": _round(_p(waits, 0.9)), "jct_p50": _round(statistics.median(jcts) if jcts else None),
            "utilization": round(run.gpu_seconds.get(team_id, 0.0) / capacity, 4) if capacity else 0.0,
            "preemptions": preempted.get(team_id, 0), "never_placed": len(jobs) - len(waits)}
    return figures


def actual_figures(history: list[Past]) -> dict[int, dict]:
    by_team: dict = defaultdict(list)
    for past in history:
        by_team[past.team_id].append(past)
    figures = {}
    for team_id, jobs in by_team.items():
        waits = [past.wait for past in jobs]
        jcts = [past.jct for past in jobs if past.jct is not None]
        figures[team_id] = {"jobs": len(jobs), "wait_p50": _round(statistics.median(waits)),
                            "wait_p90": _round(_p(waits, 0.9)),
                            "jct_p50": _round(statistics.median(jcts) if jcts else None)}
    return figures


def compare(nodes: list[SimNode], history: list[Past], quotas: dict, cleaned: dict, *,
            quantum: float = PASS_QUANTUM) -> dict:
    """Replay ``history`` under ``quotas`` (team id -> Quota) on ``nodes`` and under the proposed changes;
    the per-team figures of both and of what was recorded (keys: team ids)."""
    from strata.quotas.models import Quota

    proposed_quotas = {team: replace_quota(quota) for team, quota in quotas.items()}
    for team_id, fields in cleaned["changes"].items():
        quota = proposed_quotas.get(team_id) or Quota(team_id=team_id)
        for name, value in fields.items():
            setattr(quota, name, value)
        proposed_quotas[team_id] = quota
    proposed_nodes = change_nodes(nodes, cleaned["add"], cleaned["remove"])
    current = replay(nodes, history, quotas, quantum=quantum)
    proposed = replay(proposed_nodes, history, proposed_quotas, quantum=quantum)
    now_figures, then_figures, actual = (team_figures(current, history), team_figures(proposed, history),
                                         actual_figures(history))
    teams = sorted(set(actual) | set(cleaned["changes"]), key=str)
    empty = {"jobs": 0, "wait_p50": None, "wait_p90": None, "jct_p50": None, "utilization": 0.0,
             "preemptions": 0, "never_placed": 0}
    return {
        "teams": {team: {"current": now_figures.get(team, empty), "proposed": then_figures.get(team, empty),
                         "actual": actual.get(team, {"jobs": 0, "wait_p50": None, "wait_p90": None,
                                                     "jct_p50": None})} for team in teams},
        "cluster": {"current": {"nodes": len(nodes), "gpus": current.gpus,
                                "utilization": _utilization(current)},
                    "proposed": {"nodes": len(proposed_nodes), "gpus": proposed.gpus,
                                 "utilization": _utilization(proposed)}},
    }


def _utilization(run: Replay) -> float:
    capacity = run.gpus * run.span
    return round(sum(run.gpu_seconds.values()) / capacity, 4) if capacity else 0.0


def what_if(data, *, now: datetime | None = None) -> dict:
    """The API's answer to a what-if request (see :func:`clean_request`): the replay of the last ``days`` of
    submissions under the current settings and under the proposed ones, per team (by slug)."""
    from django.utils import timezone

    from strata.accounts.models import Team
    from strata.quotas.models import Quota
    from strata.scheduling.eta import load_nodes

    cleaned = clean_request(data)
    now = now or timezone.now()
    history, _ = load_history(cleaned["days"], now)
    nodes = list(load_nodes(now).values())
    quotas = {quota.team_id: quota for quota in Quota.objects.all()}
    result = compare(nodes, history, quotas, cleaned)
    slugs = dict(Team.objects.filter(pk__in=list(result["teams"])).values_list("pk", "slug"))
    changes = {slugs.get(team, str(team)): {name: value for name, value in fields.items()}
               for team, fields in cleaned["changes"].items()}
    return {"days": cleaned["days"], "jobs": len(history), "changes": changes,
            "nodes": {"add": cleaned["add"], "remove": cleaned["remove"]},
            "cluster": result["cluster"],
            "teams": [{"team": slugs.get(team, str(team)), **figures}
                      for team, figures in sorted(result["teams"].items(), key=lambda item: slugs.get(item[0], ""))]}
