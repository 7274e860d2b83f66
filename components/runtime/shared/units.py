"""Parsing of human-friendly quantities ("8GiB", "1.5h") shared by the control plane and the nodes."""

from __future__ import annotations

import math
import re
from typing import Any

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Return a byte count from an int or a string such as ``"8GiB"``, ``"512MB"`` or ``"1024"``."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 8GiB, got a boolean")
    if isinstance(value, int | float):
        if value < 0 or value != value:  # NaN is the only value unequal to itself
            raise ValueError("a size cannot be negative")
        if value == math.inf:
            raise ValueError("a size must be finite")
        return int(value)
    match = _QUANTITY.match(str(value))
    if not match or match.group(2).lower() not in _BYTE_UNITS:
        raise ValueError(f"invalid size {_shown(value)}: use a number with an optional unit such as 512MiB or 8GiB")
    size = float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]
    if not math.isfinite(size):
        raise ValueError(f"size {_shown(value)} is too large")
    return int(size)


def parse_duration(value: int | float | str) -> float:
    """Return seconds from a number or a string such as ``"90s"``, ``"15m"`` or ``"2h"``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 15m, got a boolean")
    if isinstance(value, int | float):
        if value < 0 or value != value:
            raise ValueError("a duration cannot be negative")
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("a duration must be finite") from None
    else:
        match = _QUANTITY.match(str(value))
        if not match or match.group(2).lower() not in _DURATION_UNITS:
            raise ValueError(f"invalid duration {_shown(value)}: use seconds or a unit such as 90s, 15m, 2h")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    if not math.isfinite(seconds):
        raise ValueError("a duration must be finite")
    return seconds


def _shown(value) -> str:
    """``value`` quoted for a message, shortened, and escaped where it could not be encoded."""
    text = str(value)
    text = text if len(text) <= 40 else text[:40] + "..."
    return repr(text.encode("utf-8", errors="backslashreplace").decode("utf-8"))


def finite_number(value: Any) -> bool:
    """True for an int or a float (never a bool) that is finite and fits a float: JSON carries integers of any
    size, and ``math.isfinite(10**400)`` raises ``OverflowError``. The one check of reports, specs and options."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
