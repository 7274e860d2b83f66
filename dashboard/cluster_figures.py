"""Figures of the cluster and usage pages, as plotly JSON dicts built from evenly spaced telemetry buckets.

Every time series here is on a regular grid (:class:`strata.telemetry.selectors.DeviceGrid`), so traces carry
``x0`` (the first bucket's middle) and ``dx`` (the bucket width in milliseconds, as plotly wants on date
axes) instead of one timestamp per point, and values are rounded: a 30-day chart of 100 devices stays a few
hundred kilobytes. Times are UTC.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from dashboard.figures import PALETTE, clean, layout

GIB = 2**30
LEGEND_MAX_TRACES = 16  # beyond this a legend is a wall of names; hover still names each trace
UNIFIED_HOVER_MAX_TRACES = 8
# Idle is near-white, busy is the accent blue: the eye goes to the busy devices.
HEATMAP_SCALE = [[0.0, "#f4f6fb"], [0.5, "#7fa6f5"], [1.0, "#1d3f99"]]


def device_label(device: dict) -> str:
    """``node:gpuN``, the name a device goes by on every chart."""
    return f"{device['node']}:gpu{device['index']}"


def plotly_time(seconds: float) -> str:
    """Unix seconds as the date string plotly reads on a date axis (UTC, millisecond precision)."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def grid_axis(start: float, step: float) -> dict:
    """``x0``/``dx`` of a trace whose point ``i`` is the middle of bucket ``i``."""
    return {"x0": plotly_time(start + step / 2), "dx": step * 1000}


def _rounded(values: Sequence[float | None], digits: int, scale: float = 1.0) -> list[float | None]:
    return [None if value is None else clean(value / scale, digits) for value in values]


def _time_layout(title: str, y_title: str, traces: int, **extra) -> dict:
    many = traces > UNIFIED_HOVER_MAX_TRACES
    # No x-axis title: dates speak for themselves, and a title there collides with the legend below.
    return layout(title, y_title=y_title,
                  xaxis={"type": "date"}, showlegend=traces <= LEGEND_MAX_TRACES,
                  hovermode="closest" if many else "x unified", **extra)


def _series(grid, devices: list[dict], values: dict, digits: int, scale: float = 1.0) -> list[dict]:
    axis = grid_axis(grid.start.timestamp(), grid.step)
    traces = []
    for number, device in enumerate(devices):
        trace = {"type": "scatter", "mode": "lines", "name": device_label(device), **axis,
                 "y": _rounded(values.get(device["id"], []), digits, scale),
                 "line": {"color": PALETTE[number % len(PALETTE)], "width": 1.5}}
        traces.append(trace)
    return traces


def utilization_figure(grid, devices: list[dict]) -> dict:
    """Mean utilization (%) of each device per bucket, one line per device."""
    return {"data": _series(grid, devices, grid.utilization, 1),
            "layout": _time_layout("", "utilization %", len(devices), yaxis={"range": [0, 100.5]})}


def memory_figure(grid, devices: list[dict]) -> dict:
    """Mean GPU memory used (GiB, two decimals) of each device per bucket."""
    return {"data": _series(grid, devices, grid.memory_used, 2, GIB),
            "layout": _time_layout("", "memory used (GiB)", len(devices))}


def heatmap_figure(grid, devices: list[dict]) -> dict:
    """Devices × time, colored by mean utilization: one row of ``z`` per device, in the devices' order."""
    axis = grid_axis(grid.start.timestamp(), grid.step)
    trace = {"type": "heatmap", **axis, "y": [device_label(device) for device in devices],
             "z": [_rounded(grid.utilization.get(device["id"], []), 1) for device in devices],
             "zmin": 0, "zmax": 100, "colorscale": HEATMAP_SCALE, "hoverongaps": False,
             "colorbar": {"title": {"text": "%"}, "thickness": 12},
             "hovertemplate": "%{y}<br>%{x}<br>%{z:.1f} %<extra></extra>"}
    figure_layout = layout("", xaxis={"type": "date"},
                           yaxis={"autorange": "reversed", "type": "category"}, hovermode="closest")
    figure_layout["yaxis"].pop("rangemode", None)  # not meaningful on a category axis
    return {"data": [trace], "layout": figure_layout}


def cluster_figures(grid, devices: list[dict]) -> dict[str, dict]:
    """The three charts of the cluster page from one grid."""
    return {"utilization": utilization_figure(grid, devices), "memory": memory_figure(grid, devices),
            "heatmap": heatmap_figure(grid, devices)}


# --- team usage --------------------------------------------------------------------------------------------

def gpus_held_grid(intervals, start: float, step: float, count: int,
                   until: float | None = None) -> tuple[list[float], list[float]]:
    """(GPU-seconds, peak GPUs held) per bucket, from ``(dispatched, ended or None, share)`` intervals in
    Unix seconds; an interval without an end is held until ``until`` (default: the end of the grid).

    A sweep over sorted start/end events: O(n log n + count), whatever the length of each interval.
    """
    end = start + step * count
    open_end = end if until is None else min(until, end)
    events: list[tuple[float, float]] = []
    for began, ended, share in intervals:
        stop = open_end if ended is None else min(ended, end)
        began = max(began, start)
        if share and stop > began:
            events.append((began, share))
            events.append((stop, -share))
    events.sort()  # at one instant, releases (negative) come before new holds
    areas, peaks = [0.0] * count, [0.0] * count
    level, cursor, position = 0.0, start, 0
    for bucket in range(count):
        bucket_end = start + (bucket + 1) * step
        area, peak = 0.0, level
        while position < len(events) and events[position][0] < bucket_end:
            moment, delta = events[position]
            area += level * (moment - cursor)
            cursor = moment
            level += delta
            # Several events at one instant: the peak is the level after all of them.
            if position + 1 >= len(events) or events[position + 1][0] != moment:
                peak = max(peak, level)
            position += 1
        area += level * (bucket_end - cursor)
        cursor = bucket_end
        areas[bucket] = max(0.0, area)
        peaks[bucket] = max(0.0, peak if abs(peak) > 1e-9 else 0.0)
    return areas, peaks


def bucket_means(areas: list[float], start: float, step: float, until: float) -> list[float]:
    """Mean level per bucket from its area; the bucket holding ``until`` is averaged over its elapsed part."""
    return [area / max(1e-9, min(step, until - (start + i * step))) for i, area in enumerate(areas)]


def usage_figure(start: float, step: float, means: list[float], peaks: list[float], limit: float | None) -> dict:
    """GPUs held by a team over time (stepped), with its max_gpus limit as a dashed line."""
    axis = grid_axis(start, step)
    data = [
        {"type": "scatter", "mode": "lines", "name": "GPUs held (peak)", **axis, "y": _rounded(peaks, 3),
         "line": {"color": PALETTE[0], "width": 2, "shape": "hvh"}},
        {"type": "scatter", "mode": "lines", "name": "GPUs held (mean)", **axis, "y": _rounded(means, 3),
         "line": {"color": PALETTE[0], "width": 0, "shape": "hvh"}, "fill": "tozeroy",
         "fillcolor": "rgba(47,111,237,0.15)"},
    ]
    if limit is not None:
        first, last = plotly_time(start), plotly_time(start + step * len(means))
        data.append({"type": "scatter", "mode": "lines", "name": f"max_gpus ({limit:g})", "x": [first, last],
                     "y": [limit, limit], "line": {"color": PALETTE[1], "width": 2, "dash": "dash"},
                     "hoverinfo": "skip"})
    return {"data": data, "layout": layout("", y_title="GPUs", xaxis={"type": "date"})}


def gpu_hours_figure(start: float, bar_seconds: float, gpu_seconds: list[float]) -> dict:
    """GPU-hours used per bar (a day, an hour...)."""
    return {"data": [{"type": "bar", "name": "GPU-hours", **grid_axis(start, bar_seconds),
                      "y": _rounded([seconds / 3600 for seconds in gpu_seconds], 2), "marker": {"color": PALETTE[2]}}],
            "layout": layout("", y_title="GPU-hours", xaxis={"type": "date"},
                             showlegend=False, hovermode="x")}
