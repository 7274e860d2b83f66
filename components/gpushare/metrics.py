"""gpushare's node metrics (its report schema's ``metrics``; light): its latest report as Prometheus samples.

The report (``{"devices": [entry]}``, :mod:`components.gpushare.report`) is checked by the plugin's own schema
first, so a malformed one raises and costs only these samples. Per device (label ``device``, its index, and
``policy``): context switches, switch latency p50/p99, utilization, memory budget, lanes and the bytes they
hold, and jobs by state with their measured memory. No attempt id is a label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from components.runtime.contract.plugins import Sample


def metrics(checked: dict[str, Any]) -> Iterator[Sample]:
    """The samples of a report :meth:`GpuShareReport.node` checked (``GpuShareReport.metrics`` calls this)."""
    devices = checked["devices"]
    for entry in devices:
        device = {"device": str(entry["index"]), "policy": entry["policy"]}
        yield Sample("strata_gpushare_switches_total", entry["switches"], kind="counter", labels=device,
                     help="Switches between jobs sharing the device (since its service started).")
        for quantile, key in (("0.5", "p50"), ("0.99", "p99")):
            yield Sample("strata_gpushare_switch_latency_seconds", entry["switch_latency_ms"][key] / 1000.0,
                         labels={**device, "quantile": quantile}, help="Latency of a switch between jobs.")
        yield Sample("strata_gpushare_utilization_ratio", entry["utilization"], labels=device,
                     help="Share of the time the device's service ran a job since the previous report (0..1).")
        yield Sample("strata_gpushare_memory_budget_bytes", entry["budget"], labels=device,
                     help="Device memory the sharing service may hand out.")
        yield Sample("strata_gpushare_lanes", len(entry["lanes"]), labels=device,
                     help="Memory lanes open on the device.")
        yield Sample("strata_gpushare_lane_bytes", sum(lane["size"] for lane in entry["lanes"]), labels=device,
                     help="Device memory held by the lanes.")
        states = Counter(job["state"] for job in entry["jobs"])
        for state, count in sorted(states.items()):
            yield Sample("strata_gpushare_jobs", count, labels={**device, "state": state},
                         help="Jobs the device's service knows, by state.")
        for part in ("persistent", "ephemeral"):
            yield Sample("strata_gpushare_job_memory_bytes", sum(job[part] for job in entry["jobs"]),
                         labels={**device, "memory": part},
                         help="Memory the device's jobs were measured to use, persistent and ephemeral.")
