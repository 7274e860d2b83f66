"""The light spec of the ``primes`` kind: read by the control plane (no torch here)."""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.spec import Checker, KindSpec

MAX_LIMIT = 10**10


class PrimesSpec(KindSpec):
    kind: ClassVar[str] = "primes"
    component: ClassVar[str] = "strata_primes.component:PrimesComponent"
    description: ClassVar[str] = "Count the primes below a limit with a segmented sieve (an example plugin)."

    def validate(self, spec: dict[str, Any]) -> dict[str, Any]:
        check = Checker(spec)
        check.unknown({"limit", "segment", "checkpoint_every"})
        check.not_null("limit", "segment", "checkpoint_every")
        limit = check.number("limit", None, kind=int, minimum=10, maximum=MAX_LIMIT)
        if limit is None and "spec.limit" not in check.errors:
            check.errors["spec.limit"] = "required: count the primes below this number"
        segment = check.number("segment", 100_000, kind=int, minimum=1_000, maximum=10_000_000)
        every = check.number("checkpoint_every", 5, kind=int, minimum=1, maximum=10_000)
        check.raise_if_errors()
        return {"limit": limit, "segment": segment, "checkpoint_every": every}

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["limit"],
            "properties": {
                "limit": {"type": "integer", "minimum": 10, "maximum": MAX_LIMIT,
                          "description": "Count the primes below this number."},
                "segment": {"type": "integer", "minimum": 1_000, "maximum": 10_000_000, "default": 100_000,
                            "description": "Numbers sieved per step."},
                "checkpoint_every": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 5,
                                     "description": "Checkpoint every this many steps."},
            },
        }
