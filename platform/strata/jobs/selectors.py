"""Reads on jobs, always scoped to the teams a caller may see."""

from __future__ import annotations

import math
import uuid
from typing import Any

from django.db.models import Count, F, Prefetch, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from strata.accounts.models import Team
from strata.accounts.selectors import request_token, visible_team_ids
from strata.cluster.models import Device
from strata.cluster.selectors import device_policy, pool_policies
from strata.jobs.models import Allocation, Attempt, Job, JobState


class SubmitTeamError(ValueError):
    """The team a job was submitted to cannot be resolved for this caller (reported on the ``team`` field)."""


def jobs_visible(team_ids) -> QuerySet[Job]:
    return Job.objects.filter(team_id__in=list(team_ids)).select_related("team", "owner")


JOB_FILTERS = ("state", "kind", "team", "owner", "parent")


class JobFilterInvalid(ValueError):
    """A job filter that names no state, or a parent that is not a job id (reported on ``field``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def jobs_filtered(queryset: QuerySet[Job], filters: dict, *, strict: bool = True) -> QuerySet[Job]:
    """``queryset`` narrowed by the job list's filters (``JOB_FILTERS``; blank or missing: no filter), as the
    API (``GET /api/v1/jobs/?state=...``, which the CLI calls) and the dashboard's job list apply them: ``state``
    a comma-separated list of states (any case), ``kind``, ``team`` (slug), ``owner`` (username), ``parent`` (the
    children of one job). ``strict`` (the API) raises JobFilterInvalid for an unknown state or a parent that is
    not a job id; otherwise (the web page) an unknown state is left out and such a parent matches nothing."""
    if state := filters.get("state"):
        states = [name.strip().upper() for name in state.split(",")]
        bad = [name for name in states if name not in JobState.values]
        if bad and strict:
            raise JobFilterInvalid("state", f"unknown state(s): {', '.join(bad)}")
        queryset = queryset.filter(state__in=[name for name in states if name in JobState.values])
    for name, lookup in (("kind", "kind"), ("team", "team__slug"), ("owner", "owner__username")):
        if value := filters.get(name):
            queryset = queryset.filter(**{lookup: value})
    if parent := filters.get("parent"):
        try:
            queryset = queryset.filter(parent_id=uuid.UUID(parent))
        except ValueError:
            if strict:
                raise JobFilterInvalid("parent", "must be a job id") from None
            queryset = queryset.none()
    return queryset


def jobs_with_attempts(queryset: QuerySet[Job]) -> QuerySet[Job]:
    allocations = Prefetch("allocations", queryset=Allocation.objects.select_related("device__node"))
    return queryset.select_related("code").prefetch_related(
        Prefetch("attempts", queryset=Attempt.objects.select_related("node").prefetch_related(allocations)))


def submit_team(request, slug: str | None) -> Team:
    """The team a submit from ``request`` goes to: the named one if the caller may see it; without a name, the
    token's team, or the caller's only team. Shared by the REST API and the web form so both agree."""
    token = request_token(request)
    team_ids = visible_team_ids(request)
    if token is not None and slug is None:
        return token.team
    if slug is None:
        if len(team_ids) == 1:
            return Team.objects.get(pk=team_ids[0])
        raise SubmitTeamError("required: you belong to several teams")
    team = Team.objects.filter(slug=slug, id__in=team_ids).first()
    if team is None:
        raise SubmitTeamError(f"unknown team {slug!r}")
    return team


def require_submitter(request, slug) -> None:
    """Refuse a write that makes something new in a team (a job, a code bundle, a data upload, a record) when the
    caller only views the team it would go to: a JSON 403 naming the member role (``strata.accounts.roles``).
    A team the request does not name or cannot use is left to :func:`submit_team`'s 400."""
    from strata.accounts import roles

    try:
        team = submit_team(request, slug if isinstance(slug, str) and slug else None)
    except SubmitTeamError:
        return
    roles.require(request, team, roles.MEMBER, "create things in it")


def source_artifact(job: Job, name: str):
    """Artifact ``name`` of a job that ``job``'s spec reads from (same team only), or None."""
    from components.runtime.contract.registry import get_kind
    from strata.jobs.models import Artifact

    for ref in get_kind(job.kind).sources(job.spec):
        if ref.artifact == name:
            return Artifact.objects.filter(job_id=ref.job, job__team_id=job.team_id, name=name,
                                           kind=Artifact.Kind.ARTIFACT).first()
    return None


def reads_user_output(job: Job, depth: int = 8) -> bool:
    """Whether ``job`` reads artifacts (its kind's ``sources()``) that a team's own code produced: a source job
    that ran a project, a command or an entry point (``components.runtime.contract.project.runs_user_code``), or that
    itself read such artifacts, up to ``depth`` jobs back. What a team's code wrote (a model file holding an
    exported program, say) may be code too, so such a job runs like one: in its own processes, in the node's
    sandbox, never in a node service shared with other teams' attempts."""
    from components.runtime.contract.project import runs_user_code
    from components.runtime.contract.registry import get_kind

    try:
        refs = get_kind(job.kind).sources(job.spec)
    except Exception:  # noqa: BLE001 - a kind no longer installed, a spec of an older version: assume the worst
        return True
    for ref in refs:
        source = (Job.objects.filter(pk=ref.job, team_id=job.team_id).only("kind", "spec", "code_id", "team_id")
                  .first())
        if source is None:
            continue
        if runs_user_code({"spec": source.spec, "code": source.code_id}):
            return True
        if depth > 0 and reads_user_output(source, depth - 1):
            return True
    return False


def serving_endpoint(job: Job) -> str | None:
    """Where a RUNNING job answers requests (its live attempt's reported ``host:port``), else None. Uses the
    prefetched attempts when there are some."""
    from strata.jobs.models import JobState

    if job.state != JobState.RUNNING:
        return None
    live = [attempt for attempt in job.attempts.all() if attempt.ended_at is None and attempt.endpoint]
    return max(live, key=lambda attempt: attempt.number).endpoint if live else None


def participants_active(now=None) -> QuerySet:
    """Participants that are active now: in state ``active`` and heard from within the lease
    (``STRATA_PARTICIPANT_LEASE_S``). Only these count against their team's quota; one that missed its lease
    stops counting at once, before the reaper marks it lost."""
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from strata.jobs.models import TERMINAL_STATES, Participant

    cutoff = (now or timezone.now()) - timedelta(seconds=settings.STRATA_PARTICIPANT_LEASE_S)
    return (Participant.objects.filter(state=Participant.State.ACTIVE, last_seen__gt=cutoff)
            .exclude(job__state__in=list(TERMINAL_STATES)))


def code_summary(bundle) -> dict | None:
    """What a job's API answer and a node's claim say of its code bundle (``jobs.CodeBundle``), or None."""
    if bundle is None:
        return None
    return {"digest": bundle.digest, "size": bundle.size, "expanded_size": bundle.expanded_size,
            "file_count": bundle.file_count}


# --- each job's share of a shared GPU, as the API and the dashboard show it ----------------------------------

FULL_GPU = 1.0 - 1e-9


def _latest_attempts(jobs: list[Job]) -> dict[Any, Attempt]:
    """Each job's latest attempt, from prefetched attempts where the caller loaded them, else in one query."""
    latest, missing = {}, []
    for job in jobs:
        cache = getattr(job, "_prefetched_objects_cache", {})
        if "attempts" in cache:
            attempts = sorted(cache["attempts"], key=lambda attempt: attempt.number)
            if attempts:
                latest[job.pk] = attempts[-1]
        else:
            missing.append(job.pk)
    if missing:
        for attempt in Attempt.objects.filter(job_id__in=missing).order_by("job_id", "-number"):
            latest.setdefault(attempt.job_id, attempt)
    return latest


def gpu_allocations(queryset):
    """``queryset`` of allocations without the CPU reservations (those on the nodes' CPU devices)."""
    return queryset.exclude(device__kind=Device.Kind.CPU)


def _allocation(attempt: Attempt) -> Allocation | None:
    """The attempt's first GPU allocation (rank 0's), from its prefetched allocations."""
    cache = getattr(attempt, "_prefetched_objects_cache", {})
    if "allocations" in cache:
        allocations = sorted((allocation for allocation in cache["allocations"] if not allocation.device.cpu),
                             key=lambda allocation: allocation.rank)
        return allocations[0] if allocations else None
    return None


def job_shares(jobs: list[Job]) -> dict[Any, dict | None]:
    """Job id -> its share of a shared GPU (None for whole-GPU or unplaced jobs), in a fixed number of
    queries for any number of jobs.

    The share is that of the job's latest attempt on its first device (rank 0): ``gpus``, ``gpu_memory``,
    ``device`` (``node:gpuN``), ``shared``, ``policy`` (the sharing policy of the device's pool) and
    ``measured_memory`` (bytes a plugin measured the attempt to use, or None). What plugins measured beyond that
    is in the attempts' ``reports``.
    """
    shares: dict[Any, dict | None] = {job.pk: None for job in jobs}
    latest = _latest_attempts(list(jobs))
    allocations: dict[Any, Allocation] = {}
    unloaded = []
    for attempt in latest.values():
        cache = getattr(attempt, "_prefetched_objects_cache", {})
        if "allocations" in cache:
            allocation = _allocation(attempt)
            if allocation is not None:
                allocations[attempt.pk] = allocation
        else:
            unloaded.append(attempt.pk)
    if unloaded:
        for allocation in (gpu_allocations(Allocation.objects.filter(attempt_id__in=unloaded))
                           .select_related("device__node").order_by("attempt_id", "rank")):
            allocations.setdefault(allocation.attempt_id, allocation)
    fractional = {job_id: allocations.get(attempt.pk) for job_id, attempt in latest.items()}
    fractional = {job_id: allocation for job_id, allocation in fractional.items()
                  if allocation is not None and allocation.share < FULL_GPU}
    if not fractional:
        return shares
    policies = pool_policies()
    for job_id, allocation in fractional.items():
        device = allocation.device
        shares[job_id] = {
            "gpus": allocation.share, "gpu_memory": allocation.memory,
            "device": f"{device.node.name}:gpu{device.index}", "shared": True,
            "policy": device_policy(device, policies), "measured_memory": latest[job_id].measured_memory,
        }
    return shares


MAX_POINTS_PER_SERIES = 2000


def _finite(value: float | None, digits: int) -> float | None:
    """A finite, rounded number for JSON; NaN and infinities (a diverged loss) become None."""
    return round(value, digits) if value is not None and math.isfinite(value) else None


def metric_series(job: Job, up_to_id: int | None = None, max_points: int = MAX_POINTS_PER_SERIES,
                  digits: int = 6) -> dict[str, tuple[list[int], list[float | None]]]:
    """A job's metrics as ``name -> (steps, values)`` in step order, values rounded to ``digits`` (NaN and
    infinities: None). A series longer than ``max_points`` is thinned in the database to every n-th point (its
    first and last kept), so a job with millions of points stays fast. The job page's charts and the compare
    page (``strata.jobs.compare``) read it."""
    points = job.metric_points.all()
    if up_to_id is not None:
        points = points.filter(id__lte=up_to_id)
    counts = dict(points.values_list("name").annotate(n=Count("id")).order_by())
    series: dict[str, tuple[list[int], list[float | None]]] = {}
    small = [name for name, count in counts.items() if count <= max_points]
    if small:
        rows = points.filter(name__in=small).order_by("name", "step", "id").values_list("name", "step", "value")
        for name, step, value in rows:
            steps, values = series.setdefault(name, ([], []))
            steps.append(step)
            values.append(_finite(value, digits))
    for name, count in counts.items():
        if count <= max_points:
            continue
        stride = math.ceil(count / max_points)
        numbered = (points.filter(name=name)
                    .annotate(row=Window(RowNumber(), order_by=[F("step").asc(), F("id").asc()]))
                    .annotate(phase=F("row") % stride)
                    .filter(Q(phase=0) | Q(row=1) | Q(row=count))
                    .order_by("step", "id")
                    .values_list("step", "value"))
        steps, values = series.setdefault(name, ([], []))
        for step, value in numbered:
            steps.append(step)
            values.append(_finite(value, digits))
    return dict(sorted(series.items()))
