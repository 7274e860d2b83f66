"""Metric charts of the job detail page: which chart a metric goes on, downsampled series, plotly figures.

Every metric a job reports lands on one of four charts by its name (:func:`chart_for`), one trace per metric
name with the step on the x axis. A metric with fewer than two steps (reported once, say) is no line: it is
shown as a value instead (:func:`split_series`), so no chart is drawn empty. The page embeds the initial figures
and its script extends the traces with the points the live endpoint returns, so this module also hands the
script each chart's empty layout. Numbers are shown by :func:`dashboard.figures.number_text`'s rule.
"""

from __future__ import annotations

import math
from typing import Any

from django.db.models import Max

from dashboard import figures
from strata.jobs.models import Job
from strata.jobs.selectors import MAX_POINTS_PER_SERIES, metric_series  # noqa: F401 (the page's series: one query path)

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
    extra: dict[str, Any] = {"margin": {"l": 55, "r": 16, "t": 10, "b": 40},
                             "yaxis": {"hoverformat": figures.HOVER_FORMAT}}
    if chart == "accuracy":
        extra["yaxis"]["rangemode"] = "normal"
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


def split_series(series: dict[str, tuple[list, list]]) -> tuple[dict[str, tuple[list, list]], list[dict[str, Any]]]:
    """(the series drawn as lines, the metrics shown as values): a metric whose finite points span fewer than two
    steps has no line to draw; it is shown as its last value (``{"name", "step", "text", "x", "y"}``, with its
    points for the page script, which turns it into a line when a second step arrives)."""
    lines, values = {}, []
    for name, (steps, numbers) in series.items():
        finite = [(step, value) for step, value in zip(steps, numbers, strict=True) if value is not None]
        if len({step for step, _ in finite}) >= 2:
            lines[name] = (steps, numbers)
            continue
        step, value = finite[-1] if finite else (steps[-1] if steps else None, None)
        values.append({"name": name, "step": step, "text": figures.number_text(value), "x": steps, "y": numbers})
    return lines, values


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
    for entry in grouped.values():  # the newest value as shown, for a metric the page shows as a value
        entry["text"] = figures.number_text(next((y for y in reversed(entry["y"]) if y is not None), None))
    return grouped, (rows[-1][0] if rows else after)


def chart_config() -> dict[str, Any]:
    """What the page script needs to add a chart a live update brings: titles, layouts and colours."""
    return {
        "order": list(CHARTS),
        "charts": {chart: {"title": spec["title"], "layout": chart_layout(chart)} for chart, spec in CHARTS.items()},
        "palette": figures.PALETTE,
    }
