"""gpushare's scheduler hook: a shared job reserves the device memory it was measured to use.

Salus admits jobs onto a shared device by their measured memory, not by their share of it. The sharing
services measure each attempt (the ``gpushare`` report's per-attempt peak, stored by the control plane as
``Attempt.measured_memory``); this hook lends that measurement to the placement of the job's next attempt, and
to the first attempt of a job with the same kind and spec (a sweep resubmits one spec many times, and such
jobs have the same memory profile).

Light: standard library and components.runtime.contract.policies only (the control plane imports it).
"""

from __future__ import annotations

from components.runtime.contract.policies import Demand, Estimate, ResourceEstimate

# What a shared job reserves beyond its measured peak (allocator fragmentation, a larger batch at an epoch's end).
MEASURED_HEADROOM = 1.1


class LendMeasuredMemory(ResourceEstimate):
    """A fractional job (0 < gpus < 1) without an explicit ``gpu_memory`` reserves what it measured, not a
    memory slice proportional to its share: it goes where that fits, or waits. Its own earlier attempts'
    measurement takes precedence over that of jobs with the same spec; the headroom never makes a measurement
    that fits the largest device unplaceable."""

    kinds = None  # any kind that runs shared

    def estimate(self, demand: Demand) -> Estimate | None:
        resources = demand.resources
        if not 0 < float(resources.get("gpus", 0)) < 1 or resources.get("gpu_memory"):
            return None
        if demand.measured_memory > 0:
            used, source = demand.measured_memory, "its earlier attempts measured"
        elif demand.profile_memory > 0:
            used, source = demand.profile_memory, "jobs with the same spec measured"
        else:
            return None
        memory = min(int(used * MEASURED_HEADROOM), max(used, demand.largest_device_memory))
        return Estimate({**resources, "gpu_memory": memory},
                        f"{memory / 2**30:.2f} GiB reserved: {MEASURED_HEADROOM:g} x what {source}")
