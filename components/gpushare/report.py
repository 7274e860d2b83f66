"""The light schema of gpushare's report, and how its panels read it back.

Each device's sharing service measures what it runs; the node sends it with every heartbeat as
``reports: {"gpushare": {"devices": [entry, ...]}}`` (one entry per device service that answered). An entry is::

    {"index", "policy", "switches", "switch_latency_ms": {"p50", "p99"}, "utilization" (0..1), "budget" (bytes),
     "lanes": [{"id", "size", "attempts"}], "jobs": [{"attempt", "state", "persistent", "ephemeral", "lane",
     "steps"}], "slices": [{"attempt", "start", "end"}]}

:class:`GpuShareReport` checks it (every refused field named ``devices.<n>.<field>``) and splits it for the
control plane's generic storage (:meth:`GpuShareReport.parts`): each device's state (lanes with how many jobs
share them, no attempt ids), each attempt's measurement (its device, lane, state, persistent and ephemeral
memory, steps; the measured memory is what the scheduler reserves for the job's next attempt) and the slices
(who ran when) as the plugin's time series.

:func:`read` reads it back through ``PanelData.reports("gpushare", ...)`` and :func:`sharing_view` and
:func:`attempt_measurement` shape it as the panels draw it.
"""

from __future__ import annotations

import re
from typing import Any

from components.runtime.contract.plugins import ReportError, ReportParts, ReportSchema
from components.runtime.shared.units import finite_number

PLUGIN = "gpushare"
MAX_DEVICES = 64
# Per device and heartbeat: the service sends at most SLICE_LIMIT (2000) slices, and lanes and jobs are bounded
# by its admission; the limits here match what the control plane stores.
MAX_ITEMS = {"lanes": 256, "jobs": 256, "slices": 2000}
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _number(value: Any, low: float, high: float | None = None, whole: bool = False) -> bool:
    if not finite_number(value):
        return False
    if whole and int(value) != value:
        return False
    return value >= low and (high is None or value <= high)


def _attempt(value: Any) -> bool:
    return isinstance(value, str) and bool(UUID.match(value.lower()))


def _check_lane(lane: dict, where: str, errors: dict[str, str]) -> None:
    if not _number(lane.get("id"), 0, whole=True):
        errors[f"{where}.id"] = "required: a whole number >= 0"
    if not _number(lane.get("size"), 0, whole=True):
        errors[f"{where}.size"] = "required: a whole number of bytes >= 0"
    attempts = lane.get("attempts", [])
    if not isinstance(attempts, list) or len(attempts) > MAX_ITEMS["jobs"] or not all(map(_attempt, attempts)):
        errors[f"{where}.attempts"] = f"must be a list of at most {MAX_ITEMS['jobs']} attempt ids"


def _check_job(job: dict, where: str, errors: dict[str, str]) -> None:
    if not _attempt(job.get("attempt")):
        errors[f"{where}.attempt"] = "required: an attempt id"
    if not isinstance(job.get("state"), str) or not 0 < len(job["state"]) <= 32:
        errors[f"{where}.state"] = "required: a state name"
    for name in ("persistent", "ephemeral", "steps"):
        if not _number(job.get(name), 0, whole=True):
            errors[f"{where}.{name}"] = "required: a whole number >= 0"
    if job.get("lane") is not None and not _number(job["lane"], 0, whole=True):
        errors[f"{where}.lane"] = "must be a whole number >= 0 or null"


def _check_slice(piece: dict, where: str, errors: dict[str, str]) -> None:
    if not _attempt(piece.get("attempt")):
        errors[f"{where}.attempt"] = "required: an attempt id"
    if not _number(piece.get("start"), 0):
        errors[f"{where}.start"] = "required: unix seconds"
    elif not _number(piece.get("end"), piece["start"]):
        errors[f"{where}.end"] = "required: unix seconds, not before start"


CHECKS = {"lanes": _check_lane, "jobs": _check_job, "slices": _check_slice}


class GpuShareReport(ReportSchema):
    def node(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("devices"), list):
            raise ReportError({"devices": "required: a list of device entries"})
        devices = payload["devices"]
        errors: dict[str, str] = {}
        if len(devices) > MAX_DEVICES:
            errors["devices"] = f"at most {MAX_DEVICES} devices"
        clean = []
        for number, entry in enumerate(devices[:MAX_DEVICES]):
            where = f"devices.{number}"
            if not isinstance(entry, dict):
                errors[where] = "must be an object"
                continue
            if not _number(entry.get("index"), 0, 1024, whole=True):
                errors[f"{where}.index"] = "required: a whole number 0..1024"
            if not isinstance(entry.get("policy"), str) or not 0 < len(entry["policy"]) <= 32:
                errors[f"{where}.policy"] = "required: a policy name"
            if not _number(entry.get("switches", 0), 0, whole=True):
                errors[f"{where}.switches"] = "must be a whole number >= 0"
            latency = entry.get("switch_latency_ms", {})
            if not isinstance(latency, dict) or not all(_number(latency.get(key, 0), 0) for key in ("p50", "p99")):
                errors[f"{where}.switch_latency_ms"] = "must be {p50, p99}: milliseconds >= 0"
            if "utilization" in entry and not _number(entry["utilization"], 0, 1):
                errors[f"{where}.utilization"] = "must be within 0..1"
            if "budget" in entry and not _number(entry["budget"], 0, whole=True):
                errors[f"{where}.budget"] = "must be a whole number of bytes >= 0"
            for name, limit in MAX_ITEMS.items():
                items = entry.get(name, [])
                if not isinstance(items, list) or len(items) > limit or not all(isinstance(i, dict) for i in items):
                    errors[f"{where}.{name}"] = f"must be a list of at most {limit} objects"
                    continue
                for position, item in enumerate(items):
                    CHECKS[name](item, f"{where}.{name}.{position}", errors)
                    if len(errors) > 50:  # enough to say what is wrong
                        raise ReportError(errors)
            if not errors:
                latency = entry.get("switch_latency_ms") or {}
                clean.append({
                    "index": int(entry["index"]), "policy": entry["policy"], "switches": int(entry.get("switches", 0)),
                    "switch_latency_ms": {"p50": float(latency.get("p50", 0)), "p99": float(latency.get("p99", 0))},
                    "utilization": float(entry.get("utilization", 0.0)), "budget": int(entry.get("budget", 0)),
                    "lanes": [{"id": int(lane["id"]), "size": int(lane["size"]),
                               "attempts": [a.lower() for a in lane.get("attempts", [])]} for lane in entry.get("lanes", [])],
                    "jobs": [{"attempt": job["attempt"].lower(), "state": job["state"],
                              "persistent": int(job["persistent"]), "ephemeral": int(job["ephemeral"]),
                              "lane": None if job.get("lane") is None else int(job["lane"]), "steps": int(job["steps"])}
                             for job in entry.get("jobs", [])],
                    "slices": [{"attempt": piece["attempt"].lower(), "start": float(piece["start"]),
                                "end": float(piece["end"])} for piece in entry.get("slices", [])],
                })
        if errors:
            raise ReportError(errors)
        return {"devices": clean}

    def parts(self, payload: dict[str, Any]) -> ReportParts:
        parts = ReportParts(node={"devices": [entry["index"] for entry in payload["devices"]]})
        for entry in payload["devices"]:
            index = entry["index"]
            if index in parts.devices:
                continue
            parts.devices[index] = {
                "policy": entry["policy"], "switches": entry["switches"],
                "switch_latency_ms": entry["switch_latency_ms"], "utilization": entry["utilization"],
                "budget": entry["budget"],
                # How many jobs share each lane: attempt ids stay on the attempts' own reports.
                "lanes": [{"id": lane["id"], "size": lane["size"], "jobs": len(lane["attempts"])}
                          for lane in entry["lanes"]]}
            for job in entry["jobs"]:
                parts.attempts.append({
                    "attempt": job["attempt"], "device": index, "memory": job["persistent"] + job["ephemeral"],
                    "payload": {"policy": entry["policy"], **{key: job[key] for key in
                                                               ("state", "lane", "persistent", "ephemeral", "steps")}}})
            parts.series.extend({"device": index, "attempt": piece["attempt"], "start": piece["start"],
                                 "end": piece["end"], "data": {}} for piece in entry["slices"])
        return parts

    def metrics(self, report: Any):
        """The plugin's node metrics (components.gpushare.metrics)."""
        from components.gpushare.metrics import metrics

        return metrics(self.node(report))


def read(data: Any, since: float | None = None, job_id: str | None = None) -> dict[str, Any]:
    """gpushare's reports through the generic channel, scoped to the viewer by the dashboard."""
    return data.reports(PLUGIN, since=since, job_id=job_id)


def sharing_view(found: dict[str, Any], job_id: str | None = None) -> dict[str, Any]:
    """GPU sharing as the panels draw it, from what :func:`read` returned.

    Returns ``{"devices": [...], "slices": [...]}``. A device (one whose service reported) is ``id``, ``node``,
    ``index``, ``kind``, ``policy``, ``switches``, ``switch_latency_ms`` ({p50, p99}), ``utilization``,
    ``budget``, ``lanes`` ({id, size, jobs}) and ``jobs`` (``state``, ``persistent``, ``ephemeral``, ``lane``,
    ``steps``, ``foreign`` and, for jobs the viewer may see, ``attempt``, ``job_id``, ``job_name``). A slice is
    ``device``, ``start``, ``end``, ``foreign``, ``attempt``, ``job_id``, ``job_name``. With ``job_id``: that
    job's slices and the devices it ran on.
    """
    slices = [{"device": row.get("device"), "start": row["start"], "end": row["end"], **_who(row)}
              for row in found.get("series", []) if row.get("device") is not None]
    current = {}
    for attempt in found.get("attempts", []):
        if attempt.get("current") and attempt.get("device") is not None:
            payload = attempt.get("payload") or {}
            current.setdefault(attempt["device"], []).append({
                **_who(attempt), **{key: payload.get(key) for key in ("state", "persistent", "ephemeral", "lane",
                                                                      "steps")}})
    devices = []
    ran_on = {piece["device"] for piece in slices} | {a.get("device") for a in found.get("attempts", [])}
    for device in found.get("devices", []):
        if job_id is not None and device["id"] not in ran_on:
            continue
        payload = device.get("payload") or {}
        devices.append({
            "id": device["id"], "node": device["node"], "index": device["index"], "kind": device.get("kind"),
            "policy": payload.get("policy"), "switches": payload.get("switches"),
            "switch_latency_ms": payload.get("switch_latency_ms") or {}, "utilization": payload.get("utilization"),
            "budget": payload.get("budget"), "lanes": list(payload.get("lanes") or []),
            "jobs": current.get(device["id"], [])})
    return {"devices": devices, "slices": slices}


def attempt_measurement(found: dict[str, Any]) -> dict[str, Any]:
    """What the sharing service last measured about the latest measured attempt in what :func:`read` returned
    for one job (``lane``, ``state``, ``persistent``, ``ephemeral``, ``steps``, ``policy``, ``device``), or {}."""
    attempts = [attempt for attempt in found.get("attempts", []) if not attempt.get("foreign")]
    if not attempts:
        return {}
    latest = max(attempts, key=lambda attempt: (attempt.get("number") or 0, attempt.get("time") or 0))
    return {**(latest.get("payload") or {}), "device": latest.get("device")}


def _who(row: dict[str, Any]) -> dict[str, Any]:
    if row.get("foreign"):
        return {"attempt": None, "job_id": None, "job_name": None, "foreign": True}
    return {"attempt": row.get("attempt"), "job_id": row.get("job_id"), "job_name": row.get("job_name"),
            "foreign": False}
