"""gpushare's report schema against the ReportSchemaConformance suite, with the payloads its node services send:
the device services' ``{"devices": [entry]}`` merged by DeviceSharingService (entries as SharingService.report()
builds them, reused from test_metrics)."""

from __future__ import annotations

import pytest
from support import sibling_module

from components.gpushare.node import DeviceSharingService
from components.runtime.contract.plugins import ReportError
from components.runtime.testing.conformance.reports import ReportSchemaConformance


def _sibling(name: str):
    return sibling_module(__file__, name)


_metrics = _sibling("test_metrics")
REPORT, entry = _metrics.REPORT, _metrics._entry  # two devices, merged; one sharing two jobs on a lane
# A device service just started (nothing admitted, no slice yet), and one whose jobs ended since the last report.
IDLE = DeviceSharingService.merge([{"devices": [entry(0, switches=0, switch_latency_ms={"p50": 0.0, "p99": 0.0},
                                                      utilization=0.0, lanes=[], jobs=[], slices=[])]}])
ENDED = DeviceSharingService.merge([
    {"devices": [entry(2, policy="fair", jobs=[{**job, "state": "finished", "lane": None}
                                               for job in entry(2)["jobs"]], lanes=[])]},
    {"devices": [entry(3, policy="exclusive")]}])


class TestGpuShareReportSchema(ReportSchemaConformance):
    report_path = "components.gpushare.report:GpuShareReport"
    node_payloads = (REPORT, IDLE, ENDED)
    attempt_payloads = ()  # attempts report nothing to gpushare: attempt() keeps the default refusal

    def test_attempts_report_nothing(self):
        with pytest.raises(ReportError, match="takes no attempt reports"):
            self.schema().attempt(REPORT)

    def test_parts_keep_each_device_and_each_measured_attempt(self):
        schema = self.schema()
        parts = schema.parts(schema.node(REPORT))
        assert parts.node == {"devices": [0, 1]} and set(parts.devices) == {0, 1}
        assert {row["attempt"] for row in parts.attempts} == {_metrics.A, _metrics.B}
        assert [row["memory"] for row in parts.attempts] == [150, 200]
        assert sorted(row["device"] for row in parts.series) == [0, 1]  # each device's slice

    def test_an_integer_too_large_for_a_float_is_a_report_error(self):
        with pytest.raises(ReportError):
            self.schema().node({"devices": [entry(0, budget=10**400)]})


@pytest.fixture(autouse=True)
def one_torch_thread():
    """This module needs no torch: override the package's torch fixture."""
    yield
