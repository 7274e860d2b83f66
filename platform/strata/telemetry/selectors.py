"""Reading device telemetry, downsampled on the server to a bounded number of points."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from strata.telemetry.models import DeviceSample


def device_series(device_ids, since: datetime, until: datetime, points: int = 300) -> dict[int, list[dict]]:
    """Mean utilization and memory per time bucket, at most ``points`` buckets per device."""
    span = max((until - since).total_seconds(), 1.0)
    width = span / max(points, 1)
    buckets: dict[int, dict[int, list[float]]] = defaultdict(dict)
    rows = DeviceSample.objects.filter(device_id__in=list(device_ids), time__gte=since, time__lte=until)
    for device_id, time, utilization, memory in rows.values_list("device_id", "time", "utilization", "memory_used"):
        slot = int((time - since).total_seconds() // width)
        entry = buckets[device_id].setdefault(slot, [0.0, 0.0, 0])
        entry[0] += utilization
        entry[1] += memory
        entry[2] += 1
    series = {}
    for device_id, slots in buckets.items():
        series[device_id] = [
            {"time": since.timestamp() + (slot + 0.5) * width, "utilization": total_u / n, "memory_used": total_m / n}
            for slot, (total_u, total_m, n) in sorted(slots.items())
        ]
    return series
