"""The light schema of what a swarm reports: rank 0's attempt report (``ctx.report("decentral", payload)``)::

    {"peer": str, "p2p": str, "maddrs": [str], "epoch": int, "step": int,
     "peers": [{"name", "p2p", "volunteer", "step", "samples", "samples_per_s", "loss", "test_loss",
                "rounds_ok", "rounds_failed"}],                                  # at most 256
     "rounds": [{...one averaging round: round, ok, members, size, group, fingerprint, duration_s, error,
                 peers, deadlines, at}],                                         # at most 64
     "rejections": [{"peer", "name", "role", "problem", "at"}],                  # at most 64
     "deadlines": {"lead_s", "allreduce_timeout_s", "request_timeout_s"},
     "rounds_ok": int, "rounds_failed": int,
     "swap": {...the layer-swapping timeline summary}}                           # optional

Numbers must be finite or null; strings are cut to 256 characters; lists to their limits.
"""

from __future__ import annotations

from typing import Any

from components.runtime.contract.plugins import ReportError, ReportSchema
from components.runtime.shared.units import finite_number

LIMITS = {"peers": 256, "rounds": 64, "rejections": 64, "maddrs": 16}
MAX_DEPTH = 6


def _clean(value: Any, path: str, errors: dict[str, str], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        errors[path] = "nested too deeply"
        return None
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        if not finite_number(value):
            errors[path] = "must be a finite number"
            return None
        return value
    if isinstance(value, str):
        return value[:256]
    if isinstance(value, list):
        return [_clean(item, f"{path}[{index}]", errors, depth + 1) for index, item in enumerate(value[:256])]
    if isinstance(value, dict):
        if len(value) > 64:
            errors[path] = "has more than 64 keys"
            return None
        return {str(key)[:64]: _clean(item, f"{path}.{key}", errors, depth + 1) for key, item in value.items()}
    errors[path] = f"unsupported value of type {type(value).__name__}"
    return None


class SwarmReport(ReportSchema):
    def attempt(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        errors: dict[str, str] = {}
        for key in ("peer", "epoch", "step"):
            if key not in payload:
                errors[key] = "is required"
        for key, limit in LIMITS.items():
            value = payload.get(key, [])
            if not isinstance(value, list):
                errors[key] = "must be a list"
            elif len(value) > limit:
                errors[key] = f"has more than {limit} entries"
        cleaned = _clean(payload, "", errors)
        if errors:
            raise ReportError({key.lstrip("."): message for key, message in errors.items()})
        return cleaned
