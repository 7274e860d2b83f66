"""The light schema of gpushare's report: what each device's sharing service measured, sent with every
heartbeat as ``reports: {"gpushare": {"devices": [entry, ...]}}`` (one entry per device service that answered).

An entry is ``index``, ``policy``, ``switches``, ``switch_latency_ms`` ({p50, p99}), ``utilization`` (0..1),
``budget`` (bytes), ``lanes``, ``jobs`` and ``slices`` (lists of objects). The schema checks the shape and the
ranges and keeps the payload as it is; the control plane stores it under the node's reports.
"""

from __future__ import annotations

import math
from typing import Any

from components.runtime.plugins import ReportError, ReportSchema

MAX_DEVICES = 64
# Per device and heartbeat: the service sends at most SLICE_LIMIT (2000) slices, and lanes and jobs are bounded
# by its admission; the limits here match what the control plane stores.
MAX_ITEMS = {"lanes": 256, "jobs": 256, "slices": 2000}


def _number(value: Any, low: float, high: float | None = None, whole: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if whole and int(value) != value:
        return False
    return value >= low and (high is None or value <= high)


class GpuShareReport(ReportSchema):
    def node(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("devices"), list):
            raise ReportError({"devices": "required: a list of device entries"})
        devices = payload["devices"]
        errors: dict[str, str] = {}
        if len(devices) > MAX_DEVICES:
            errors["devices"] = f"at most {MAX_DEVICES} devices"
        for number, entry in enumerate(devices[:MAX_DEVICES]):
            where = f"devices.{number}"
            if not isinstance(entry, dict):
                errors[where] = "must be an object"
                continue
            if not _number(entry.get("index"), 0, 1024, whole=True):
                errors[f"{where}.index"] = "required: a whole number 0..1024"
            if not isinstance(entry.get("policy"), str) or len(entry["policy"]) > 32:
                errors[f"{where}.policy"] = "required: a policy name"
            if not _number(entry.get("switches", 0), 0, whole=True):
                errors[f"{where}.switches"] = "must be a whole number >= 0"
            if "utilization" in entry and not _number(entry["utilization"], 0, 1):
                errors[f"{where}.utilization"] = "must be within 0..1"
            if "budget" in entry and not _number(entry["budget"], 0, whole=True):
                errors[f"{where}.budget"] = "must be a whole number of bytes >= 0"
            for name, limit in MAX_ITEMS.items():
                items = entry.get(name, [])
                if not isinstance(items, list) or len(items) > limit or not all(isinstance(i, dict) for i in items):
                    errors[f"{where}.{name}"] = f"must be a list of at most {limit} objects"
        if errors:
            raise ReportError(errors)
        return {"devices": devices}
