"""The straggler panels. Light: the dashboard imports them; they read only through PanelData.

Job panels (any job with ``spec.distributed``) read the rank-tagged metrics every strategy reports
(``rank<r>.step_ms``, ``rank<r>.slowed_steps``) and the latest attempt report of the ``straggler`` plugin
(SMS and Stanza: predicted and actual stragglers, samples dropped, bytes sent and skipped); the cluster panel
reads the nodes' availability reports (SAS).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from components.runtime.contract.panels import Panel, PanelData, finite

PLUGIN = "straggler"
RANK_METRIC = re.compile(r"^rank(\d+)\.(step_ms|slowed_steps)$")


def _distributed(job: dict[str, Any]) -> bool:
    return isinstance((job.get("spec") or {}).get("distributed"), dict)


def rank_series(data: PanelData) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
    """``({rank: {step: step_ms}}, {rank: slowed steps so far})`` from the rank-tagged metrics."""
    times: dict[int, dict[int, float]] = {}
    slowed: dict[int, float] = {}
    for name, points in data.metrics().items():
        match = RANK_METRIC.match(name)
        if not match:
            continue
        rank = int(match.group(1))
        if match.group(2) == "step_ms":
            times.setdefault(rank, {}).update({int(step): float(value) for step, value, *_ in points
                                               if value is not None})
        elif points:
            slowed[rank] = float(points[-1][1])
    return times, slowed


def straggler_cost(times: dict[int, dict[int, float]]) -> tuple[dict[int, int], float]:
    """Which rank was slowest at each logged window (when it was clearly slower than the median, > 20 %), and
    the time the gang lost waiting: the sum over windows of (slowest - median) x steps in the window, seconds."""
    steps = sorted({step for series in times.values() for step in series})
    worst: dict[int, int] = {}
    lost = 0.0
    previous = 0
    for step in steps:
        values = sorted((series[step], rank) for rank, series in times.items() if step in series)
        if len(values) < 2:
            previous = step
            continue
        median = values[len(values) // 2][0] if len(values) % 2 else (values[len(values) // 2 - 1][0]
                                                                      + values[len(values) // 2][0]) / 2
        slowest, rank = values[-1]
        if median > 0 and slowest > 1.2 * median:
            worst[step] = rank
            lost += (slowest - median) / 1000.0 * max(step - previous, 1)
        previous = step
    return worst, lost


def latest_report(data: PanelData, job: dict[str, Any] | None) -> dict[str, Any] | None:
    if not job:
        return None
    attempts = data.reports(PLUGIN, job_id=str(job.get("id")))["attempts"]
    attempts = [entry for entry in attempts if isinstance(entry.get("payload"), dict)]
    if not attempts:
        return None
    return max(attempts, key=lambda entry: (entry.get("number") or 0, entry.get("time") or 0))["payload"]


class StepTimeHeatmapPanel(Panel):
    """Each worker's step time over the run, as a heatmap: which worker straggled, when, and what it cost."""

    slug: ClassVar[str] = "straggler-heatmap"
    title: ClassVar[str] = "Step time per worker"
    placement: ClassVar[str] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        return _distributed(job)

    def render(self, data: PanelData) -> dict[str, Any] | None:
        times, slowed = rank_series(data)
        if not times:
            return None
        ranks = sorted(times)
        steps = sorted({step for series in times.values() for step in series})[-400:]
        z = [[times[rank].get(step) for step in steps] for rank in ranks]
        worst, lost = straggler_cost(times)
        rows = []
        for rank in ranks:
            values = [value for value in times[rank].values() if value is not None]
            mean = sum(values) / len(values) if values else None
            rows.append([f"rank {rank}", None if mean is None else round(mean, 2),
                         sum(1 for r in worst.values() if r == rank), int(slowed.get(rank, 0))])
        figure = {"data": [{"type": "heatmap", "x": steps, "y": [f"rank {rank}" for rank in ranks], "z": z,
                            "colorscale": "YlOrRd", "colorbar": {"title": "ms/step"}}],
                  "layout": {"xaxis": {"title": "step"}, "height": 120 + 30 * len(ranks)}}
        table = {"columns": ["worker", "mean step (ms)", "windows as the straggler", "steps slowed (injected)"],
                 "rows": rows + [["time lost waiting for the slowest worker", f"{lost:.1f} s", "", ""]]}
        return finite({"figure": figure, "table": table})


class PredictedStragglersPanel(Panel):
    """SMS: the stragglers it predicted against those that were (a step's time > 1.2 x the median)."""

    slug: ClassVar[str] = "straggler-predictions"
    title: ClassVar[str] = "Predicted vs actual stragglers"
    placement: ClassVar[str] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        return _distributed(job) and (job.get("spec") or {}).get("distributed", {}).get("strategy") == "sms"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        report = latest_report(data, data.job)
        stragglers = (report or {}).get("stragglers")
        if not stragglers:
            return None
        traces = []
        for key, label, symbol in (("actual", "actual", "circle-open"), ("predicted", "predicted", "x")):
            pairs = stragglers.get(key) or []
            traces.append({"type": "scatter", "mode": "markers", "name": label, "marker": {"symbol": symbol,
                                                                                         "size": 9},
                           "x": [pair[0] for pair in pairs], "y": [f"rank {pair[1]}" for pair in pairs]})
        precision, recall = stragglers.get("precision"), stragglers.get("recall")
        rows = [["Predicted", len(stragglers.get("predicted") or [])],
                ["Actual", len(stragglers.get("actual") or [])],
                ["Precision", "n/a" if precision is None else f"{precision:.2f}"],
                ["Recall", "n/a" if recall is None else f"{recall:.2f}"]]
        return finite({"figure": {"data": traces, "layout": {"xaxis": {"title": "step"}, "height": 260}},
                       "table": {"columns": [], "rows": rows}})


class SavingsPanel(Panel):
    """What the strategy saved: samples a predicted straggler dropped (near duplicates), gradient bytes not sent
    (transfer control), and bytes per iteration against a full all-reduce of the model (Stanza)."""

    slug: ClassVar[str] = "straggler-savings"
    title: ClassVar[str] = "Samples dropped and bytes saved"
    placement: ClassVar[str] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        return _distributed(job) and (job.get("spec") or {}).get("distributed", {}).get("strategy") in (
            "sms", "stanza")

    def render(self, data: PanelData) -> dict[str, Any] | None:
        report = latest_report(data, data.job)
        if not report:
            return None
        sent, skipped, full = (int(report.get(key) or 0) for key in ("bytes_sent", "bytes_skipped", "bytes_full"))
        per_iteration = report.get("strategy") == "stanza"
        unit = "bytes per iteration" if per_iteration else "bytes so far"
        figure = {"data": [{"type": "bar", "x": ["sent", "skipped", "full all-reduce"],
                            "y": [sent, skipped, full]}],
                  "layout": {"yaxis": {"title": unit}, "height": 240}}
        saved = 1 - sent / full if full else None
        rows = [["Strategy", report.get("strategy", "")], ["Steps", report.get("step", 0)],
                ["Samples dropped (near duplicates)", int(report.get("dropped_samples") or 0)],
                [f"Sent ({unit})", f"{sent:,}"], [f"Full all-reduce ({unit})", f"{full:,}"],
                ["Saved", "n/a" if saved is None else f"{100 * saved:.1f} %"]]
        for name, value in sorted((report.get("phases") or {}).items()):
            rows.append([name.replace("_", " "), f"{value:.2f}"])
        return finite({"figure": figure, "table": {"columns": [], "rows": rows}})


class NodeGroupsPanel(Panel):
    """SAS on the cluster page: each node's predicted availability over the next horizon, the KMeans groups
    the placement hook sees, and how accurate each node's predictor has been (mean absolute error of forecasts
    whose horizon has passed, against the naive "recent mean")."""

    slug: ClassVar[str] = "straggler-node-groups"
    title: ClassVar[str] = "Node availability forecast (SAS)"
    placement: ClassVar[str] = "cluster"
    resources: ClassVar[tuple[str, ...]] = ("cpu", "memory", "gpu", "network")

    def render(self, data: PanelData) -> dict[str, Any] | None:
        nodes = [entry for entry in data.reports(PLUGIN)["nodes"] if isinstance(entry.get("payload"), dict)
                 and entry["payload"].get("predicted")]
        if not nodes:
            return None
        from components.straggler.sas import group, matrix

        payloads = [entry["payload"] for entry in nodes]
        predicted, std = matrix(payloads, self.resources)
        labels = [int(label) for label in group(predicted, std)]
        names = [str(entry.get("node")) for entry in nodes]
        traces = [{"type": "bar", "name": resource, "x": [f"{name} (group {label + 1})" for name, label in
                                                          zip(names, labels, strict=True)],
                   "y": [float(value) for value in predicted[:, column]],
                   "error_y": {"type": "data", "array": [float(value) for value in std[:, column]]}}
                  for column, resource in enumerate(self.resources)]
        rows = []
        for name, label, payload in zip(names, labels, payloads, strict=True):
            accuracy = payload.get("accuracy") or {}
            mae, naive = accuracy.get("mae") or {}, accuracy.get("naive_mae") or {}
            errors = ", ".join(f"{resource} {mae[resource]:.3f}" + (f" (naive {naive[resource]:.3f})"
                                                                    if naive.get(resource) is not None else "")
                               for resource in self.resources if mae.get(resource) is not None)
            rows.append([name, label + 1] + [round(float(predicted[names.index(name), column]), 3)
                                             for column in range(len(self.resources))]
                        + [errors or "not scored yet", int(accuracy.get("n") or 0)])
        figure = {"data": traces, "layout": {"barmode": "group", "yaxis": {"title": "predicted availability",
                                                                           "range": [0, 1.05]}, "height": 300}}
        table = {"columns": ["node", "group", *self.resources, "predictor error (MAE)", "forecasts scored"],
                 "rows": rows}
        return finite({"figure": figure, "table": table})
