"""Compare runs: several jobs of the caller's teams side by side (``GET /api/v1/compare/?jobs=...``, the dashboard's
``/compare/?jobs=...`` page and ``strata compare``, which all read :func:`compare_jobs`); or a parent's children
(``?parent=<id>``: a sweep's trials).

For each job: its metric series (``jobs.selectors.metric_series``, thinned so the jobs together stay within
:data:`POINT_BUDGET` points per metric), its final metrics (the point with the highest step of each name), its
state, attempts, duration, the GPUs it asks for and the GPU- and CPU-seconds it was billed. The billing is the
quota's own count (``strata.quotas.selectors.job_usage``), which this layer does not import: the callers hand it
in as ``usage`` (the URL map to the API view, the dashboard to its page), like the collections' record context.
And the jobs' documents diffed: every path of kind, spec, resources and limits whose values are not all equal.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.db.models import Count
from django.utils import timezone

from strata.jobs.models import Job
from strata.jobs.selectors import MAX_POINTS_PER_SERIES, jobs_visible, metric_series

MIN_JOBS = 2
MAX_JOBS = 20
POINT_BUDGET = 8000
"""Points per metric name over all the compared jobs: two jobs get the job page's 2000 each, twenty get 400."""
MIN_POINTS = 200

Usage = Callable[[list[uuid.UUID]], dict[uuid.UUID, dict[str, float]]]


class CompareInvalid(ValueError):
    """The jobs to compare are not named well (a 400 on ``field``)."""

    def __init__(self, message: str, field: str = "jobs"):
        super().__init__(message)
        self.field, self.message = field, message


class CompareNotFound(LookupError):
    """Jobs that do not exist or belong to none of the caller's teams (a 404 naming them)."""

    def __init__(self, missing: list[uuid.UUID]):
        self.missing = missing
        names = ", ".join(str(job_id) for job_id in missing)
        super().__init__(f"no job {names}" if len(missing) == 1 else f"no jobs {names}")


def parse_job_ids(values: Iterable[str] | str | None) -> list[uuid.UUID]:
    """The job ids of ``?jobs=a,b,c`` (the parameter may also repeat: ``?jobs=a&jobs=b``), in order, each once.
    A value that is no job id, fewer than :data:`MIN_JOBS` or more than :data:`MAX_JOBS` jobs: CompareInvalid."""
    if values is None:
        values = []
    elif isinstance(values, str):
        values = [values]
    parts = [part.strip() for value in values for part in value.split(",")]
    parts = [part for part in parts if part]
    bad = []
    ids: list[uuid.UUID] = []
    for part in parts:
        try:
            job_id = uuid.UUID(part)
        except ValueError:
            bad.append(part)
            continue
        if job_id not in ids:
            ids.append(job_id)
    if bad:
        shown = ", ".join(repr(part[:40]) for part in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CompareInvalid(f"not job ids: {shown}")
    if len(ids) < MIN_JOBS:
        raise CompareInvalid(f"name at least {MIN_JOBS} different jobs to compare (got {len(ids)})")
    if len(ids) > MAX_JOBS:
        raise CompareInvalid(f"compare at most {MAX_JOBS} jobs at once (got {len(ids)})")
    return ids


def points_per_series(jobs: int) -> int:
    """How many points each job's series of one metric keeps when ``jobs`` jobs are compared."""
    return max(MIN_POINTS, min(MAX_POINTS_PER_SERIES, POINT_BUDGET // max(jobs, 1)))


def children_ids(team_ids, parent: str) -> list[uuid.UUID]:
    """The first :data:`MAX_JOBS` children (oldest first) of a job one of ``team_ids`` owns: a sweep's trials, say.
    A value that is no job id is CompareInvalid (on ``parent``); another team's job or none, CompareNotFound."""
    try:
        parent_id = uuid.UUID(parent.strip())
    except ValueError:
        raise CompareInvalid(f"not a job id: {parent[:40]!r}", field="parent") from None
    if not jobs_visible(team_ids).filter(pk=parent_id).exists():
        raise CompareNotFound([parent_id])
    return list(Job.objects.filter(parent_id=parent_id).order_by("created_at", "id")
                .values_list("id", flat=True)[:MAX_JOBS])


def requested_ids(team_ids, jobs: list[str], parent: str | None) -> list[uuid.UUID]:
    """The jobs a request names: ``?jobs=a,b`` (:func:`parse_job_ids`), or without it ``?parent=<id>``, the
    parent's first children (at least two, else CompareInvalid on ``parent``)."""
    if any(value.strip() for value in jobs) or not parent:
        return parse_job_ids(jobs)
    ids = children_ids(team_ids, parent)
    if len(ids) < MIN_JOBS:
        raise CompareInvalid(f"job {parent.strip()} has {len(ids)} child job{'s' if len(ids) != 1 else ''}: "
                             f"at least {MIN_JOBS} are needed to compare", field="parent")
    return ids


def compare_jobs(team_ids, job_ids: list[uuid.UUID], usage: Usage | None = None, now=None) -> dict[str, Any]:
    """The comparison of these jobs (in this order), each of which one of ``team_ids`` must own (else
    CompareNotFound naming those that are not). ``usage`` counts their GPU- and CPU-seconds; without it they are
    None. JSON-ready: ``{"jobs": [...], "metrics": [names], "spec_diff": [{"path", "values", "present"}],
    "points_per_series": n}``."""
    now = now or timezone.now()
    found = {job.pk: job for job in jobs_visible(team_ids).filter(pk__in=job_ids)
             .annotate(attempt_count=Count("attempts"))}
    missing = [job_id for job_id in job_ids if job_id not in found]
    if missing:
        raise CompareNotFound(missing)
    jobs = [found[job_id] for job_id in job_ids]
    used = usage(list(job_ids)) if usage is not None else {}
    points = points_per_series(len(jobs))
    entries = []
    names: set[str] = set()
    for job in jobs:
        series = metric_series(job, max_points=points)
        names.update(series)
        billed = used.get(job.pk)
        entries.append({
            "id": str(job.pk), "name": job.name, "kind": job.kind, "team": job.team.slug,
            "owner": job.owner.username, "state": job.state, "reason": job.reason,
            "parent": str(job.parent_id) if job.parent_id else None,
            "attempts": job.attempt_count, "failures": job.failures,
            "created_at": _iso(job.created_at), "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at), "duration_s": _duration(job, now),
            "resources": job.resources, "gpus": job.gpus,
            "gpu_seconds": round(billed["gpu_seconds"], 3) if billed else None,
            "cpu_seconds": round(billed["cpu_seconds"], 3) if billed else None,
            "final_metrics": {name: {"step": steps[-1], "value": values[-1]}
                              for name, (steps, values) in series.items() if steps},
            "series": {name: {"steps": steps, "values": values} for name, (steps, values) in series.items()},
        })
    return {"jobs": entries, "metrics": sorted(names), "spec_diff": spec_diff(jobs),
            "points_per_series": points}


def _iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def _duration(job: Job, now) -> float | None:
    """Seconds from the job's start to its finish (to now while it runs); None if it never started."""
    if job.started_at is None:
        return None
    return round(max(0.0, ((job.finished_at or now) - job.started_at).total_seconds()), 3)


def compared_document(job: Job) -> dict[str, Any]:
    """What the diff compares of a job: its kind, spec, resources and limits (not its name or team)."""
    return {"kind": job.kind, "spec": job.spec, "resources": job.resources, "priority": job.priority,
            "time_limit": job.time_limit, "max_attempts": job.max_attempts}


def flatten(document: Any, prefix: str = "") -> dict[str, Any]:
    """``{"spec": {"lr": 0.1, "layers": [1, 2]}}`` -> ``{"spec.lr": 0.1, "spec.layers": [1, 2]}``: the dotted
    paths of a document's leaves in order; a list or an empty mapping is one leaf."""
    if not isinstance(document, dict) or not document:
        return {prefix: document}
    leaves: dict[str, Any] = {}
    for key, value in document.items():
        leaves.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return leaves


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def spec_diff(jobs: list[Job]) -> list[dict[str, Any]]:
    """Every path whose value is not the same in all the jobs: ``{"path", "values": one per job (None where a job
    has no such path), "present": one bool per job}``, in the document's order (kind, spec, resources, limits),
    sorted by path within each part (a spec's keys come back from PostgreSQL's jsonb in no order of the user's)."""
    documents = [compared_document(job) for job in jobs]
    flat = [flatten(document) for document in documents]
    parts = list(documents[0]) if documents else []
    paths = sorted({path for leaves in flat for path in leaves},
                   key=lambda path: (parts.index(path.split(".", 1)[0]), path))
    diff = []
    for path in paths:
        present = [path in leaves for leaves in flat]
        values = [leaves.get(path) for leaves in flat]
        if all(present) and all(_same(values[0], value) for value in values[1:]):
            continue
        diff.append({"path": path, "values": values, "present": present})
    return diff
