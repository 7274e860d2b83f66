"""Start-time estimates of waiting jobs (``Job.eta``), from the queue simulator (``strata.scheduling.foresight``)
over the cluster's state as the scheduler reads it, and their calibration against actual starts.

The leader refreshes them every STRATA_ETA_SECONDS (a beat task of its own, apart from the passes) for the first STRATA_ETA_JOBS
waiting jobs in queue order. A job keeps its first estimate (``Job.eta_first``) beside ``Job.started_at``:
:func:`calibration` reports how often the 80 % interval held the actual start, and the median absolute error, by
kind and by queue length.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Max, Min
from django.utils import timezone

from strata.scheduling.foresight import (
    PENDING,
    QUEUED,
    RUNNING,
    HistoryModel,
    RunTime,
    SimJob,
    SimNode,
    WaitCalibration,
    estimate,
    run_now_options,
    runtime_for,
    total_steps,
)

log = logging.getLogger(__name__)
HISTORY_WINDOW = 5000  # the most recent successful attempts the run-time model learns from
HISTORY_SECONDS = 600.0  # the model is learned again this often (per process)
STOP_SECONDS = 10.0  # how long a cancelled or preempted attempt is taken to need to give its devices back
PASS_QUANTUM = 30.0  # simulated passes run on a grid of this many seconds (starts are late by under it)
CALIBRATION_DAYS = 7  # the interval is recalibrated from the estimates of the jobs that started in these days
OPTIONS_JOBS = 10  # waiting jobs (the first in queue order) told what would make them run now, per refresh
QUEUE_BUCKETS = ((0, 0, "0"), (1, 4, "1-4"), (5, 19, "5-19"), (20, 99, "20-99"), (100, None, "100+"))


@dataclass
class State:
    """The cluster as the simulator starts from it: nodes, jobs, quotas; ``now`` (simulated seconds) stands for
    ``at`` (real time); ``order``: the waiting jobs in queue order."""

    nodes: list[SimNode]
    jobs: list[SimJob]
    quotas: dict
    now: float
    at: datetime
    order: list
    options: dict


_model: tuple[float, HistoryModel | None] = (0.0, None)


def history_model() -> HistoryModel | None:
    """The run-time model of recent successful attempts, learned again every HISTORY_SECONDS."""
    global _model
    learned, model = _model
    if model is not None and time.monotonic() - learned < HISTORY_SECONDS:
        return model
    from strata.jobs.models import Attempt

    rows = []
    for team_id, kind, spec, resources, limit, started, ended in (
            Attempt.objects.filter(outcome=Attempt.Outcome.SUCCEEDED, started_at__isnull=False,
                                   ended_at__isnull=False, job__nested=False)
            .order_by("-ended_at")
            .values_list("job__team_id", "job__kind", "job__spec", "job__resources", "job__time_limit",
                         "started_at", "ended_at")[:HISTORY_WINDOW]):
        rows.append((team_id, kind, command_of(spec), resources or {}, limit, (ended - started).total_seconds()))
    try:
        model = HistoryModel(rows) if len(rows) >= HistoryModel.minimum else None
    except Exception:  # a degenerate history (one distinct value) must not stop the estimates
        log.exception("could not learn run times from history")
        model = None
    _model = (time.monotonic(), model)
    return model


def command_of(spec) -> str:
    """What a job runs, for the run-time model: its command, else its workload, else nothing."""
    if not isinstance(spec, dict):
        return ""
    for key in ("command", "workload", "entrypoint", "script"):
        value = spec.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return " ".join(str(part) for part in value)
    return ""


def _progress(attempt_ids: list) -> dict:
    """attempt id -> [(seconds, step) first and last] of its metric points (its rate of steps)."""
    from strata.jobs.models import MetricPoint

    found: dict = {}
    rows = (MetricPoint.objects.filter(attempt_id__in=attempt_ids).values("attempt_id")
            .annotate(first_step=Min("step"), last_step=Max("step"), first=Min("time"), last=Max("time")))
    for row in rows:
        if row["first"] is not None and row["last"] is not None:
            found[row["attempt_id"]] = [(row["first"].timestamp(), float(row["first_step"])),
                                        (row["last"].timestamp(), float(row["last_step"]))]
    return found


def load_nodes(at: datetime) -> dict:
    """node id -> SimNode: the nodes up with a live lease at ``at``, as the scheduler places on them (its GPUs,
    and its CPU device if it reports one)."""
    from strata.cluster.models import Device, Node

    nodes: dict = {}
    for node_id, name, labels, cpus, memory in Node.objects.filter(
            state=Node.State.UP, lease_expires_at__gt=at).values_list("id", "name", "labels", "cpus", "memory"):
        nodes[node_id] = SimNode(id=node_id, name=name, labels=labels or {}, devices=[],
                                 host=None)
        nodes[node_id].host = (0, 0, float(cpus or 0), int(memory or 0)) if cpus else None
    for device_id, node_id, index, kind, total in Device.objects.filter(node_id__in=list(nodes)).values_list(
            "id", "node_id", "index", "kind", "memory_total"):
        node = nodes[node_id]
        if kind == Device.Kind.CPU:
            if node.host is not None:
                node.host = (device_id, index, node.host[2], node.host[3])
            continue
        node.devices.append((device_id, index, total))
    for node in nodes.values():
        if node.host is not None and node.host[0] == 0:  # CPUs reported without a CPU device: none to place on
            node.host = None
    return nodes


def load_state(now: float | None = None, *, model: HistoryModel | None = None) -> State:
    """The cluster as the scheduler reads it (the same nodes, queue order and resource estimates), with each job's
    run time predicted: ``now`` is the simulated time that stands for the present (default: the epoch seconds)."""
    from strata.jobs.models import Allocation, Attempt, Job, JobState
    from strata.quotas.models import Quota
    from strata.scheduling.services import _queue_by_team

    at = timezone.now()
    base = at.timestamp()
    now = base if now is None else now

    def sim(moment: datetime | None) -> float:
        return (moment.timestamp() - base + now) if moment is not None else now

    model = model if model is not None else history_model()
    nodes = load_nodes(at)
    quotas = {quota.team_id: quota for quota in Quota.objects.all()}

    def predicted(job_row, elapsed: float, total=None, points=None) -> RunTime:
        _, team_id, kind, spec, resources, limit = job_row
        history = model.predict(team_id, kind, command_of(spec), resources or {}, limit) if model else None
        return runtime_for(time_limit=limit, elapsed=elapsed, total=total, points=points, history=history)

    jobs: list[SimJob] = []
    # Running (and stopping) jobs: their live attempts' allocations.
    live = list(Attempt.objects.filter(ended_at__isnull=True, job__nested=False).values_list(
        "id", "job_id", "job__team_id", "job__kind", "job__spec", "job__resources", "job__time_limit",
        "job__priority", "job__state", "started_at", "created_at", "gpu_share", "job__owner_id"))
    allocs: dict = defaultdict(list)
    ranks: dict = defaultdict(list)  # the worker rank of each allocation (what a shrink by workers gives back)
    for attempt_id, device_id, share, memory, rank in Allocation.objects.filter(
            active=True, nested=False, attempt_id__in=[row[0] for row in live]).values_list(
            "attempt_id", "device_id", "share", "memory", "rank"):
        allocs[attempt_id].append((device_id, round(share * 1000), memory))
        ranks[attempt_id].append(rank)
    progress = _progress([row[0] for row in live if row[9] is not None])
    for (attempt_id, job_id, team_id, kind, spec, resources, limit, priority, state, started, created, share,
         owner) in live:
        begun = started or created
        elapsed = max(base - begun.timestamp(), 0.0)
        stopping = state in {JobState.CANCELLED, JobState.PREEMPTED}
        runtime = predicted((job_id, team_id, kind, spec, resources, limit), elapsed,
                            total_steps(spec or {}), progress.get(attempt_id))
        job = SimJob(id=job_id, team_id=team_id, kind=kind, resources=resources or {}, runtime=runtime,
                     priority=priority, state=RUNNING, started=sim(begun), allocs=allocs[attempt_id],
                     ranks=ranks[attempt_id], share=share,
                     owner_id=owner, attempts=1, stopping=stopping, requeue=state == JobState.PREEMPTED)
        if stopping:
            job.ends = now + STOP_SECONDS
        jobs.append(job)
    # Queued jobs in the scheduler's own order (and with what its resource-estimate hooks say they reserve).
    queue = _queue_by_team(quotas)
    queued_ids = [item[2] for items in queue.by_team.values() for item in items]
    rows = {row[0]: row for row in Job.objects.filter(pk__in=queued_ids).values_list(
        "id", "team_id", "kind", "spec", "resources", "time_limit", "priority", "created_at", "owner_id")}
    order = []
    for team_id, items in queue.by_team.items():
        for neg_priority, queued_at, job_id, resources, reason, kind in items:
            row = rows[job_id]
            jobs.append(SimJob(id=job_id, team_id=team_id, kind=kind, resources=resources,
                               runtime=predicted(row[:6], 0.0), priority=row[6], state=QUEUED,
                               queued_at=sim(queued_at), reason=reason, created=sim(row[7]), owner_id=row[8]))
            order.append((neg_priority, queued_at, job_id))
    order.sort(key=lambda entry: (entry[0], entry[1]))
    waiting = [entry[2] for entry in order]
    specs = {job_id: row[3] or {} for job_id, row in rows.items()}
    for row in Job.objects.filter(state=JobState.PENDING, nested=False, held=False).order_by(
            "-priority", "created_at").values_list("id", "team_id", "kind", "spec", "resources", "time_limit",
                                                   "priority", "created_at", "owner_id", "reason"):
        jobs.append(SimJob(id=row[0], team_id=row[1], kind=row[2], resources=row[4] or {},
                           runtime=predicted(row[:6], 0.0), priority=row[6], state=PENDING, created=sim(row[7]),
                           owner_id=row[8], reason=row[9]))
        waiting.append(row[0])
        specs[row[0]] = row[3] or {}
    # The placement-score hooks and what they read, as the pass loads them (the nodes' reports, read once).
    from components.runtime.contract import registry
    from components.runtime.contract.policies import PlacementScore
    from strata.scheduling.services import _HookInputs

    options: dict = {"specs": specs}
    scorers = registry.hooks(PlacementScore)
    if scorers:
        inputs = _HookInputs(queue.by_team, scorers)
        inputs.specs.update(specs)
        options.update(scorers=inputs.hooks, hook_inputs=inputs)
    # The GPU-hours each team used in its quota's window, as admission reads it (it does not change in a refresh).
    used = {}
    for team_id, quota in quotas.items():
        if quota.gpu_hours is not None:
            from strata.quotas.selectors import gpu_seconds

            used[team_id] = gpu_seconds(team_id, since=at - timedelta(hours=quota.window_hours))
    options["gpu_hours_used"] = used
    return State(nodes=list(nodes.values()), jobs=jobs, quotas=quotas, now=now, at=at, order=waiting,
                 options=options)


def _iso(state: State, seconds: float | None) -> str | None:
    if seconds is None or math.isinf(seconds):
        return None
    return (state.at + timedelta(seconds=seconds - state.now)).astimezone(UTC).isoformat()


def refresh(limit: int | None = None, samples: int | None = None) -> int:
    """Estimate the start of the first ``limit`` waiting jobs (STRATA_ETA_JOBS) and store it on each
    (``Job.eta``; ``Job.eta_first`` the first time). Returns how many were estimated."""
    from strata.jobs.models import Job

    limit = limit or settings.STRATA_ETA_JOBS
    samples = samples or settings.STRATA_ETA_SAMPLES
    state = load_state()
    targets = state.order[:limit]
    if not targets:
        return 0
    answers = estimate(state.nodes, state.jobs, state.quotas, now=state.now, targets=set(targets), samples=samples,
                       quantum=PASS_QUANTUM, **state.options)
    calibration = wait_calibration(state.at - timedelta(days=CALIBRATION_DAYS))
    by_id = {job.id: job for job in state.jobs}
    first = set(Job.objects.filter(pk__in=targets, eta_first__isnull=True).values_list("id", flat=True))
    waiting = len(state.order)
    for position, job_id in enumerate(targets):
        answer = answers.get(job_id)
        if answer is None:
            continue
        job = by_id[job_id]
        run_now = []
        if position < OPTIONS_JOBS:
            try:
                run_now = run_now_options(state.nodes, state.jobs, state.quotas, job_id, now=state.now,
                                          **state.options)
            except Exception:  # what-ifs are advice: never let one stop the estimates
                log.exception("what would make job %s run now", job_id)
        if calibration is not None and answer.start is not None:  # recalibrated from how earlier estimates held
            answer.low, answer.high = calibration.interval(state.now, answer.start)
        eta = {
            "start": _iso(state, answer.start), "low": _iso(state, answer.low), "high": _iso(state, answer.high),
            "calibrated_from": calibration.pairs if calibration is not None else None,
            "in_seconds": None if answer.start is None else round(max(answer.start - state.now, 0.0), 1),
            "low_seconds": None if answer.low is None else round(max(answer.low - state.now, 0.0), 1),
            "high_seconds": None if answer.high is None else round(max(answer.high - state.now, 0.0), 1),
            "waits_for": {"reason": job.reason, "jobs": [str(other) for other in answer.waits_for]},
            "run_now": run_now, "runtime": {"p10": round(job.runtime.p10, 1), "p50": round(job.runtime.p50, 1),
                                            "p90": round(job.runtime.p90, 1), "source": job.runtime.source},
            "position": position, "waiting": waiting, "computed_at": state.at.isoformat(),
        }
        fields = {"eta": eta, "eta_at": state.at}
        if job_id in first:
            fields["eta_first"] = {"start": eta["start"], "low": eta["low"], "high": eta["high"],
                                   "waiting": waiting, "position": position, "at": state.at.isoformat()}
        Job.objects.filter(pk=job_id).update(**fields)
    return len(answers)


def wait_calibration(since: datetime) -> WaitCalibration | None:
    """The interval's recalibration (:class:`~strata.scheduling.foresight.WaitCalibration`) from the jobs that
    started since ``since`` with a first estimate: its estimated wait against the one they had. None with too few."""
    from strata.jobs.models import Job

    pairs = []
    rows = Job.objects.filter(eta_first__isnull=False, started_at__gte=since)
    for first, started in rows.values_list("eta_first", "started_at").iterator():
        if not first or not first.get("start") or not first.get("at"):
            continue
        at = datetime.fromisoformat(first["at"])
        pairs.append(((datetime.fromisoformat(first["start"]) - at).total_seconds(), (started - at).total_seconds()))
    return WaitCalibration.learn(pairs)


_last_refresh = 0.0


def refresh_due() -> int:
    """:func:`refresh` when STRATA_ETA_SECONDS passed since this process last did (the beat task calls it on the
    leader); errors are logged, never raised: estimates are advice."""
    global _last_refresh
    every = settings.STRATA_ETA_SECONDS
    if every <= 0 or time.monotonic() - _last_refresh < every:
        return 0
    _last_refresh = time.monotonic()
    try:
        return refresh()
    except Exception:
        log.exception("could not refresh start-time estimates")
        return 0


def eta_view(job) -> dict | None:
    """A job's ``eta`` as the API shows it: the stored estimate while it waits (PENDING or QUEUED), else None."""
    from strata.jobs.models import JobState

    if job.state not in {JobState.PENDING, JobState.QUEUED} or not job.eta:
        return None
    return job.eta


def _bucket(waiting: int) -> str:
    for low, high, name in QUEUE_BUCKETS:
        if waiting >= low and (high is None or waiting <= high):
            return name
    return "100+"


def calibration(since: datetime | None = None) -> dict:
    """How well the first estimates held: of the jobs that started and had one, the share whose actual start fell
    in the 80 % interval (``coverage``) and the median absolute error in seconds, over all, by kind and by the
    number of jobs waiting when they were estimated."""
    from strata.jobs.models import Job

    rows = Job.objects.filter(eta_first__isnull=False, started_at__isnull=False)
    if since is not None:
        rows = rows.filter(started_at__gte=since)
    groups: dict = {"all": defaultdict(list), "kind": defaultdict(list), "queue": defaultdict(list)}
    for kind, first, started in rows.values_list("kind", "eta_first", "started_at").iterator():
        if not first or not first.get("start"):
            continue
        expected = datetime.fromisoformat(first["start"])
        error = abs((started - expected).total_seconds())
        low = datetime.fromisoformat(first["low"]) if first.get("low") else None
        high = datetime.fromisoformat(first["high"]) if first.get("high") else None
        # An interval is judged to the second: the estimate names a placement, the start is the node's claim.
        inside = (low is None or started >= low - timedelta(seconds=1)) and (
            high is not None and started <= high + timedelta(seconds=1))
        entry = (error, inside)
        groups["all"]["all"].append(entry)
        groups["kind"][kind].append(entry)
        groups["queue"][_bucket(int(first.get("waiting") or 0))].append(entry)

    def summary(entries: list) -> dict:
        return {"jobs": len(entries), "coverage": round(sum(inside for _, inside in entries) / len(entries), 4),
                "median_abs_error_seconds": round(statistics.median(error for error, _ in entries), 1)}

    overall = groups["all"].get("all", [])
    return {
        "jobs": len(overall),
        "coverage": summary(overall)["coverage"] if overall else None,
        "median_abs_error_seconds": summary(overall)["median_abs_error_seconds"] if overall else None,
        "by_kind": {kind: summary(entries) for kind, entries in sorted(groups["kind"].items())},
        "by_queue_length": {name: summary(groups["queue"][name]) for _, _, name in QUEUE_BUCKETS
                            if groups["queue"].get(name)},
    }
