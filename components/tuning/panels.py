"""Dashboard panels of the ``tune`` kind: the sweep's learning curves, its parameters against the metric, its rungs
and how its GPUs were shared out over time. Light: the control plane imports this module; everything comes from
the tune attempt's ``tuning`` report (see :func:`components.tuning.report.trials`)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from components.runtime.contract.panels import Panel, PanelData, finite
from components.tuning.report import trials

MAX_LINES = 200  # trials drawn on one chart (the best ones first)


def _table(data: PanelData) -> dict[str, Any] | None:
    table = trials(data)
    return table if table["trials"] else None


def _ranked(table: dict[str, Any]) -> list[dict[str, Any]]:
    """Trials with a value, best first; the others after them."""
    sign = -1 if table.get("mode") == "max" else 1

    def key(row):
        best = row.get("best")
        return (best is None, sign * best if best is not None else 0, row.get("number", 0))

    return sorted(table["trials"], key=key)


class TrialCurvesPanel(Panel):
    """The metric of every trial per iteration; trials stopped early end in a cross, the best trial is thick."""

    slug: ClassVar[str] = "tune-curves"
    kinds: ClassVar[tuple[str, ...]] = ("tune",)
    title: ClassVar[str] = "Trials: learning curves"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        table = _table(data)
        if table is None:
            return None
        best = (table.get("best") or {}).get("number")
        lines = []
        for row in _ranked(table)[:MAX_LINES]:
            values = row.get("values") or []
            if not values:
                continue
            stopped = row.get("status") == "stopped"
            lines.append({
                "type": "scatter", "mode": "lines+markers", "name": f"trial {row['number']}",
                "x": [point[0] for point in values], "y": [point[1] for point in values],
                "line": {"width": 4 if row["number"] == best else 1.5, "dash": "dot" if stopped else "solid"},
                "marker": {"size": [10 if stopped and index == len(values) - 1 else 4 for index in range(len(values))],
                           "symbol": ["x" if stopped and index == len(values) - 1 else "circle"
                                      for index in range(len(values))]},
                "hovertext": f"{row.get('status')}: {row.get('reason') or ''}"[:200],
            })
        if not lines:
            return {"text": "No trial has reported its metric yet."}
        return {"figure": finite({"data": lines, "layout": {
            "xaxis": {"title": {"text": "iteration"}}, "yaxis": {"title": {"text": table.get("metric") or ""}},
            "legend": {"orientation": "h"}, "margin": {"t": 10}}})}


class ParametersPanel(Panel):
    """Parallel coordinates: each trial's parameters against its best value (choices drawn as their index)."""

    slug: ClassVar[str] = "tune-parameters"
    kinds: ClassVar[tuple[str, ...]] = ("tune",)
    title: ClassVar[str] = "Trials: parameters against the metric"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        table = _table(data)
        if table is None:
            return None
        rows = [row for row in table["trials"] if row.get("best") is not None]
        if not rows:
            return None
        names = sorted({name for row in rows for name in (row.get("params") or {})})
        dimensions = []
        for name in names:
            values = [(row.get("params") or {}).get(name) for row in rows]
            numbers = [value for value in values if isinstance(value, int | float) and not isinstance(value, bool)]
            if len(numbers) == len(values) and numbers:
                logs = min(numbers) > 0 and max(numbers) / min(numbers) > 100
                dimension = {"label": f"log10 {name}" if logs else name,
                             "values": [math.log10(v) if logs else v for v in numbers]}
            else:
                labels = sorted({str(value) for value in values})
                dimension = {"label": name, "values": [labels.index(str(value)) for value in values],
                             "tickvals": list(range(len(labels))), "ticktext": labels}
            dimensions.append(dimension)
        metric = [row["best"] for row in rows]
        dimensions.append({"label": table.get("metric") or "metric", "values": metric})
        return {"figure": finite({"data": [{
            "type": "parcoords", "dimensions": dimensions,
            "line": {"color": metric, "colorscale": "Viridis", "showscale": True,
                     "reversescale": table.get("mode") == "min"}}],
            "layout": {"margin": {"t": 40, "l": 60, "r": 60}}})}


class RungsPanel(Panel):
    """The trial scheduler's rungs: at which iteration, which trials were recorded, which went on."""

    slug: ClassVar[str] = "tune-rungs"
    kinds: ClassVar[tuple[str, ...]] = ("tune",)
    title: ClassVar[str] = "Trials: rungs"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        table = _table(data)
        if table is None or not table.get("rungs"):
            return None
        rows = []
        for rung in table["rungs"]:
            if "milestone" not in rung:  # PBT's exploit steps
                rows.append([rung.get("iteration"), f"trial {rung.get('trial')} took trial {rung.get('from')}'s "
                             "weights", "", ""])
                continue
            values = rung.get("values") or {}
            went_on = rung.get("promoted")
            if went_on is None:
                stopped = set(rung.get("stopped") or [])
                went_on = [trial for trial in values if trial not in stopped]
            rows.append([rung["milestone"], len(values), ", ".join(str(t) for t in went_on) or "—",
                         max(values.values(), default=None) if table.get("mode") == "max"
                         else min(values.values(), default=None)])
        return {"table": finite({"columns": ["iteration", "trials recorded", "went on", "best there"],
                                 "rows": rows})}


class SharesPanel(Panel):
    """How the tune job's GPUs were shared out over time: each trial's share (stacked), changing as trials come,
    go, get measured and are water-filled."""

    slug: ClassVar[str] = "tune-shares"
    kinds: ClassVar[tuple[str, ...]] = ("tune",)
    title: ClassVar[str] = "Trials: GPU shares over time (water-filling)"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        table = _table(data)
        if table is None:
            return None
        changes = sorted({point[0] for row in table["trials"] for point in (row.get("shares") or [])})
        if not changes:
            return None
        start = changes[0]
        traces = []
        for row in sorted(table["trials"], key=lambda row: row["number"])[:MAX_LINES]:
            shares = sorted(row.get("shares") or [])
            if not shares:
                continue
            ys, index, current = [], 0, 0.0
            for moment in changes:
                while index < len(shares) and shares[index][0] <= moment:
                    current = shares[index][1]
                    index += 1
                ys.append(current)
            traces.append({"type": "scatter", "mode": "lines", "stackgroup": "shares", "line": {"shape": "hv"},
                           "name": f"trial {row['number']}", "x": [moment - start for moment in changes], "y": ys})
        budget = table.get("budget")
        layout = {"xaxis": {"title": {"text": "seconds since the first trial"}},
                  "yaxis": {"title": {"text": "GPUs"}, "range": [0, (budget or 1) * 1.05]}, "margin": {"t": 10}}
        if budget:
            layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": budget, "y1": budget,
                                 "line": {"dash": "dash"}}]
        return {"figure": finite({"data": traces, "layout": layout})}
