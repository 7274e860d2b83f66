"""Team usage against quotas (``/usage/``) and the cluster admins' quota editor (``/manage/quotas/``).

The usage page shows one team the viewer belongs to (staff: any team): each limit with a meter, GPUs held over
time against ``max_gpus``, GPU-hours per day, allocated against used GPU-hours over the range with the idlest jobs
and the budget's forecast (``strata.quotas.usage``, a CSV link to the API's export), and the team's queue with why
each job waits. The quota editor
goes through the same ``quotas.services.quota_update`` as ``PATCH /api/v1/quotas/<team>/``: validation,
saving, admitting the PENDING jobs that now fit, and a scheduling pass on commit. It also grants each team its
data roots (``data_roots``, one directory per line: ``strata.quotas.roots``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import timedelta

from django.contrib import messages
from django.db.models import Count
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from dashboard.cluster_figures import GIB, bucket_means, gpu_hours_figure, gpus_held_grid, usage_figure
from dashboard.views.cluster import RANGES, bad_range, duration_text, selected_range
from dashboard.views.common import admin_required, figure_json, login_required, page_context, visible_teams
from strata.accounts.models import Team
from strata.jobs.models import ADMITTED_STATES, Job, JobState
from strata.quotas.models import Quota
from strata.quotas.selectors import gpu_spans
from strata.quotas.services import QUOTA_FIELDS, ROOTS_FIELD, QuotaInvalid, quota_update, team_usage
from strata.quotas.usage import team_billing
from strata.telemetry.selectors import grid_layout

USAGE_DEFAULT_RANGE = "7d"
USAGE_POINTS = 240
QUEUE_STATES = (JobState.SCHEDULED, JobState.QUEUED, JobState.PENDING)
QUEUE_LIMIT = 200
DEFAULT_REASONS = {
    JobState.PENDING: "waiting for quota admission",
    JobState.QUEUED: "waiting for free devices",
    JobState.SCHEDULED: "placed; waiting for the node to start it",
}


# --- formatting ---------------------------------------------------------------------------------------------

def number_text(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def bytes_text(value: int | None) -> str:
    """A size as the editor shows it: ``16GiB``, ``512MiB``, or plain bytes."""
    if value is None:
        return ""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _held_text(job: Job) -> str:
    """What a queued job holds, all workers together: its GPUs, or for a job that holds none, its CPUs."""
    if job.gpus <= 0 and not job.resources.get("gpu_memory") and job.resources.get("cpus"):
        return f"{float(job.resources['cpus']) * int(job.resources.get('workers', 1)):.4g} CPU"
    return f"{job.gpus:.4g}"


def _meter(field: str, label: str, used: float, limit: float | None, used_text: str, limit_text: str) -> dict:
    percent = None if limit is None else (100.0 if limit <= 0 else min(100.0, 100.0 * used / limit))
    return {"field": field, "label": label, "used": used, "limit": limit, "used_text": used_text,
            "limit_text": "unlimited" if limit is None else limit_text, "percent": percent,
            "full": limit is not None and used >= limit - 1e-9}


def usage_meters(quota: Quota, usage: dict) -> list[dict]:
    """One meter per limit: current use, the limit (or unlimited) and how full it is."""
    return [
        _meter("max_concurrent_jobs", "Jobs admitted", usage["jobs"], quota.max_concurrent_jobs,
               str(usage["jobs"]), str(quota.max_concurrent_jobs)),
        _meter("max_gpus", "GPUs held", usage["gpus"], quota.max_gpus, f"{usage['gpus']:.4g}",
               number_text(quota.max_gpus)),
        _meter("max_gpu_memory", "GPU memory requested", usage["gpu_memory"], quota.max_gpu_memory,
               f"{usage['gpu_memory'] / GIB:.3g} GiB",
               f"{quota.max_gpu_memory / GIB:.3g} GiB" if quota.max_gpu_memory is not None else ""),
        _meter("gpu_hours", f"GPU-hours in the last {quota.window_hours:g} h", usage["gpu_hours_window"],
               quota.gpu_hours, f"{usage['gpu_hours_window']:.2f}", number_text(quota.gpu_hours)),
        # Jobs that hold no GPU (and GPU jobs that state cpus) reserve CPUs and host memory.
        _meter("max_cpus", f"CPUs held ({usage['cpu_hours_window']:.2f} CPU-hours in the last "
                           f"{quota.window_hours:g} h)", usage["cpus"], quota.max_cpus, f"{usage['cpus']:.4g}",
               number_text(quota.max_cpus)),
        _meter("max_memory", "Host memory requested", usage["memory"], quota.max_memory,
               f"{usage['memory'] / GIB:.3g} GiB",
               f"{quota.max_memory / GIB:.3g} GiB" if quota.max_memory is not None else ""),
        # Artifacts, checkpoints, code bundles, data sets and unfinished uploads (quotas.services.team_storage).
        _meter("max_storage_bytes", "Storage used", usage["storage"]["total"], quota.max_storage_bytes,
               f"{usage['storage']['total'] / GIB:.3g} GiB",
               f"{quota.max_storage_bytes / GIB:.3g} GiB" if quota.max_storage_bytes is not None else ""),
    ]


# --- usage over time ----------------------------------------------------------------------------------------

def _intervals(team_id: int, since, until) -> list[tuple[float, float | None, float]]:
    """What the team held in the range as (start, end or None while held, GPUs) in Unix seconds: the spans the
    quota counts (``quotas.selectors.gpu_spans``: its attempts and its participants), so the chart and the
    GPU-hours meter beside it agree."""
    return [(began.timestamp(), ended.timestamp() if ended else None, share)
            for began, ended, share in gpu_spans(team_id, since, until)]


def usage_figures(team_id: int, quota: Quota, range_key: str, now=None) -> dict[str, dict]:
    """GPUs held over the range (peak and mean per bucket, with max_gpus) and GPU-hours per day (per hour for
    ranges of a day or less), both from what the quota counts: attempts' dispatch-to-end intervals times their
    GPU share, and participants' GPUs from join to end."""
    now = now or timezone.now()
    since = now - RANGES[range_key]
    intervals = _intervals(team_id, since, now)
    span = RANGES[range_key]
    origin, step, count = grid_layout(since, now, 60 if span > timedelta(hours=2) else 1, USAGE_POINTS)
    until = now.timestamp()
    areas, peaks = gpus_held_grid(intervals, origin, step, count, until=until)
    means = bucket_means(areas, origin, step, until)
    bar = 86400 if span > timedelta(days=1) else 3600 if span > timedelta(hours=1) else 300
    bar_origin = int(since.timestamp() // bar) * bar
    bar_seconds, _ = gpus_held_grid(intervals, bar_origin, bar, math.ceil((until - bar_origin) / bar), until=until)
    return {"usage": usage_figure(origin, step, means, peaks, quota.max_gpus),
            "gpu_hours": gpu_hours_figure(bar_origin, bar, bar_seconds),
            "bar": {86400: "day", 3600: "hour"}.get(bar, duration_text(bar))}


# --- the queue ----------------------------------------------------------------------------------------------

def team_queue(team_id: int, limit: int = QUEUE_LIMIT) -> tuple[list[dict], int]:
    """The team's waiting jobs in the order they will be served, with why each waits; and the total count.

    Placed (SCHEDULED) jobs first, then QUEUED ones in the scheduler's order within a team (priority, then
    time queued), then PENDING ones in admission order (priority, then time submitted).
    """
    jobs = Job.objects.filter(team_id=team_id, state__in=QUEUE_STATES).select_related("owner")
    total = jobs.count()
    ordered = (list(jobs.filter(state=JobState.SCHEDULED).order_by("queued_at", "created_at")[:limit])
               + list(jobs.filter(state=JobState.QUEUED).order_by("-priority", "queued_at", "created_at")[:limit])
               + list(jobs.filter(state=JobState.PENDING).order_by("-priority", "created_at")[:limit]))[:limit]
    now = timezone.now()
    rows, position = [], 0
    for job in ordered:
        waiting = job.state != JobState.SCHEDULED
        if waiting:
            position += 1
        reason = job.reason if job.reason.startswith("waiting") else ""
        if job.state == JobState.SCHEDULED and job.reason:
            reason = job.reason
        since = job.queued_at or job.created_at
        rows.append({"job": job, "position": position if waiting else None,
                     "reason": reason or DEFAULT_REASONS[job.state],
                     "gpus": _held_text(job), "workers": int(job.resources.get("workers", 1)),
                     "waited": duration_text(max(0, int((now - since).total_seconds())))})
    return rows, total


# --- pages --------------------------------------------------------------------------------------------------

@login_required
@require_GET
def usage_page(request):
    range_key = selected_range(request, USAGE_DEFAULT_RANGE)
    if range_key is None:
        return bad_range()
    teams = list(visible_teams(request))
    slug = request.GET.get("team")
    if slug:
        team = next((candidate for candidate in teams if candidate.slug == slug), None)
        if team is None:  # a team the viewer cannot see is indistinguishable from a missing one
            raise Http404("no such team")
    elif teams:
        team = teams[0]
    else:
        return render(request, "dashboard/usage.html", page_context(request, "usage", team=None))
    quota = Quota.objects.filter(team=team).first() or Quota(team=team)
    usage = team_usage(team.pk)
    figures = usage_figures(team.pk, quota, range_key)
    queue, queue_total = team_queue(team.pk)
    now = timezone.now()
    # Allocated against used over the range, the idlest jobs, the budget (strata.quotas.usage: the API's numbers).
    billing = team_billing(team, now - RANGES[range_key], now, now=now)
    context = page_context(
        request, "usage", team=team, quota=quota, usage=usage, meters=usage_meters(quota, usage),
        billing=billing, billing_csv=f"/api/v1/usage/{team.slug}/?format=csv&since={range_key}",
        range=range_key, ranges=list(RANGES), bar=figures["bar"],
        usage_figure=figure_json(figures["usage"]), gpu_hours_figure=figure_json(figures["gpu_hours"]),
        queue=queue, queue_total=queue_total, queue_limit=QUEUE_LIMIT, all_teams=teams)
    return render(request, "dashboard/usage.html", context)


EDITOR_FIELDS = [
    # (name, column title, placeholder, help)
    ("max_gpus", "Max GPUs", "unlimited", "GPUs held at once; fractions allowed"),
    ("max_gpu_memory", "Max GPU memory", "unlimited", "GPU memory held at once, e.g. 64GiB, or bytes"),
    ("max_cpus", "Max CPUs", "unlimited", "CPUs reserved at once (jobs with gpus: 0); fractions allowed"),
    ("max_memory", "Max memory", "unlimited", "host memory reserved at once, e.g. 256GiB, or bytes"),
    ("max_storage_bytes", "Max storage", "unlimited", "bytes stored (artifacts, checkpoints, code, data), e.g. 1TiB"),
    ("max_concurrent_jobs", "Max jobs", "unlimited", "queued or running at once"),
    ("gpu_hours", "GPU-hours", "unlimited", "per rolling window"),
    ("window_hours", "Window (h)", "", "length of the GPU-hours window, hours"),
    ("budget_gpu_hours", "Budget (GPU-h)", "none", "GPU-hours allocated per budget period (forecast only)"),
    ("budget_period_days", "Budget period (d)", "month", "budget period in days; empty: the calendar month"),
    ("priority", "Priority", "", "added to every job's priority, -100 to 100"),
    ("weight", "Weight", "", "fair-share weight between teams"),
]


def _quota_values(quota: Quota) -> dict[str, str]:
    return {
        "max_gpus": number_text(quota.max_gpus), "max_gpu_memory": bytes_text(quota.max_gpu_memory),
        "max_cpus": number_text(quota.max_cpus), "max_memory": bytes_text(quota.max_memory),
        "max_storage_bytes": bytes_text(quota.max_storage_bytes),
        "max_concurrent_jobs": "" if quota.max_concurrent_jobs is None else str(quota.max_concurrent_jobs),
        "gpu_hours": number_text(quota.gpu_hours), "window_hours": number_text(quota.window_hours),
        "budget_gpu_hours": number_text(quota.budget_gpu_hours),
        "budget_period_days": "" if quota.budget_period_days is None else str(quota.budget_period_days),
        "priority": str(quota.priority), "weight": number_text(quota.weight),
        ROOTS_FIELD: "\n".join(quota.data_roots or []),
    }


def _queue_counts() -> dict[int, dict[str, float]]:
    counts: dict[int, dict[str, float]] = defaultdict(lambda: {"pending": 0, "queued": 0, "running": 0, "gpus": 0.0})
    rows = (Job.objects.filter(state__in=[JobState.PENDING, JobState.QUEUED, JobState.SCHEDULED, JobState.RUNNING])
            .values("team_id", "state").annotate(n=Count("id")).order_by())
    for row in rows:
        key = {JobState.PENDING: "pending", JobState.QUEUED: "queued"}.get(row["state"], "running")
        counts[row["team_id"]][key] += row["n"]
    for team_id, resources in Job.objects.filter(state__in=ADMITTED_STATES).values_list("team_id", "resources"):
        counts[team_id]["gpus"] += float(resources.get("gpus", 0)) * int(resources.get("workers", 1))
    return counts


def _editor_rows(edited: str | None = None, values: dict | None = None, errors: dict | None = None) -> list[dict]:
    quotas = {quota.team_id: quota for quota in Quota.objects.all()}
    counts = _queue_counts()
    rows = []
    for team in Team.objects.order_by("slug"):
        quota = quotas.get(team.pk) or Quota(team=team)
        current = values if team.slug == edited and values is not None else _quota_values(quota)
        field_errors = errors if team.slug == edited and errors else {}
        fields = [{"name": name, "title": title, "placeholder": placeholder, "help": help_text,
                   "value": current.get(name, ""), "error": field_errors.get(name)}
                  for name, title, placeholder, help_text in EDITOR_FIELDS]
        team_counts = counts.get(team.pk, {"pending": 0, "queued": 0, "running": 0, "gpus": 0.0})
        roots = {"name": ROOTS_FIELD, "value": current.get(ROOTS_FIELD, ""), "error": field_errors.get(ROOTS_FIELD)}
        rows.append({"team": team, "fields": fields, "counts": team_counts, "gpus_text": f"{team_counts['gpus']:.4g}",
                     "errors": field_errors, "roots": roots})
    return rows


@admin_required
@require_http_methods(["GET", "POST"])
def quota_editor(request):
    """Every team's quota, editable in place. Saving admits the PENDING jobs that now fit, at once."""
    if request.method == "POST":
        team = get_object_or_404(Team, slug=request.POST.get("team", ""))
        submitted = {name: request.POST.get(name, "") for name in QUOTA_FIELDS}
        if ROOTS_FIELD in request.POST:  # a form without the field leaves the granted roots as they are
            submitted[ROOTS_FIELD] = request.POST[ROOTS_FIELD]
        try:
            change = quota_update(team.pk, submitted, request=request)
        except QuotaInvalid as error:
            messages.error(request, f"Quota of {team.slug} not saved: check the highlighted fields.")
            context = page_context(request, "quotas", rows=_editor_rows(team.slug, submitted, error.errors),
                                   columns=EDITOR_FIELDS, edited=team.slug)
            return render(request, "dashboard/quotas.html", context, status=400)
        admitted = len(change.admitted)
        still = Job.objects.filter(team=team, state=JobState.PENDING).count()
        summary = f"{admitted} pending job{'s' if admitted != 1 else ''} admitted"
        if still:
            summary += f", {still} still pending"
        verb = "saved" if change.changed else "unchanged"
        messages.success(request, f"Quota of {team.slug} {verb}: {summary}")
        return redirect(f"{reverse('dashboard:quota-editor')}#team-{team.slug}")
    return render(request, "dashboard/quotas.html",
                  page_context(request, "quotas", rows=_editor_rows(), columns=EDITOR_FIELDS))


urlpatterns = [
    path("usage/", usage_page, name="usage"),
    path("manage/quotas/", quota_editor, name="quota-editor"),
]
