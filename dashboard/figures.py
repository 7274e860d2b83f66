"""Plotly figures as plain JSON dicts (``{"data": [...], "layout": {...}}``), drawn by the bundled plotly.js.

Figures are built as dicts rather than ``plotly.graph_objects`` so a page with hundreds of traces stays well
under the server's time budget; the JSON is exactly what plotly.js takes.
"""

from __future__ import annotations

import math

PALETTE = ["#2f6fed", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0b7285", "#e67700", "#5c940d"]


def layout(title: str = "", *, x_title: str = "", y_title: str = "", **extra) -> dict:
    base = {
        "title": {"text": title, "font": {"size": 14}, "x": 0.01} if title else None,
        "xaxis": {"title": {"text": x_title}, "automargin": True, "gridcolor": "#eef0f3"},
        "yaxis": {"title": {"text": y_title}, "automargin": True, "gridcolor": "#eef0f3", "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.2},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "hovermode": "x unified",
    }
    if base["title"] is None:
        del base["title"]
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def clean(value: float | None, digits: int = 4) -> float | None:
    """A finite, rounded number for JSON; NaN and infinities become null (plotly leaves a gap)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


# How many significant digits the dashboard shows of a measured number (a metric, a panel's table cell, a chart's
# hover label): the one rule, in Python (number_text) and in plotly's d3 format (HOVER_FORMAT).
SIGNIFICANT_DIGITS = 4
HOVER_FORMAT = f".{SIGNIFICANT_DIGITS}~g"


def number_text(value: float | int | None, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A number as the dashboard shows it: ``digits`` significant digits (0.2785515320334262 -> "0.2786",
    1.23456e-05 -> "1.235e-05"), whole numbers and numbers of ``digits`` digits or more without a fraction (8.0 ->
    "8", 12345.6 -> "12346"); "—" for None, NaN and infinities."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return "—"
    if isinstance(value, int) or float(value).is_integer() or abs(value) >= 10 ** digits:
        return f"{value:.0f}" if abs(value) < 1e15 else f"{value:.{digits}g}"
    return f"{value:.{digits}g}"


def cell_text(value):
    """A table cell as shown: a float through :func:`number_text`, anything else as it is."""
    return number_text(value) if isinstance(value, float) else value


def line(name: str, x: list, y: list, index: int = 0, **extra) -> dict:
    trace = {"type": "scatter", "mode": "lines", "name": name, "x": x, "y": y,
             "line": {"color": PALETTE[index % len(PALETTE)], "width": 2}}
    trace.update(extra)
    return trace
