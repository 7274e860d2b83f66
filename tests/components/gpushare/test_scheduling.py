"""gpushare's scheduler hook: a fractional job reserves what it, or jobs with its spec, measured (plus headroom),
never more than the largest device when the measurement fits it; the hook passes its seam's conformance suite."""

from __future__ import annotations

from components.gpushare.scheduling import MEASURED_HEADROOM, LendMeasuredMemory
from components.runtime.contract.policies import Demand
from components.runtime.testing.conformance.policies import ResourceEstimateConformance

GiB = 2**30


def demand(gpus=0.5, memory=None, measured=0, profile=0, largest=16 * GiB) -> Demand:
    return Demand(kind="train", resources={"gpus": gpus, "gpu_memory": memory, "workers": 1},
                  measured_memory=measured, profile_memory=profile, largest_device_memory=largest)


class TestLendMeasuredMemoryConformance(ResourceEstimateConformance):
    hook_path = "components.gpushare.scheduling:LendMeasuredMemory"


def test_its_own_measurement_wins_over_the_specs():
    answer = LendMeasuredMemory().estimate(demand(measured=2 * GiB, profile=5 * GiB))
    assert answer.resources["gpu_memory"] == int(2 * GiB * MEASURED_HEADROOM)
    assert answer.resources["gpus"] == 0.5
    assert answer.note == "2.20 GiB reserved: 1.1 x what its earlier attempts measured"
    answer = LendMeasuredMemory().estimate(demand(profile=5 * GiB))
    assert answer.resources["gpu_memory"] == int(5 * GiB * MEASURED_HEADROOM)
    assert "jobs with the same spec measured" in answer.note


def test_the_headroom_never_makes_a_fitting_measurement_unplaceable():
    assert LendMeasuredMemory().estimate(demand(measured=15 * GiB)).resources["gpu_memory"] == 16 * GiB
    # A measurement larger than any device is kept as it is (the job waits; it is not shrunk).
    assert LendMeasuredMemory().estimate(demand(measured=20 * GiB)).resources["gpu_memory"] == 20 * GiB


def test_whole_devices_explicit_memory_and_unmeasured_jobs_are_left_alone():
    hook = LendMeasuredMemory()
    assert hook.estimate(demand(gpus=1.0, measured=2 * GiB)) is None
    assert hook.estimate(demand(gpus=0.0, measured=2 * GiB)) is None
    assert hook.estimate(demand(memory=GiB, measured=2 * GiB)) is None
    assert hook.estimate(demand()) is None
