"""``GET /api/v1/jobs/{id}/compression/``: a compress-embeddings job's latest report (light: no torch here)."""

from __future__ import annotations

from typing import Any

from components.embeddings.panels import latest_report


def compression(data: Any) -> dict[str, Any]:
    """The job's compression: phase, ratio, bytes, AUC and log loss before and after, and one row per field.
    ``{"phase": null, "fields": []}`` before the first report."""
    report = latest_report(data)
    if report is None:
        return {"phase": None, "fields": []}
    return {"job": data.job["id"], "state": data.job.get("state"), **report}


compression.schema = {  # type: ignore[attr-defined]  (the job_routes seam's answer schema)
    "type": "object",
    "description": "The latest compression report (phase, ratio, bytes, quality before and after, fields), with "
                   "the job's id and state; phase null and no fields before the first report.",
    "properties": {
        "job": {"type": "string"},
        "state": {"type": ["string", "null"]},
        "phase": {"type": ["string", "null"]},
        "fields": {"type": "array", "items": {}},
    },
    "required": ["phase", "fields"],
    "additionalProperties": True,
}

__all__ = ["compression"]
