"""strata_report: report to Strata from a command job. Standard library only; importable in every command job.

    import strata_report

    strata_report.report(step=epoch, loss=0.31, accuracy=0.92)   # metrics, shown on the job page and to sweeps
    torch.save(state, strata_report.checkpoint_dir() / "state.pt")
    strata_report.save()                                          # store the checkpoint directory now

``report`` is the same as printing ``strata: step=3 loss=0.31 accuracy=0.92`` on stdout. ``save`` returns once the
checkpoint directory was stored (the next attempt of the job starts with it restored); it is also saved when the
program exits and when the job is stopped (SIGTERM, then a grace period). Outside Strata, ``report`` prints the
line and ``save`` does nothing, so the same script runs on a laptop.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

__all__ = ["report", "save", "checkpoint_dir", "output_dir", "data_dir", "rank", "world_size", "should_stop"]

_REPORT_FD = os.environ.get("STRATA_REPORT_FD")
_ACK_FD = os.environ.get("STRATA_ACK_FD")
_stream = None
_acks = None


def _channel():
    global _stream, _acks
    if _stream is None and _REPORT_FD:
        try:
            _stream = os.fdopen(int(_REPORT_FD), "w", buffering=1)
            _acks = os.fdopen(int(_ACK_FD), "r") if _ACK_FD else None
        except (OSError, ValueError):
            _stream = False
    return _stream or None


def report(step: int | None = None, **metrics: float) -> None:
    """Record named metric values (numbers) at ``step`` (default: one more than the last report)."""
    values = {}
    for name, value in metrics.items():
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{name} is {value!r}: metrics must be finite numbers")
        values[str(name)] = number
    stream = _channel()
    if stream is None:
        parts = ([f"step={int(step)}"] if step is not None else []) + [f"{k}={v:g}" for k, v in values.items()]
        print("strata: " + " ".join(parts), flush=True)
        return
    stream.write(json.dumps({"op": "metrics", "step": None if step is None else int(step), "values": values}) + "\n")


def save(timeout: float = 600.0) -> bool:
    """Store ``checkpoint_dir()`` as the job's checkpoint now; True once stored (False outside Strata)."""
    stream = _channel()
    if stream is None:
        return False
    stream.write(json.dumps({"op": "save"}) + "\n")
    if _acks is None:
        return True
    answer = _acks.readline()
    return answer.strip() == "ok"


def _directory(name: str, fallback: str) -> Path:
    path = Path(os.environ.get(name) or fallback)
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkpoint_dir() -> Path:
    return _directory("STRATA_CHECKPOINT_DIR", "checkpoint")


def output_dir() -> Path:
    return _directory("STRATA_OUTPUT_DIR", "output")


def data_dir() -> Path:
    return Path(os.environ.get("STRATA_DATA_DIR") or "data")


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def should_stop() -> bool:
    """True once Strata asked the job to stop (it also sends SIGTERM): checkpoint and exit."""
    return os.environ.get("STRATA_STOP_FILE") is not None and Path(os.environ["STRATA_STOP_FILE"]).exists()


if __name__ == "__main__":  # python -m strata_report loss=0.3 step=2
    pairs = dict(arg.split("=", 1) for arg in sys.argv[1:])
    step_text = pairs.pop("step", None)
    report(step=int(step_text) if step_text is not None else None, **{k: float(v) for k, v in pairs.items()})
