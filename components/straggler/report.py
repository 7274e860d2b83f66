"""The light schema of what the straggler plugin reports: each node's availability forecast (heartbeats) and a
distributed training attempt's straggler picture (attempt reports).

**Node** (``reports: {"straggler": payload}`` from :class:`~components.straggler.availability.AvailabilityService`)::

    {"time": unix s, "predicted": {resource: 0..1}, "std": {resource: 0..1}, "current": {resource: 0..1},
     "accuracy": {"mae": {resource: float | null}, "naive_mae": {...}, "n": int},
     "horizon_s": float, "samples": int, "model": "naive" | "ridge" | "gbr",
     "gpu_source": "nvml" | "cpu" | "none", "load": float}

Resources are ``cpu``, ``memory``, ``gpu``, ``network`` (a subset is fine; ``predicted``, ``std`` and
``current`` name the same ones). ``time``, ``accuracy.naive_mae``, ``model``, ``gpu_source`` and ``load`` are
optional. Kept as the node's latest report (the scheduler's SAS hook reads it) and, as a time series row,
the current and predicted availability (for a predicted-against-actual panel).

**Attempt** (``ctx.report("straggler", payload)`` from the distributed runtime)::

    {"strategy": str, "world_size": int, "step": int,
     "ranks": [{"rank": int, "node": str, "step_ms": float, "keep": 0..1}],          # at most 1024
     "heatmap": {"steps": [int], "ms": [[float | null per rank]]},                    # at most 256 steps
     "stragglers": {"predicted": [[step, rank]], "actual": [[step, rank]],           # at most 512 pairs each
                    "precision": 0..1 | null, "recall": 0..1 | null},
     "dropped_samples": int, "bytes_sent": int, "bytes_skipped": int, "bytes_full": int,
     "phases": {name: float}}                                                         # optional, at most 32

``strategy``, ``world_size`` and ``step`` are required; the rest default to empty (the normalized payload always
has every key). Numbers must be finite (NaN and infinities are refused); an unknown key, at any level, is an
error naming it.
"""

from __future__ import annotations

from typing import Any

from components.runtime.contract.plugins import ReportError, ReportParts, ReportSchema
from components.runtime.shared.units import finite_number

PLUGIN = "straggler"
RESOURCES = ("cpu", "memory", "gpu", "network")
MODELS = ("naive", "ridge", "gbr")
GPU_SOURCES = ("nvml", "cpu", "none")
MAX_RANKS = 1024
MAX_STEPS = 256
MAX_PAIRS = 512
MAX_PHASES = 32
MAX_TEXT = 128
MAX_SAMPLES = 1_000_000
MAX_HORIZON_S = 86_400.0

NODE_KEYS = {"time", "predicted", "std", "current", "accuracy", "horizon_s", "samples", "model", "gpu_source",
             "load"}
ATTEMPT_KEYS = {"strategy", "world_size", "step", "ranks", "heatmap", "stragglers", "dropped_samples",
                "bytes_sent", "bytes_skipped", "bytes_full", "phases"}
RANK_KEYS = {"rank", "node", "step_ms", "keep"}
HEATMAP_KEYS = {"steps", "ms"}
STRAGGLER_KEYS = {"predicted", "actual", "precision", "recall"}
COUNTERS = ("dropped_samples", "bytes_sent", "bytes_skipped", "bytes_full")


def _number(value: Any) -> bool:
    return finite_number(value)


def _whole(value: Any, low: int = 0, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def _unknown(payload: dict, allowed: set[str], where: str, errors: dict[str, str]) -> None:
    extra = sorted(str(key) for key in payload if key not in allowed)
    if extra:
        errors[where or ""] = f"unknown keys: {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})"
    for key in extra:
        errors[f"{where}.{key}" if where else key] = "unknown key"


def _fractions(value: Any, where: str, errors: dict[str, str], nullable: bool = False,
               high: float | None = 1.0) -> dict[str, float | None]:
    if not isinstance(value, dict) or not value:
        errors[where] = f"required: an object of {', '.join(RESOURCES)}"
        return {}
    clean: dict[str, float | None] = {}
    for key, number in value.items():
        if key not in RESOURCES:
            errors[f"{where}.{key}"] = f"unknown resource (one of {', '.join(RESOURCES)})"
        elif number is None and nullable:
            clean[key] = None
        elif not _number(number) or number < 0 or (high is not None and number > high):
            errors[f"{where}.{key}"] = "a finite number " + (f"within [0, {high:g}]" if high is not None else ">= 0")
        else:
            clean[key] = float(number)
    return clean


class StragglerReport(ReportSchema):
    """The straggler plugin's report schema (see the module docstring)."""

    # -- node --------------------------------------------------------------------------------------------
    def node(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        errors: dict[str, str] = {}
        _unknown(payload, NODE_KEYS, "", errors)
        predicted = _fractions(payload.get("predicted"), "predicted", errors)
        std = _fractions(payload.get("std"), "std", errors)
        current = _fractions(payload.get("current"), "current", errors)
        if predicted and not errors and not (set(predicted) == set(std) == set(current)):
            errors["std"] = "predicted, std and current must name the same resources"
        accuracy = payload.get("accuracy")
        clean_accuracy: dict[str, Any] = {}
        if not isinstance(accuracy, dict):
            errors["accuracy"] = "required: {mae: {resource: number | null}, n: int}"
        else:
            _unknown(accuracy, {"mae", "naive_mae", "n"}, "accuracy", errors)
            clean_accuracy["mae"] = _fractions(accuracy.get("mae"), "accuracy.mae", errors, nullable=True)
            if "naive_mae" in accuracy:
                clean_accuracy["naive_mae"] = _fractions(accuracy.get("naive_mae"), "accuracy.naive_mae", errors,
                                                         nullable=True)
            if not _whole(accuracy.get("n"), 0, MAX_SAMPLES):
                errors["accuracy.n"] = "required: a whole number >= 0"
            else:
                clean_accuracy["n"] = accuracy["n"]
        horizon = payload.get("horizon_s")
        if not _number(horizon) or not 0 < horizon <= MAX_HORIZON_S:
            errors["horizon_s"] = f"required: seconds within (0, {MAX_HORIZON_S:g}]"
        if not _whole(payload.get("samples"), 0, MAX_SAMPLES):
            errors["samples"] = "required: a whole number >= 0"
        clean: dict[str, Any] = {}
        if "time" in payload:
            if not _number(payload["time"]) or payload["time"] < 0:
                errors["time"] = "when the node read it (unix seconds)"
            else:
                clean["time"] = float(payload["time"])
        for key, allowed in (("model", MODELS), ("gpu_source", GPU_SOURCES)):
            if key in payload:
                if payload[key] not in allowed:
                    errors[key] = f"one of {', '.join(allowed)}"
                else:
                    clean[key] = payload[key]
        if "load" in payload:
            if not _number(payload["load"]) or not 0 <= payload["load"] <= 1000:
                errors["load"] = "a finite number >= 0 (the one-minute load average per CPU)"
            else:
                clean["load"] = float(payload["load"])
        if errors:
            raise ReportError(errors)
        return {**clean, "predicted": predicted, "std": std, "current": current, "accuracy": clean_accuracy,
                "horizon_s": float(horizon), "samples": int(payload["samples"])}

    def parts(self, payload: dict[str, Any]) -> ReportParts:
        series = []
        if "time" in payload:  # the node's reading time: a retried heartbeat stores the row once
            now = payload["time"]
            series.append({"start": now, "end": now, "device": None, "attempt": None,
                           "data": {"current": payload["current"], "predicted": payload["predicted"],
                                    "std": payload["std"]}})
        return ReportParts(node=payload, series=series)

    # -- attempt -----------------------------------------------------------------------------------------
    def attempt(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        errors: dict[str, str] = {}
        _unknown(payload, ATTEMPT_KEYS, "", errors)
        strategy = payload.get("strategy")
        if not isinstance(strategy, str) or not strategy or len(strategy) > MAX_TEXT:
            errors["strategy"] = f"required: a string of 1 to {MAX_TEXT} characters"
        if not _whole(payload.get("world_size"), 1, MAX_RANKS):
            errors["world_size"] = f"required: a whole number within [1, {MAX_RANKS}]"
        if not _whole(payload.get("step"), 0):
            errors["step"] = "required: a whole number >= 0"
        clean = {"strategy": strategy, "world_size": payload.get("world_size"), "step": payload.get("step"),
                 "ranks": self._ranks(payload.get("ranks", []), errors),
                 "heatmap": self._heatmap(payload.get("heatmap", {"steps": [], "ms": []}), errors),
                 "stragglers": self._stragglers(payload.get("stragglers", {}), errors)}
        for key in COUNTERS:
            value = payload.get(key, 0)
            if not _whole(value, 0):
                errors[key] = "a whole number >= 0"
            clean[key] = value
        phases = payload.get("phases", {})
        if not isinstance(phases, dict) or len(phases) > MAX_PHASES:
            errors["phases"] = f"an object of at most {MAX_PHASES} names to numbers"
            phases = {}
        for name, value in phases.items():
            if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
                errors[f"phases.{name}"] = f"a name of 1 to {MAX_TEXT} characters"
            elif not _number(value):
                errors[f"phases.{name}"] = "a finite number"
        clean["phases"] = {name: float(value) for name, value in phases.items()
                           if isinstance(name, str) and _number(value)}
        if errors:
            raise ReportError(errors)
        return clean

    def _ranks(self, ranks: Any, errors: dict[str, str]) -> list[dict[str, Any]]:
        if not isinstance(ranks, list) or len(ranks) > MAX_RANKS:
            errors["ranks"] = f"a list of at most {MAX_RANKS} ranks"
            return []
        clean = []
        for index, entry in enumerate(ranks):
            where = f"ranks.{index}"
            if not isinstance(entry, dict):
                errors[where] = "must be an object"
                continue
            _unknown(entry, RANK_KEYS, where, errors)
            if not _whole(entry.get("rank"), 0, MAX_RANKS - 1):
                errors[f"{where}.rank"] = f"required: a whole number within [0, {MAX_RANKS - 1}]"
            if not isinstance(entry.get("node"), str) or len(entry["node"]) > MAX_TEXT:
                errors[f"{where}.node"] = f"required: a string of at most {MAX_TEXT} characters"
            if not _number(entry.get("step_ms")) or entry["step_ms"] < 0:
                errors[f"{where}.step_ms"] = "required: a finite number >= 0"
            if not _number(entry.get("keep")) or not 0 <= entry["keep"] <= 1:
                errors[f"{where}.keep"] = "required: the fraction of its batch the rank keeps, within [0, 1]"
            clean.append({"rank": entry.get("rank"), "node": entry.get("node"),
                          "step_ms": float(entry["step_ms"]) if _number(entry.get("step_ms")) else None,
                          "keep": float(entry["keep"]) if _number(entry.get("keep")) else None})
        return clean

    def _heatmap(self, heatmap: Any, errors: dict[str, str]) -> dict[str, Any]:
        if not isinstance(heatmap, dict):
            errors["heatmap"] = "an object {steps: [int], ms: [[number | null per rank]]}"
            return {"steps": [], "ms": []}
        _unknown(heatmap, HEATMAP_KEYS, "heatmap", errors)
        steps, rows = heatmap.get("steps", []), heatmap.get("ms", [])
        if not isinstance(steps, list) or len(steps) > MAX_STEPS or not all(_whole(step, 0) for step in steps):
            errors["heatmap.steps"] = f"a list of at most {MAX_STEPS} whole numbers >= 0"
            return {"steps": [], "ms": []}
        if not isinstance(rows, list) or len(rows) != len(steps):
            errors["heatmap.ms"] = "a list with one row per step"
            return {"steps": [], "ms": []}
        clean = []
        for index, row in enumerate(rows):
            if not isinstance(row, list) or len(row) > MAX_RANKS or not all(
                    value is None or (_number(value) and value >= 0) for value in row):
                errors[f"heatmap.ms.{index}"] = f"a list of at most {MAX_RANKS} finite numbers >= 0 (or null)"
                continue
            clean.append([None if value is None else float(value) for value in row])
        return {"steps": list(steps), "ms": clean}

    def _stragglers(self, stragglers: Any, errors: dict[str, str]) -> dict[str, Any]:
        empty = {"predicted": [], "actual": [], "precision": None, "recall": None}
        if not isinstance(stragglers, dict):
            errors["stragglers"] = "an object {predicted, actual, precision, recall}"
            return empty
        _unknown(stragglers, STRAGGLER_KEYS, "stragglers", errors)
        clean = dict(empty)
        for key in ("predicted", "actual"):
            pairs = stragglers.get(key, [])
            if not isinstance(pairs, list) or len(pairs) > MAX_PAIRS or not all(
                    isinstance(pair, list | tuple) and len(pair) == 2 and _whole(pair[0], 0)
                    and _whole(pair[1], 0, MAX_RANKS - 1) for pair in pairs):
                errors[f"stragglers.{key}"] = f"a list of at most {MAX_PAIRS} [step, rank] pairs"
                continue
            clean[key] = [[int(step), int(rank)] for step, rank in pairs]
        for key in ("precision", "recall"):
            value = stragglers.get(key)
            if value is not None and (not _number(value) or not 0 <= value <= 1):
                errors[f"stragglers.{key}"] = "a number within [0, 1], or null"
                continue
            clean[key] = None if value is None else float(value)
        return clean
