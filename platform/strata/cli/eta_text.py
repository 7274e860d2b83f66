"""A waiting job's start-time estimate (the API's ``eta``, strata.scheduling.eta) in words, for the CLI."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``, ``2.1 d``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def short(job: dict) -> str:
    """``in ~12 min`` for a waiting job with an estimate (``now`` when it is due), else empty."""
    eta = job.get("eta") or {}
    if job.get("state") not in {"PENDING", "QUEUED"} or not eta:
        return ""
    seconds = eta.get("in_seconds")
    if seconds is None:
        return "not within the horizon"
    return "now" if seconds < 1 else f"in ~{duration(seconds)}"


def sentence(eta: dict) -> str:
    """``expected to start in 12 min (80 %: 5–30 min); waits for ...; would run now with: ...``."""
    seconds = eta.get("in_seconds")
    if seconds is None:
        text = "not expected to start within the simulated horizon"
    else:
        text = f"expected to start in {duration(seconds)}"
        low, high = eta.get("low_seconds"), eta.get("high_seconds")
        if low is not None and high is not None and (low, high) != (seconds, seconds):
            first, last = duration(low), duration(high)
            if first.split(" ")[1:] == last.split(" ")[1:]:  # one unit: "5–30 min"
                first = first.split(" ")[0]
            text += f" (80 %: {first}–{last})"
    waits = eta.get("waits_for") or {}
    reason = (waits.get("reason") or "").removeprefix("waiting: ")
    jobs = waits.get("jobs") or []
    if reason or jobs:
        text += "; waits for " + (reason or "room")
        if jobs:
            text += f" (until job{'s' if len(jobs) > 1 else ''} {', '.join(job[:8] for job in jobs)} end)"
    options = [option.get("text", option.get("kind", "")) for option in eta.get("run_now") or []]
    if options:
        text += "; would run now with: " + "; or ".join(options)
    return text
