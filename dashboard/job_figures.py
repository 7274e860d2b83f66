"""Metric charts of the job detail page: which chart a metric goes on, downsampled series, plotly figures.

Every metric a job reports lands on one of four charts by its name (:func:`chart_for`), one trace per metric
name with the step on the x axis. The page embeds the initial figures and its script extends the traces with
the points the live endpoint returns, so this module also hands the script each chart's empty layout.
"""

from __future__ import annotations

import math
from typing import Any

from django.db.models import Count, F, Max, Q, Window
from django.db.models.functions import RowNumber

from dashboard import figures
from strata.jobs.models import Job

MAX_POINTS_PER_SERIES = 2000

CHARTS: dict[str, dict[str, str]] = {
    "loss": {"title": "Loss", "y_title": "loss"},
    "accuracy": {"title": "Accuracy", "y_title": "accuracy"},
    "throughput": {"title": "Throughput", "y_title": "per second"},
    "other": {"title": "Other metrics", "y_title": ""},
}


def chart_for(name: str) -> str:
    """The chart a metric belongs on: ``*loss*``, ``*acc*``, ``samples_per_s`` / ``*_per_s``, or other."""
    lowered = name.lower()
    if "loss" in lowered:
        return "loss"
    if "acc" in lowered:
        return "accuracy"
    if lowered == "samples_per_s" or lowered.endswith("_per_s"):
        return "throughput"
    return "other"


def chart_layout(chart: str) -> dict[str, Any]:
    spec = CHARTS[chart]
    extra: dict[str, Any] = {"margin": {"l": 55, "r": 16, "t": 10, "b": 40}}
    if chart == "accuracy":
        extra["yaxis"] = {"rangemode": "normal"}
    return figures.layout(x_title="step", y_title=spec["y_title"], **extra)


def scrub(value: Any) -> Any:
    """A JSON-safe copy: NaN and infinities (a diverged loss) become null, tuples become lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): scrub(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(item) for item in value]
    return value


def metric_series(job: Job, up_to_id: int | None = None,
                  max_points: int = MAX_POINTS_PER_SERIES) -> dict[str, tuple[list[int], list[float | None]]]:
    """``name -> (steps, values)`` in step order. A series longer than ``max_points`` is thinned in the
    database to every n-th point (its first and last kept), so a job with millions of points stays fast."""
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
            values.append(figures.clean(value, 6))
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
            values.append(figures.clean(value, 6))
    return dict(sorted(series.items()))


def metric_figures(series: dict[str, tuple[list, list]]) -> dict[str, dict[str, Any]]:
    """One figure per chart that has metrics, in the order of :data:`CHARTS`."""
    traces: dict[str, list[dict]] = {chart: [] for chart in CHARTS}
    for name, (steps, values) in series.items():
        chart = chart_for(name)
        traces[chart].append(figures.line(name, steps, values, index=len(traces[chart])))
    return {chart: {"data": data, "layout": chart_layout(chart)} for chart, data in traces.items() if data}


def latest_metric_id(job: Job) -> int:
    return job.metric_points.aggregate(last=Max("id"))["last"] or 0


def new_metrics(job: Job, after: int, limit: int) -> tuple[dict[str, dict[str, Any]], int]:
    """Points with ids above ``after`` (at most ``limit``), grouped by name for the page to append, and the
    new cursor."""
    rows = list(job.metric_points.filter(id__gt=after).order_by("id").values_list("id", "name", "step", "value")[:limit])
    grouped: dict[str, dict[str, Any]] = {}
    for _, name, step, value in rows:
        entry = grouped.setdefault(name, {"x": [], "y": [], "chart": chart_for(name)})
        entry["x"].append(step)
        entry["y"].append(figures.clean(value, 6))
    return grouped, (rows[-1][0] if rows else after)


def chart_config() -> dict[str, Any]:
    """What the page script needs to add a chart a live update brings: titles, layouts and colours."""
    return {
        "order": list(CHARTS),
        "charts": {chart: {"title": spec["title"], "layout": chart_layout(chart)} for chart, spec in CHARTS.items()},
        "palette": figures.PALETTE,
    }
