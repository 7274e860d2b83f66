"""The light schema of the datacache node report, and how the panels and the API read it back.

A node reports ``reports: {"datacache": {"time", "bytes", "budget", "entries": [...], "hits", "misses", "evictions",
"corrupt", "uncached"}}``; each entry is ``{"key", "dataset", "pipeline", "part", "bytes", "hits", "last_used",
"build_seconds"}``. The payload is kept as the node's latest report and, as a time series row, the counters (for
the hit-rate panel).
"""

from __future__ import annotations

from typing import Any

from components.runtime.contract.plugins import ReportError, ReportParts, ReportSchema
from components.runtime.shared.units import finite_number

PLUGIN = "datacache"
COUNTERS = ("bytes", "budget", "hits", "misses", "evictions", "corrupt", "uncached")
MAX_ENTRIES = 200
ENTRY_STRINGS = {"key": 64, "dataset": 64, "pipeline": 64, "part": 64}
ENTRY_NUMBERS = ("bytes", "hits", "last_used", "build_seconds")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return finite_number(value) and value >= 0


class DataCacheReport(ReportSchema):
    def node(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        errors: dict[str, str] = {}
        for name in COUNTERS:
            if not _count(payload.get(name)):
                errors[name] = "required: a whole number >= 0"
        entries = payload.get("entries", [])
        if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
            errors["entries"] = f"must be a list of at most {MAX_ENTRIES} entries"
            entries = []
        clean = []
        for index, entry in enumerate(entries):
            where = f"entries.{index}"
            if not isinstance(entry, dict):
                errors[where] = "must be an object"
                continue
            for name, limit in ENTRY_STRINGS.items():
                if not isinstance(entry.get(name), str) or len(entry[name]) > limit:
                    errors[f"{where}.{name}"] = f"required: a string of at most {limit} characters"
            for name in ENTRY_NUMBERS:
                if not _number(entry.get(name)):
                    errors[f"{where}.{name}"] = "required: a number >= 0"
            clean.append({name: entry.get(name) for name in (*ENTRY_STRINGS, *ENTRY_NUMBERS)})
        if not _number(payload.get("time")):
            errors["time"] = "required: when the node read its cache (unix seconds)"
        if errors:
            raise ReportError(errors)
        return {**{name: int(payload[name]) for name in COUNTERS}, "time": float(payload["time"]), "entries": clean}

    def parts(self, payload: dict[str, Any]) -> ReportParts:
        now = payload["time"]  # the node's reading time: a retried heartbeat stores the row once
        row = {"start": now, "end": now, "device": None, "attempt": None,
               "data": {name: payload[name] for name in ("bytes", "hits", "misses", "evictions", "corrupt")}}
        return ReportParts(node=payload, series=[row])

    def metrics(self, report: Any):
        """The plugin's node metrics (components.datacache.metrics)."""
        from components.datacache.metrics import metrics

        return metrics(self.node(report))


def hit_rate(stats: dict[str, Any]) -> float | None:
    lookups = int(stats.get("hits", 0)) + int(stats.get("misses", 0))
    return int(stats.get("hits", 0)) / lookups if lookups else None
