"""Quota admission and exact usage accounting.

Admission runs inside a transaction holding the team's quota row (``select_for_update``; on SQLite the
IMMEDIATE transaction's write lock plays that role), so concurrent submits cannot overrun a limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from strata.jobs.models import ADMITTED_STATES, Attempt, Job, JobState
from strata.jobs.states import transition
from strata.quotas.models import Quota


@dataclass
class TeamLoad:
    """What a team's admitted (queued or running) jobs hold against its quota."""

    jobs: int = 0
    gpus: float = 0.0
    gpu_memory: int = 0

    def add(self, job: Job) -> None:
        workers = int(job.resources.get("workers", 1))
        self.jobs += 1
        self.gpus += float(job.resources.get("gpus", 0)) * workers
        self.gpu_memory += int(job.resources.get("gpu_memory") or 0) * workers


def gpu_seconds(team_id: int, since=None, until=None) -> float:
    """GPU-seconds billed to a team: attempt durations (dispatch to release) times the share held,
    clipped to [since, until]."""
    until = until or timezone.now()
    attempts = Attempt.objects.filter(job__team_id=team_id, dispatched_at__isnull=False, gpu_share__gt=0)
    if since is not None:
        attempts = attempts.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
    total = 0.0
    for dispatched, ended, share in attempts.values_list("dispatched_at", "ended_at", "gpu_share"):
        start = max(dispatched, since) if since is not None else dispatched
        end = min(ended or until, until)
        if end > start:
            total += (end - start).total_seconds() * share
    return total


def team_load(team_id: int) -> TeamLoad:
    load = TeamLoad()
    for job in Job.objects.filter(team_id=team_id, state__in=ADMITTED_STATES).only("resources"):
        load.add(job)
    return load


def blocking_limit(quota: Quota, load: TeamLoad, job: Job, window_gpu_seconds: float | None) -> str | None:
    """The first limit that admitting ``job`` would break, as a human reason; None when it fits."""
    workers = int(job.resources.get("workers", 1))
    gpus = float(job.resources.get("gpus", 0)) * workers
    memory = int(job.resources.get("gpu_memory") or 0) * workers
    if quota.max_concurrent_jobs is not None and load.jobs + 1 > quota.max_concurrent_jobs:
        return f"team at max_concurrent_jobs ({load.jobs}/{quota.max_concurrent_jobs})"
    if quota.max_gpus is not None and load.gpus + gpus > quota.max_gpus + 1e-9:
        return f"team at max_gpus ({load.gpus:g} held + {gpus:g} requested > {quota.max_gpus:g})"
    if quota.max_gpu_memory is not None and load.gpu_memory + memory > quota.max_gpu_memory:
        return f"team at max_gpu_memory ({load.gpu_memory + memory} > {quota.max_gpu_memory} bytes)"
    if quota.gpu_hours is not None and gpus > 0 and window_gpu_seconds is not None:
        used_hours = window_gpu_seconds / 3600
        if used_hours >= quota.gpu_hours:
            return f"team used {used_hours:.2f} of {quota.gpu_hours:g} GPU-hours in the last {quota.window_hours:g} h"
    return None


def never_fits(quota: Quota, job: Job) -> str | None:
    """A reason why ``job`` can never be admitted under ``quota`` (checked at submit), or None."""
    if quota.max_concurrent_jobs == 0:
        return "team quota allows no jobs (max_concurrent_jobs=0)"
    return blocking_limit(quota, TeamLoad(), job, None)


def admit_pending(team_id: int) -> list[Job]:
    """Admit the team's PENDING jobs, in priority then submission order, while its quota has room."""
    admitted = []
    with transaction.atomic():
        quota = Quota.objects.select_for_update().filter(team_id=team_id).first()
        pending = list(Job.objects.filter(team_id=team_id, state=JobState.PENDING).order_by("-priority", "created_at"))
        if not pending:
            return admitted
        if quota is None:
            quota = Quota.objects.create(team_id=team_id)
        load = team_load(team_id)
        window = None
        if quota.gpu_hours is not None:
            window = gpu_seconds(team_id, since=timezone.now() - timedelta(hours=quota.window_hours))
        for job in pending:
            reason = blocking_limit(quota, load, job, window)
            if reason is None:
                transition(job, JobState.PENDING, JobState.QUEUED, "admitted under quota")
                load.add(job)
                admitted.append(job)
            elif job.reason != f"waiting: {reason}":
                Job.objects.filter(pk=job.pk, state=JobState.PENDING).update(reason=f"waiting: {reason}")
    return admitted


def teams_with_pending() -> list[int]:
    return list(Job.objects.filter(state=JobState.PENDING).values_list("team_id", flat=True).distinct())


def team_usage(team_id: int) -> dict:
    quota = Quota.objects.filter(team_id=team_id).first() or Quota(team_id=team_id)
    load = team_load(team_id)
    now = timezone.now()
    return {
        "jobs": load.jobs,
        "gpus": load.gpus,
        "gpu_memory": load.gpu_memory,
        "gpu_hours_window": gpu_seconds(team_id, since=now - timedelta(hours=quota.window_hours), until=now) / 3600,
        "gpu_hours_total": gpu_seconds(team_id, until=now) / 3600,
        "window_hours": quota.window_hours,
        "pending": Job.objects.filter(team_id=team_id, state=JobState.PENDING).count(),
    }
