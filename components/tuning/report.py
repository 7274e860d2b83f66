"""What a tune attempt reports through the generic report channel, and how the trials are read back.

The engine publishes its table of trials as the tune attempt's ``tuning`` report (``ctx.report``); the control
plane checks it here (light: the control plane imports this module) and stores it on the attempt. The job's
``trials`` route (:func:`trials`) and panels read it back through ``PanelData``, merged with the trial jobs'
own states.
"""

from __future__ import annotations

import json
from typing import Any

from components.runtime.contract.collections import Progress
from components.runtime.contract.plugins import ReportError, ReportSchema
from components.runtime.shared.units import finite_number

MAX_TRIALS = 10_000
MAX_RUNGS = 1_000
MAX_BYTES = 4 * 2**20
STATUSES = {"running", "paused", "stopped", "completed", "failed"}
TRIAL_KEYS = {"number", "job", "params", "status", "iterations", "best", "last", "share", "reason", "shares",
              "values", "jobs", "exploits"}
MAX_HISTORY = 100  # a trial's earlier jobs and PBT exploit steps, each


def _finite(value: Any) -> bool:
    return finite_number(value)


class TuningReport(ReportSchema):
    """``{"metric", "mode", "budget", "trials": [...], "best": {...} | null, "rungs": [...]}`` per tune attempt."""

    def attempt(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        errors: dict[str, str] = {}
        try:
            size = len(json.dumps(payload, allow_nan=False))
        except (TypeError, ValueError):
            raise ReportError({"": "must hold finite JSON values only"}) from None
        if size > MAX_BYTES:
            errors[""] = f"at most {MAX_BYTES} bytes as JSON"
        if not isinstance(payload.get("metric"), str) or len(payload["metric"]) > 100:
            errors["metric"] = "must be a metric name"
        if payload.get("mode") not in {"min", "max"}:
            errors["mode"] = "must be min or max"
        if not _finite(payload.get("budget")) or payload["budget"] < 0:
            errors["budget"] = "must be the GPUs of the tune job"
        trials = payload.get("trials")
        if not isinstance(trials, list) or len(trials) > MAX_TRIALS:
            errors["trials"] = f"must be a list of at most {MAX_TRIALS} trials"
            trials = []
        for index, trial in enumerate(trials):
            where = f"trials.{index}"
            if not isinstance(trial, dict) or set(trial) - TRIAL_KEYS:
                errors[where] = f"must be an object with {', '.join(sorted(TRIAL_KEYS))}"
                continue
            if not isinstance(trial.get("number"), int) or isinstance(trial.get("number"), bool):
                errors[f"{where}.number"] = "must be an integer"
            if not isinstance(trial.get("job"), str) or len(trial["job"]) > 64:
                errors[f"{where}.job"] = "must be a job id"
            if trial.get("status") not in STATUSES:
                errors[f"{where}.status"] = f"must be one of {', '.join(sorted(STATUSES))}"
            if not isinstance(trial.get("params"), dict):
                errors[f"{where}.params"] = "must be an object"
            for key in ("best", "last"):
                if trial.get(key) is not None and not _finite(trial[key]):
                    errors[f"{where}.{key}"] = "must be a number or null"
            if not _finite(trial.get("share", 0)) or trial.get("share", 0) < 0:
                errors[f"{where}.share"] = "must be a number of GPUs"
            jobs = trial.get("jobs", [])
            if not isinstance(jobs, list) or len(jobs) > MAX_HISTORY or not all(
                    isinstance(job, str) and len(job) <= 64 for job in jobs):
                errors[f"{where}.jobs"] = f"must be a list of at most {MAX_HISTORY} job ids"
            exploits = trial.get("exploits", [])
            if not isinstance(exploits, list) or len(exploits) > MAX_HISTORY or not all(
                    isinstance(step, dict) and isinstance(step.get("params"), dict) for step in exploits):
                errors[f"{where}.exploits"] = (f"must be a list of at most {MAX_HISTORY} "
                                               "{iteration, from, params, job} steps")
        if payload.get("best") is not None and not isinstance(payload["best"], dict):
            errors["best"] = "must be an object or null"
        rungs = payload.get("rungs", [])
        if not isinstance(rungs, list) or len(rungs) > MAX_RUNGS:
            errors["rungs"] = f"must be a list of at most {MAX_RUNGS} entries"
        if errors:
            raise ReportError(errors)
        return payload


def trials(data) -> dict[str, Any]:
    """``GET /api/v1/jobs/{id}/trials/``: the tune job's trials as its latest attempt reported them, each with
    its trial job's current state, and the best trial so far. ``data`` is the viewer's ``PanelData`` of the job."""
    found = data.reports("tuning", job_id=data.job["id"]) if data.job else {"attempts": []}
    latest = max((entry for entry in found.get("attempts", []) if isinstance(entry.get("payload"), dict)),
                 key=lambda entry: entry.get("time") or 0, default=None)
    if latest is None:
        return {"metric": None, "mode": None, "budget": None, "best": None, "rungs": [], "trials": []}
    payload = latest["payload"]
    states = {child["id"]: child for child in data.children()}
    rows = []
    for trial in payload.get("trials", []):
        child = states.get(trial.get("job"), {})
        rows.append({**{key: trial.get(key) for key in ("number", "job", "params", "status", "iterations", "best",
                                                        "last", "share", "reason", "shares", "values")},
                     "jobs": trial.get("jobs", []), "exploits": trial.get("exploits", []),
                     "state": child.get("state"), "name": child.get("name")})
    return {"metric": payload.get("metric"), "mode": payload.get("mode"), "budget": payload.get("budget"),
            "best": payload.get("best"), "rungs": payload.get("rungs", []), "trials": rows,
            "platform": payload.get("platform")}


trials.schema = {  # type: ignore[attr-defined]  (the job_routes seam's answer schema)
    "type": "object",
    "description": "The sweep's trials as its latest attempt reported them, each with its trial job's state, and "
                   "the best so far; all null and empty before the first report.",
    "properties": {
        "metric": {"type": ["string", "null"]},
        "mode": {"type": ["string", "null"]},
        "budget": {},
        "best": {},
        "rungs": {"type": "array", "items": {}},
        "platform": {"description": "With warm trial runners: what running a trial cost outside its own code "
                                    "(per_trial_s, its median and max), the runners, the batched calls."},
        "trials": {"type": "array", "items": {"type": "object", "properties": {
            "number": {}, "job": {"type": ["string", "null"]}, "params": {}, "status": {},
            "state": {"type": ["string", "null"]}, "name": {"type": ["string", "null"]},
            "jobs": {"type": "array"}, "exploits": {"type": "array"}}}},
    },
    "required": ["metric", "mode", "budget", "best", "rungs", "trials"],
}


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_rows(answer: Any) -> tuple[str, list[tuple[str, str]]]:
    """One line per trial for ``strata submit --wait``: status, iterations, best value, share, parameters."""
    rows = []
    for trial in (answer or {}).get("trials", []):
        best = trial.get("best")
        params = " ".join(f"{name}={_short(value)}" for name, value in sorted((trial.get("params") or {}).items()))
        rows.append((str(trial.get("number")),
                     f"trial {trial.get('number'):>3}  {trial.get('status', ''):9} {trial.get('iterations', 0):>4}  "
                     f"{'-' if best is None else f'{best:.4g}':>8}  {trial.get('share', 0):>5g}  {params}"))
    return f"{'trial':9}  {'status':9} {'its':>4}  {'best':>8}  {'GPUs':>5}  parameters", rows


trials.progress = Progress(kinds=("tune",), rows=trial_rows)  # type: ignore[attr-defined]  (the live table)
