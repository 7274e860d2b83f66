"""gpushare's node metrics: the conformance suite, and real values from the report shape its services send."""

from __future__ import annotations

import uuid

import pytest

from components.gpushare.node import DeviceSharingService
from components.gpushare.report import GpuShareReport
from components.runtime.testing.conformance.reports import MetricsConformance

A, B = str(uuid.uuid4()), str(uuid.uuid4())


def _entry(index: int, **changes) -> dict:
    """One device service's ``sharing`` entry, as DeviceService.report() builds it."""
    return {"index": index, "policy": "lanes", "switches": 12, "switch_latency_ms": {"p50": 2.0, "p99": 9.5},
            "utilization": 0.75, "budget": 8 << 30,
            "lanes": [{"id": 0, "size": 1 << 30, "attempts": [A, B]}, {"id": 1, "size": 2 << 30, "attempts": []}],
            "jobs": [{"attempt": A, "state": "running", "persistent": 100, "ephemeral": 50, "lane": 0, "steps": 7},
                     {"attempt": B, "state": "waiting", "persistent": 200, "ephemeral": 0, "lane": 0, "steps": 0}],
            "slices": [{"attempt": A, "start": 10.0, "end": 11.0}], **changes}


# What the agent sends: the device services' payloads merged by the plugin's NodeService.
REPORT = DeviceSharingService.merge([{"devices": [_entry(1)]}, {"devices": [_entry(0, jobs=[], lanes=[])]}])


class TestGpuShareMetrics(MetricsConformance):
    plugin = "gpushare"
    report_path = "components.gpushare.report:GpuShareReport"
    reports = (REPORT, {"devices": [_entry(0, switches=0, utilization=0.0)]})


@pytest.fixture(autouse=True)
def one_torch_thread():
    """This module needs no torch: override the package's torch fixture."""
    yield


def test_real_values_per_device():
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in GpuShareReport().metrics(REPORT)}
    one = (("device", "1"), ("policy", "lanes"))
    assert found[("strata_gpushare_switches_total", one)] == 12
    assert found[("strata_gpushare_switch_latency_seconds", (*one, ("quantile", "0.99")))] == pytest.approx(0.0095)
    assert found[("strata_gpushare_utilization_ratio", one)] == 0.75
    assert found[("strata_gpushare_memory_budget_bytes", one)] == 8 << 30
    assert found[("strata_gpushare_lanes", one)] == 2
    assert found[("strata_gpushare_lane_bytes", one)] == 3 << 30
    assert found[("strata_gpushare_jobs", (*one, ("state", "running")))] == 1
    assert found[("strata_gpushare_jobs", (*one, ("state", "waiting")))] == 1
    assert found[("strata_gpushare_job_memory_bytes", (("device", "1"), ("memory", "persistent"),
                                                       ("policy", "lanes")))] == 300
    zero = (("device", "0"), ("policy", "lanes"))
    assert found[("strata_gpushare_lanes", zero)] == 0
    assert not any(A in str(key) for key in found)  # attempt ids are no label


def test_a_malformed_report_raises():
    with pytest.raises(ValueError):
        list(GpuShareReport().metrics({"devices": [{"index": -1}]}))
