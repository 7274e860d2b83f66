"""Reads on a team's use of the cluster, shared by the API (``GET /api/v1/quotas/<team>/usage/``, through
``quotas.services.team_usage``), admission (the ``gpu_hours`` limit) and the dashboard's Usage page (the meters and
the GPU-hours chart), so that what a team is told it used, what it is limited by, and what the chart draws are one
count: its attempts' GPU shares from dispatch to release plus the GPUs its participants brought."""

from __future__ import annotations

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
    until = until or timezone.now()
    attempts = Attempt.objects.filter(job__team_id=team_id, dispatched_at__isnull=False, dispatched_at__lt=until,
                                      gpu_share__gt=0)
    if since is not None:
        attempts = attempts.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
    spans = list(attempts.values_list("dispatched_at", "ended_at", "gpu_share"))
    lease = timedelta(seconds=settings.STRATA_PARTICIPANT_LEASE_S)
    participants = Participant.objects.filter(job__team_id=team_id, gpus__gt=0, joined_at__lt=until)
    if since is not None:
        participants = participants.filter(last_seen__gt=since - lease)
    for joined, last_seen, ended, gpus in participants.values_list("joined_at", "last_seen", "ended_at", "gpus"):
        spans.append((joined, min(ended, last_seen + lease) if ended else last_seen, gpus))
    return spans


def gpu_seconds(team_id: int, since=None, until=None) -> float:
    """GPU-seconds billed to a team, clipped to [since, until]: attempt durations (dispatch to release) times the
    share held, plus participants' (joined to ended, or to last seen while active; never past their lease) times
    the GPUs they brought."""
    until = until or timezone.now()
    total = 0.0
    for began, ended, share in gpu_spans(team_id, since, until):
        start = max(began, since) if since is not None else began
        end = min(ended or until, until)
        if end > start:
            total += (end - start).total_seconds() * share
    return total


def cpu_seconds(team_id: int, since=None, until=None) -> float:
    """CPU-seconds billed to a team, clipped to [since, until]: like GPU-seconds, each attempt's time from dispatch
    to its end times the CPUs it reserved (its allocations on the nodes' CPU devices; a nested child's are inside
    its parent's, which is billed for them)."""
    until = until or timezone.now()
    rows = Allocation.objects.filter(attempt__job__team_id=team_id, attempt__dispatched_at__isnull=False,
                                     device__kind=Device.Kind.CPU, nested=False)
    if since is not None:
        rows = rows.filter(Q(attempt__ended_at__isnull=True) | Q(attempt__ended_at__gt=since))
    total = 0.0
    for dispatched, ended, cpus in rows.values_list("attempt__dispatched_at", "attempt__ended_at", "share"):
        start = max(dispatched, since) if since is not None else dispatched
        end = min(ended or until, until)
        if end > start:
            total += (end - start).total_seconds() * cpus
    return total
