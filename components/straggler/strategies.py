"""The straggler plugin's distributed-training strategies, as the control plane sees them (light: no torch).

:class:`SMSStrategy` names SMS (proactive, accuracy-aware straggler mitigation); its node-side runtime is
:class:`components.straggler.sms.SMSRuntime`, imported on nodes only.
"""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.distributed import Strategy
from components.runtime.shared.units import finite_number

SMS_DEFAULTS: dict[str, Any] = {
    "threshold": 0.2,  # a rank straggles when its time exceeds (1 + threshold) x the median
    "min_keep": 0.25,  # a predicted straggler keeps at least this fraction of its batch
    "eps": 0.01,  # a gradient chunk is sent when it changed by more than eps x its last sent norm
    "chunk": 256,  # elements per gradient chunk (small enough to isolate the rows of dead units)
    "dedup": True,  # shrink a predicted straggler's batch to one weighted sample per near-duplicate cluster
    "transfer_control": True,  # skip unchanged gradient chunks, with error feedback
}
MAX_THRESHOLD = 10.0
MAX_EPS = 10.0
MIN_CHUNK, MAX_CHUNK = 16, 1 << 26


def _number(value: Any) -> bool:
    return finite_number(value)


class SMSStrategy(Strategy):
    """SMS: data parallel training that predicts stragglers, shrinks their batches and skips unchanged gradients."""

    name: ClassVar[str] = "sms"
    description: ClassVar[str] = (
        "Data parallel training that shrugs off stragglers (SMS): every rank predicts each rank's next step time "
        "from its history and load; a predicted straggler trains on one weighted sample per near-duplicate "
        "cluster of its batch (an unbiased estimate of the full batch), and gradient chunks that barely changed "
        "since they were last sent are skipped, with error feedback."
    )
    options: ClassVar[frozenset[str]] = frozenset(SMS_DEFAULTS)
    runtime: ClassVar[str] = "components.straggler.sms:SMSRuntime"
    min_workers: ClassVar[int] = 2
    # An SMS gang gives up workers rather than stopping (down to two): rank 0's checkpoint resumes at any size.
    elastic: ClassVar[bool] = True

    def validate(self, options: dict[str, Any]) -> dict[str, str]:
        errors: dict[str, str] = {}
        threshold = options.get("threshold", SMS_DEFAULTS["threshold"])
        if not _number(threshold) or not 0 < threshold <= MAX_THRESHOLD:
            errors["threshold"] = (f"must be a number in (0, {MAX_THRESHOLD:g}]: a rank straggles when its time "
                                   "exceeds (1 + threshold) x the median (e.g. 0.2)")
        min_keep = options.get("min_keep", SMS_DEFAULTS["min_keep"])
        if not _number(min_keep) or not 0 < min_keep <= 1:
            errors["min_keep"] = "must be a fraction in (0, 1]: the least of its batch a straggler keeps (e.g. 0.25)"
        eps = options.get("eps", SMS_DEFAULTS["eps"])
        if not _number(eps) or not 0 <= eps <= MAX_EPS:
            errors["eps"] = (f"must be a number from 0 to {MAX_EPS:g}: the relative change below which a gradient "
                             "chunk is not sent (0 sends every chunk)")
        chunk = options.get("chunk", SMS_DEFAULTS["chunk"])
        if not isinstance(chunk, int) or isinstance(chunk, bool) or not MIN_CHUNK <= chunk <= MAX_CHUNK:
            errors["chunk"] = f"must be a whole number of gradient elements from {MIN_CHUNK} to {MAX_CHUNK}"
        for flag in ("dedup", "transfer_control"):
            if not isinstance(options.get(flag, True), bool):
                errors[flag] = "must be true or false"
        return errors

    def defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        out = {**SMS_DEFAULTS, **{key: value for key, value in options.items() if key in SMS_DEFAULTS}}
        for key in ("threshold", "min_keep", "eps"):
            out[key] = float(out[key])
        out["chunk"] = int(out["chunk"])
        return out
