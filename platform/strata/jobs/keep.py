"""Retention policies: what of a job's stored bytes to keep (``keep``), checked once here for every place a
policy is set: a job's top-level ``keep`` (the submit serializer), a team's quota (``quotas.services.quota_clean``)
and the cluster's defaults (``STRATA_RETENTION_*``, :func:`cluster_keep`). The collector that applies them is
``strata.quotas.retention``; what each rule means is in docs/operations.md (*Retention*).

A policy is a dict with any of two fields (an absent one is left to the next level: job > team > cluster)::

    checkpoints: "latest" | "all" | {best: N, metric: NAME, mode: "min" | "max"}
    artifacts_days: N | null        # days an ended job's artifacts are kept; null: forever
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from strata.api.values import text_problem

CHECKPOINT_RULES = ("latest", "all")
MAX_BEST = 1000
MAX_DAYS = 36500.0
FIELDS = ("checkpoints", "artifacts_days")


class KeepInvalid(ValueError):
    """A malformed policy; ``errors`` maps each bad field (``keep.<field>``) to its message."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


def _checkpoints(value: Any, path: str, errors: dict[str, str]) -> Any:
    if isinstance(value, str):
        if value in CHECKPOINT_RULES:
            return value
        errors[path] = "must be latest, all, or {best: N} (N checkpoints with the best value of a metric)"
        return None
    if not isinstance(value, dict):
        errors[path] = "must be latest, all, or {best: N, metric: NAME, mode: min|max}"
        return None
    for name in sorted(set(value) - {"best", "metric", "mode"}, key=str):
        errors[f"{path}.{name}"[:200]] = "unknown field; allowed: best, metric, mode"
    best = value.get("best")
    if isinstance(best, float) and best.is_integer():
        best = int(best)
    if isinstance(best, bool) or not isinstance(best, int) or not 1 <= best <= MAX_BEST:
        errors[f"{path}.best"] = f"must be a whole number from 1 to {MAX_BEST}"
    metric = value.get("metric")
    if metric is not None and (not isinstance(metric, str) or not metric.strip() or len(metric) > 100
                               or text_problem(metric)):
        errors[f"{path}.metric"] = "must be the name of a metric the job reports (1 to 100 characters)"
    mode = value.get("mode")
    if mode is not None and mode not in ("min", "max"):
        errors[f"{path}.mode"] = "must be min (lower is better) or max"
    return {"best": best, "metric": metric.strip() if isinstance(metric, str) else None, "mode": mode}


def _days(value: Any, path: str, errors: dict[str, str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= MAX_DAYS:
        errors[path] = f"must be a number of days from 0 to {MAX_DAYS:g}, or null (forever)"
        return None
    return float(value)


def keep_clean(value: Any, prefix: str = "keep", objective: tuple[str, str] | None | bool = False) -> dict | None:
    """The normalized policy ``value`` (only the fields it gives), or None for none. Raises :class:`KeepInvalid`
    naming every bad field under ``prefix``. ``objective``: the kind's ``(metric, mode)`` or None when a job's
    kind has none (then ``best`` must name its metric); False where no kind is known (a team's policy)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise KeepInvalid({prefix: "must be an object: {checkpoints: latest | all | {best: N}, artifacts_days: N}"})
    errors: dict[str, str] = {}
    cleaned: dict[str, Any] = {}
    for name in sorted(set(value) - set(FIELDS), key=str):
        errors[f"{prefix}.{name}"[:200]] = "unknown field; allowed: checkpoints, artifacts_days"
    if "checkpoints" in value:
        rule = _checkpoints(value["checkpoints"], f"{prefix}.checkpoints", errors)
        if isinstance(rule, dict) and rule["metric"] is None and objective is None:
            errors.setdefault(f"{prefix}.checkpoints.metric",
                              "required: the job's kind names no objective metric to rank checkpoints by")
        cleaned["checkpoints"] = rule
    if "artifacts_days" in value:
        cleaned["artifacts_days"] = _days(value["artifacts_days"], f"{prefix}.artifacts_days", errors)
    if errors:
        raise KeepInvalid(errors)
    return cleaned


def cluster_keep() -> dict:
    """The cluster's default policy, from ``STRATA_RETENTION_CHECKPOINTS`` (``latest``, ``all``, ``best:N`` or
    ``best:N:METRIC:min|max``) and ``STRATA_RETENTION_ARTIFACTS_DAYS`` (unset: forever). Raises
    ImproperlyConfigured for a bad value."""
    text = (settings.STRATA_RETENTION_CHECKPOINTS or "latest").strip()
    if text.startswith("best:"):
        parts = text.split(":")
        rule: Any = {"best": int(parts[1]) if parts[1].isdigit() else parts[1]}
        if len(parts) > 2:
            rule["metric"] = parts[2]
        if len(parts) > 3:
            rule["mode"] = parts[3]
        if len(parts) > 4:
            rule = text
    else:
        rule = text
    try:
        return keep_clean({"checkpoints": rule, "artifacts_days": settings.STRATA_RETENTION_ARTIFACTS_DAYS},
                          prefix="STRATA_RETENTION")
    except KeepInvalid as error:
        raise ImproperlyConfigured(f"retention settings: {error} (STRATA_RETENTION_CHECKPOINTS is latest, all, "
                                   "best:N or best:N:METRIC:min|max)") from None
