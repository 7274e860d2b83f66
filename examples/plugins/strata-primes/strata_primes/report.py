"""The light schema of what the ``primes`` node service reports with each heartbeat."""

from __future__ import annotations

from typing import Any

from components.runtime.contract.plugins import ReportError, ReportSchema
from components.runtime.shared.units import finite_number

FIELDS = {"disk_free": int, "disk_total": int, "load1": float}


class ScratchDiskReport(ReportSchema):
    def node(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        errors = {name: "unknown field" for name in payload if name not in FIELDS}
        clean: dict[str, Any] = {}
        for name, kind in FIELDS.items():
            value = payload.get(name)
            if not finite_number(value) or value < 0:
                errors[name] = "required: a finite number >= 0"
            elif kind is int and int(value) != value:
                errors[name] = "must be a whole number"
            else:
                clean[name] = kind(value)
        if not errors and clean["disk_free"] > clean["disk_total"]:
            errors["disk_free"] = "must not exceed disk_total"
        if errors:
            raise ReportError(errors)
        return clean
