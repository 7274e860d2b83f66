"""Reads on a team's use of the cluster, shared by the API (``GET /api/v1/quotas/<team>/usage/``, through
``quotas.services.team_usage``), admission (the ``gpu_hours`` limit) and the dashboard's Usage page (the meters and
the GPU-hours chart), so that what a team is told it used, what it is limited by, and what the chart draws are one
count: its attempts' GPU shares from dispatch to release plus the GPUs its participants brought."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from strata.cluster.models import Device
from strata.jobs.models import Allocation, Attempt, Participant


def gpu_spans(team_id: int, since=None, until=None) -> list[tuple[datetime, datetime | None, float]]:
    """(start, end, GPUs) of what the team held in [since, until]: each attempt that held a GPU share, from its
    dispatch to its release (end None while it holds it), and each participant that brought GPUs, from its join
    to its end, or to its last beat while active (never past its lease). Not clipped to the range."""
    return [span[1:] for span in _gpu_spans({"team_id": team_id}, since, until)]


def _gpu_spans(jobs: dict, since=None, until=None) -> list[tuple[uuid.UUID, datetime, datetime | None, float]]:
    """gpu_spans' spans, each led by its job's id, of the jobs the ``jobs`` lookups (on Job) select."""
    until = until or timezone.now()
    scope = {f"job__{lookup}": value for lookup, value in jobs.items()}
    attempts = Attempt.objects.filter(**scope, dispatched_at__isnull=False, dispatched_at__lt=until,
                                      gpu_share__gt=0)
    if since is not None:
        attempts = attempts.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
    spans = list(attempts.values_list("job_id", "dispatched_at", "ended_at", "gpu_share"))
    lease = timedelta(seconds=settings.STRATA_PARTICIPANT_LEASE_S)
    participants = Participant.objects.filter(**scope, gpus__gt=0, joined_at__lt=until)
    if since is not None:
        participants = participants.filter(last_seen__gt=since - lease)
    for job_id, joined, last_seen, ended, gpus in participants.values_list("job_id", "joined_at", "last_seen",
                                                                          "ended_at", "gpus"):
        spans.append((job_id, joined, min(ended, last_seen + lease) if ended else last_seen, gpus))
    return spans


def _cpu_rows(jobs: dict, since=None) -> list[tuple[uuid.UUID, datetime, datetime | None, float]]:
    """(job id, dispatch, end, CPUs) of each attempt's reservations on the nodes' CPU devices (a nested child's
    are inside its parent's, which is billed for them), of the jobs the ``jobs`` lookups (on Job) select."""
    scope = {f"attempt__job__{lookup}": value for lookup, value in jobs.items()}
    rows = Allocation.objects.filter(**scope, attempt__dispatched_at__isnull=False,
                                     device__kind=Device.Kind.CPU, nested=False)
    if since is not None:
        rows = rows.filter(Q(attempt__ended_at__isnull=True) | Q(attempt__ended_at__gt=since))
    return list(rows.values_list("attempt__job_id", "attempt__dispatched_at", "attempt__ended_at", "share"))


def _clipped(began: datetime, ended: datetime | None, since, until: datetime) -> float:
    """Seconds of [began, ended or until] inside [since, until]."""
    start = max(began, since) if since is not None else began
    end = min(ended or until, until)
    return (end - start).total_seconds() if end > start else 0.0


def gpu_seconds(team_id: int, since=None, until=None) -> float:
    """GPU-seconds billed to a team, clipped to [since, until]: attempt durations (dispatch to release) times the
    share held, plus participants' (joined to ended, or to last seen while active; never past their lease) times
    the GPUs they brought."""
    until = until or timezone.now()
    return sum(_clipped(began, ended, since, until) * share
               for began, ended, share in gpu_spans(team_id, since, until))


def cpu_seconds(team_id: int, since=None, until=None) -> float:
    """CPU-seconds billed to a team, clipped to [since, until]: like GPU-seconds, each attempt's time from dispatch
    to its end times the CPUs it reserved (its allocations on the nodes' CPU devices; a nested child's are inside
    its parent's, which is billed for them)."""
    until = until or timezone.now()
    return sum(_clipped(began, ended, since, until) * cpus
               for _, began, ended, cpus in _cpu_rows({"team_id": team_id}, since))


def job_usage(job_ids, until=None) -> dict[uuid.UUID, dict[str, float]]:
    """GPU- and CPU-seconds billed for each of these jobs (UUIDs) up to ``until`` (now), counted as gpu_seconds and
    cpu_seconds count a team's (its attempts and its participants): ``{job id: {"gpu_seconds", "cpu_seconds"}}``,
    zeros for a job that held nothing. What the compare page and ``GET /api/v1/compare/`` show per job."""
    until = until or timezone.now()
    ids = list(job_ids)
    usage = {job_id: {"gpu_seconds": 0.0, "cpu_seconds": 0.0} for job_id in ids}
    for job_id, began, ended, share in _gpu_spans({"id__in": ids}, until=until):
        usage[job_id]["gpu_seconds"] += _clipped(began, ended, None, until) * share
    for job_id, began, ended, cpus in _cpu_rows({"id__in": ids}):
        usage[job_id]["cpu_seconds"] += _clipped(began, ended, None, until) * cpus
    return usage
