"""The compare page, ``/compare/?jobs=<id>,<id>,...``: jobs of the viewer's teams side by side, each metric on
one chart with a trace per job, a table of states, attempts, durations, resources, GPU- and CPU-seconds and final
metrics, and the paths of the jobs' documents that differ. The data is ``strata.jobs.compare.compare_jobs`` (what
``GET /api/v1/compare/`` answers), with the quota's own count of GPU- and CPU-seconds.

The job list's checkboxes submit ``?jobs=a&jobs=b``; the page redirects that (and ``?parent=<id>``: the first
children of a job) to the one shareable form, ``?jobs=a,b``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET

from dashboard import figures, job_figures
from dashboard.views.common import figure_json, login_required, page_context
from strata.accounts.selectors import visible_team_ids
from strata.jobs.compare import MAX_JOBS, CompareInvalid, CompareNotFound, compare_jobs, requested_ids
from strata.quotas.selectors import job_usage


def _canonical(ids) -> str:
    return reverse("dashboard:compare") + "?" + urlencode({"jobs": ",".join(str(job_id) for job_id in ids)})


@login_required
@require_GET
def compare(request):
    team_ids = visible_team_ids(request)
    values = request.GET.getlist("jobs")
    try:
        job_ids = requested_ids(team_ids, values, request.GET.get("parent"))
        if len(values) != 1:  # ?jobs=a&jobs=b (the list's plain form) or ?parent=: the one shareable address
            return redirect(_canonical(job_ids))
        data = compare_jobs(team_ids, job_ids, usage=job_usage)
    except CompareInvalid as error:
        return _problem(request, error.message, 400)
    except CompareNotFound as error:
        return _problem(request, str(error), 404)
    jobs = data["jobs"]
    for index, job in enumerate(jobs):
        job["colour"] = figures.PALETTE[index % len(figures.PALETTE)]
        job["label"] = _label(job)
        job["duration_text"] = _seconds_text(job["duration_s"])
        job["gpu_text"] = _usage_text(job["gpu_seconds"], "GPU")
        job["cpu_text"] = _usage_text(job["cpu_seconds"], "CPU")
        job["finals"] = [figures.number_text(job["final_metrics"].get(name, {}).get("value"))
                         for name in data["metrics"]]
    diff = [{"path": row["path"], "cells": [_value_text(value) if present else "—"
                                            for value, present in zip(row["values"], row["present"], strict=True)]}
            for row in data["spec_diff"]]
    return render(request, "dashboard/compare.html", page_context(
        request, "jobs", jobs=jobs, metrics=data["metrics"], diff=diff, charts=compare_figures(data),
        points=data["points_per_series"], api_url=reverse("compare") + "?" + request.GET.urlencode(),
        cli_ids=" ".join(job["id"] for job in jobs),
    ))


def _problem(request, message: str, status: int):
    return render(request, "dashboard/compare.html", page_context(request, "jobs", error=message,
                                                                  max_jobs=MAX_JOBS), status=status)


def _label(job: dict) -> str:
    """A trace's name: jobs of a sweep often share a name, so the short id goes with it."""
    return f"{job['name']} ({job['id'][:8]})"


def compare_figures(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One chart per metric (losses first, then accuracies, throughputs and the rest, as on the job page), one
    trace per job in the job's colour, so a job has the same colour on every chart."""
    order = list(job_figures.CHARTS)
    names = sorted(data["metrics"], key=lambda name: (order.index(job_figures.chart_for(name)), name))
    charts = []
    for number, name in enumerate(names):
        traces = []
        for index, job in enumerate(data["jobs"]):
            series = job["series"].get(name)
            if series:
                # A job that reported the metric once (a final test score) has no line to draw: a marker shows it.
                once = sum(value is not None for value in series["values"]) < 2
                traces.append(figures.line(_label(job), series["steps"], series["values"], index=index,
                                           **({"mode": "lines+markers"} if once else {})))
        layout = job_figures.chart_layout(job_figures.chart_for(name))
        layout["yaxis"] = {**layout["yaxis"], "title": {"text": name}}
        charts.append({"name": name, "dom_id": f"compare-{number}",
                       "json": figure_json({"data": traces, "layout": layout})})
    return charts


def _value_text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "), sort_keys=True, default=str)


def _seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _usage_text(seconds: float | None, unit: str) -> str:
    """GPU- or CPU-time as the Usage page states it: hours once there is an hour of it, seconds below."""
    if seconds is None:
        return "—"
    return f"{seconds / 3600:.2f} {unit}-h" if seconds >= 3600 else f"{seconds:.0f} {unit}-s"


urlpatterns = [
    path("compare/", compare, name="compare"),
]
