"""The light schema of what a ``compress-embeddings`` attempt reports (``ctx.report("embeddings", payload)``).

The component reports as it goes (the latest report of the attempt wins)::

    {"phase": "loading" | "clustering" | "evaluating" | "finetuning" | "done",     # required
     "source": str, "artifact": "model.pt" | "embeddings.pt",
     "workload": "dlrm-ctr" | "dlrm-movielens" | null, "dataset": str | null,
     "ratio_target": float, "ratio": float | null,            # embedding bytes before / after
     "bytes_before": int | null, "bytes_after": int | null,
     "clustering_s": float | null,
     "auc_before", "auc_after", "auc_finetuned": float | null,
     "logloss_before", "logloss_after", "logloss_finetuned": float | null,
     "fields": [{"name": str, "features": int, "seen": int, "distinct": int,
                 "clusters": int | null (null: kept as a full table), "head": int,
                 "bytes_before": int, "bytes_after": int, "seconds": float, "lossless": bool,
                 "distortion": float, "delta_auc": float | null}]}         # at most 1024

The rules:

* Only ``phase`` is required at the top level; every other key may be missing or null (early phases know
  little) and comes back as null (``fields`` as ``[]``). In a field every key is required except
  ``delta_auc`` (missing: null); ``clusters`` may be null.
* Unknown keys are **refused**, at the top level and in a field: the schema is the contract with the component,
  and a misspelt key should fail loudly rather than vanish.
* Counts and bytes are non-negative ints (a bool is no int); other numbers are finite (no NaN, no infinity),
  ints or floats, returned as floats: AUCs in [0, 1], ``delta_auc`` in [-1, 1], ``ratio_target`` at least 1,
  ``ratio`` above 0, times, log losses and distortions at least 0; ``clusters`` at least 1.
* Strings are cut to 256 characters.

Every problem is collected and raised at once as a :class:`ReportError` naming its path (``ratio``,
``fields[3].clusters``). Nodes do not report (``node()`` keeps the default refusal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.embeddings.spec import ARTIFACTS, DLRM_WORKLOADS
from components.runtime.contract.plugins import ReportError, ReportSchema
from components.runtime.shared.units import finite_number

PHASES = ("loading", "clustering", "evaluating", "finetuning", "done")
MAX_FIELDS = 1024
MAX_STRING = 256

Errors = dict[str, str]
Check = Callable[[Any, str, Errors], Any]  # (value, path, errors) -> the normalized value (None if refused)


def _string(value: Any, path: str, errors: Errors) -> str | None:
    if not isinstance(value, str):
        errors[path] = "must be a string"
        return None
    return value[:MAX_STRING]


def _choice(choices: tuple[str, ...]) -> Check:
    def check(value: Any, path: str, errors: Errors) -> str | None:
        if value not in choices:
            errors[path] = f"must be one of {', '.join(choices)}"
            return None
        return value
    return check


def _count(minimum: int = 0) -> Check:
    def check(value: Any, path: str, errors: Errors) -> int | None:
        if not isinstance(value, int) or isinstance(value, bool):
            errors[path] = "must be an integer"
            return None
        if value < minimum:
            errors[path] = f"must be at least {minimum}"
            return None
        return value
    return check


def _number(minimum: float | None = None, maximum: float | None = None, above: float | None = None) -> Check:
    """A finite number within [minimum, maximum] (and > ``above``), returned as a float."""
    def check(value: Any, path: str, errors: Errors) -> float | None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            errors[path] = "must be a number"
            return None
        if not finite_number(value):
            errors[path] = "must be a finite number"
            return None
        if minimum is not None and value < minimum:
            errors[path] = f"must be at least {minimum:g}"
            return None
        if maximum is not None and value > maximum:
            errors[path] = f"must be at most {maximum:g}"
            return None
        if above is not None and value <= above:
            errors[path] = f"must be above {above:g}"
            return None
        return float(value)
    return check


def _bool(value: Any, path: str, errors: Errors) -> bool | None:
    if not isinstance(value, bool):
        errors[path] = "must be true or false"
        return None
    return value


_AUC = _number(minimum=0.0, maximum=1.0)
_LOSS = _number(minimum=0.0)

# Top-level keys other than "phase" and "fields": every one optional and nullable.
TOP: dict[str, Check] = {
    "source": _string, "artifact": _choice(ARTIFACTS), "workload": _choice(DLRM_WORKLOADS), "dataset": _string,
    "ratio_target": _number(minimum=1.0), "ratio": _number(above=0.0),
    "bytes_before": _count(), "bytes_after": _count(), "clustering_s": _number(minimum=0.0),
    "auc_before": _AUC, "auc_after": _AUC, "auc_finetuned": _AUC,
    "logloss_before": _LOSS, "logloss_after": _LOSS, "logloss_finetuned": _LOSS,
}
# A field's keys: (check, whether null is allowed, whether the key may be missing).
FIELD: dict[str, tuple[Check, bool, bool]] = {
    "name": (_string, False, False),
    "features": (_count(), False, False), "seen": (_count(), False, False), "distinct": (_count(), False, False),
    "clusters": (_count(minimum=1), True, False), "head": (_count(), False, False),
    "bytes_before": (_count(), False, False), "bytes_after": (_count(), False, False),
    "seconds": (_number(minimum=0.0), False, False), "lossless": (_bool, False, False),
    "distortion": (_number(minimum=0.0), False, False),
    "delta_auc": (_number(minimum=-1.0, maximum=1.0), True, True),
}
KEYS = {"phase", "fields", *TOP}


def _field(value: Any, path: str, errors: Errors) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        errors[path] = "must be an object"
        return None
    for key in sorted(set(value) - set(FIELD), key=str):
        errors[f"{path}.{str(key)[:64]}"] = "unknown key"
    cleaned: dict[str, Any] = {}
    for key, (check, nullable, optional) in FIELD.items():
        where = f"{path}.{key}"
        if key not in value:
            if not optional:
                errors[where] = "is required"
            cleaned[key] = None
        elif value[key] is None:
            if not nullable:
                errors[where] = "must not be null"
            cleaned[key] = None
        else:
            cleaned[key] = check(value[key], where, errors)
    return cleaned


class CompressionReport(ReportSchema):
    """The ``embeddings`` plugin's attempt report: the progress and results of one compression (see the module
    docstring). Returns the payload normalized: every documented key present, strings cut, numbers as floats."""

    def attempt(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ReportError({"": "must be an object"})
        errors: Errors = {}
        for key in sorted(set(payload) - KEYS, key=str):
            errors[str(key)[:64]] = "unknown key"
        cleaned: dict[str, Any] = {}
        if "phase" not in payload:
            errors["phase"] = "is required"
        cleaned["phase"] = _choice(PHASES)(payload.get("phase"), "phase", errors) if "phase" in payload else None
        for key, check in TOP.items():
            value = payload.get(key)
            cleaned[key] = None if value is None else check(value, key, errors)
        fields = payload.get("fields")
        cleaned["fields"] = []
        if fields is not None and not isinstance(fields, list):
            errors["fields"] = "must be a list"
        elif fields and len(fields) > MAX_FIELDS:
            errors["fields"] = f"must have at most {MAX_FIELDS} entries (has {len(fields)})"
        elif fields:
            cleaned["fields"] = [_field(item, f"fields[{index}]", errors) for index, item in enumerate(fields)]
        if errors:
            raise ReportError(errors)
        return cleaned


__all__ = ["MAX_FIELDS", "MAX_STRING", "PHASES", "CompressionReport"]
