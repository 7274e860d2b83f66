"""Dashboard panels for GPU sharing: who ran when on each shared device, and one job's share.

Light like a spec module (no torch): the control plane imports it to render pages. Both panels read only
gpushare's reports through ``PanelData.reports("gpushare", ...)``, which the dashboard scopes to the viewer
(other teams' jobs come without id or name), shaped by :mod:`components.gpushare.report`. Listed in the
plugin's manifest (``components.gpushare.plugin``).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from components.gpushare.report import attempt_measurement, read, sharing_view
from components.runtime.contract.panels import Panel, PanelData

WINDOW_SECONDS = 600  # the cluster timeline shows the last 10 minutes
MAX_BARS = 4000  # slices drawn on the cluster timeline (the newest)
MAX_JOB_BARS = 1000
MAX_TRACES = 40  # jobs drawn as their own trace; the rest share one "other jobs" trace
FOREIGN = "another team's job"
MIB = 2**20


def device_label(device: dict[str, Any]) -> str:
    return f"{device['node']}:gpu{device['index']}"


def bytes_text(value: int | float | None) -> str:
    if value is None:
        return "—"
    if value >= 2**30:
        return f"{value / 2**30:.2f} GiB"
    return f"{value / MIB:.1f} MiB"


def ms_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g} ms"


def gantt(slices: list[dict[str, Any]], labels: dict[int, str], origin: float | None = None) -> dict[str, Any]:
    """Horizontal bars, one trace per job: ``base`` is the slice's start and ``x`` its length, both in ms of
    Unix time, so plotly draws the x axis as dates; ``y`` is the device."""
    traces: dict[str, dict[str, Any]] = {}
    for piece in slices:
        if piece["foreign"]:
            key, name = "foreign", FOREIGN
        else:
            key, name = str(piece["job_id"]), piece["job_name"] or str(piece["job_id"])[:8]
        if key not in traces and key != "foreign" and len(traces) >= MAX_TRACES:
            key, name = "other", "other jobs"
        trace = traces.setdefault(key, {
            "type": "bar", "orientation": "h", "name": name, "x": [], "y": [], "base": [],
            "hovertemplate": "%{y}: %{x:.0f} ms<extra>" + name.replace("<", "&lt;") + "</extra>"})
        start_ms = piece["start"] * 1000.0
        trace["base"].append(round(start_ms, 1))
        trace["x"].append(round(max(0.0, piece["end"] - piece["start"]) * 1000.0, 3))
        trace["y"].append(labels.get(piece["device"], str(piece["device"])))
    layout: dict[str, Any] = {
        "barmode": "overlay", "showlegend": True, "height": 140 + 40 * max(1, len(set(labels.values()))),
        "xaxis": {"type": "date", "title": {"text": "time (UTC)"}},
        "yaxis": {"type": "category", "title": {"text": "device"}},
        "margin": {"l": 90, "r": 10, "t": 10, "b": 40},
    }
    if origin is not None:
        # From the first slice drawn (not before ``origin``) to now: a few seconds of sharing stay visible
        # instead of a sliver at the right edge of an empty ten minutes.
        first = min((piece["start"] for piece in slices), default=origin)
        layout["xaxis"]["range"] = [max(origin, first - 1.0) * 1000.0, time.time() * 1000.0]
    return {"data": list(traces.values()), "layout": layout}


class GpuShareTimelinePanel(Panel):
    """Cluster page: a Gantt chart of the last ten minutes of every shared device, and a table per device."""

    slug: ClassVar[str] = "gpushare-timeline"
    title: ClassVar[str] = "GPU sharing: who ran when"
    placement: ClassVar[str] = "cluster"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        since = time.time() - WINDOW_SECONDS
        sharing = sharing_view(read(data, since=since))
        devices, slices = sharing.get("devices", []), sharing.get("slices", [])[-MAX_BARS:]
        if not devices and not slices:
            return None
        labels = {device["id"]: device_label(device) for device in devices}
        rows = []
        for device in devices:
            latency = device.get("switch_latency_ms") or {}
            lanes = "; ".join(
                f"lane {lane['id']}: {bytes_text(lane['size'])}, {lane['jobs']} job{'s' if lane['jobs'] != 1 else ''}"
                for lane in device.get("lanes", [])) or "—"
            utilization = device.get("utilization")
            rows.append([labels[device["id"]], device.get("policy") or "—", device.get("switches"),
                         ms_text(latency.get("p50")), ms_text(latency.get("p99")),
                         "—" if utilization is None else f"{utilization * 100:.0f}%",
                         len(device.get("jobs", [])), lanes])
        return {
            "figure": gantt(slices, labels, origin=since),
            "table": {"columns": ["device", "policy", "switches", "switch p50", "switch p99", "utilization",
                                  "jobs", "memory by lane"], "rows": rows},
        }


class GpuShareJobPanel(Panel):
    """Job page: the job's share of a shared GPU, its lane and measured memory, and when it ran."""

    slug: ClassVar[str] = "gpushare-job"
    title: ClassVar[str] = "GPU sharing"

    def applies(self, job: dict[str, Any]) -> bool:
        return bool(job.get("share"))

    def render(self, data: PanelData) -> dict[str, Any] | None:
        job = data.job or {}
        share = job.get("share")
        if not share:
            return None
        job_id = str(job.get("id"))
        found = read(data, job_id=job_id)
        sharing = sharing_view(found, job_id=job_id)
        measured = attempt_measurement(found)
        slices = sharing.get("slices", [])[-MAX_JOB_BARS:]
        on_device = next((device for device in sharing.get("devices", [])
                          if measured and device["id"] == measured.get("device")), {})
        rows = [["share", f"{share['gpus']:g} GPU"], ["GPU memory reserved", bytes_text(share.get("gpu_memory"))],
                ["device", share.get("device")], ["policy", measured.get("policy") or share.get("policy")],
                ["lane", "—" if measured.get("lane") is None else measured["lane"]],
                ["persistent memory (measured)", bytes_text(measured.get("persistent"))],
                ["ephemeral memory (measured)", bytes_text(measured.get("ephemeral"))],
                ["switches on the device", "—" if on_device.get("switches") is None else on_device["switches"]],
                ["time slices", len(slices)]]
        if slices:
            ran = sum(max(0.0, piece["end"] - piece["start"]) for piece in slices)
            rows.append(["time on the device", f"{ran:.2f} s of {slices[-1]['end'] - slices[0]['start']:.2f} s"])
        content: dict[str, Any] = {"table": {"columns": [], "rows": rows}}
        if slices:
            labels = {device["id"]: device_label(device) for device in sharing.get("devices", [])}
            content["figure"] = gantt(slices, labels)
        return content
