"""Reads on jobs, always scoped to the teams a caller may see."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from strata.jobs.models import Allocation, Attempt, Job


def jobs_visible(team_ids) -> QuerySet[Job]:
    return Job.objects.filter(team_id__in=list(team_ids)).select_related("team", "owner")


def jobs_with_attempts(queryset: QuerySet[Job]) -> QuerySet[Job]:
    allocations = Prefetch("allocations", queryset=Allocation.objects.select_related("device__node"))
    return queryset.prefetch_related(
        Prefetch("attempts", queryset=Attempt.objects.select_related("node").prefetch_related(allocations)))
