"""Order statistics shared by the node-side parts and the benchmarks (standard library only)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) of ``values`` by linear interpolation between order statistics; None when
    there are none. The one definition: the plugins' latency figures on the nodes and every benchmark use it
    (p50 is ``q=0.5``, p99 ``q=0.99``)."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1], got {q}")
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
