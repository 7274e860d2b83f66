"""The example plugin's report schema (strata_primes.report:ScratchDiskReport) against the ReportSchemaConformance
suite, with what its ScratchDiskService.report() sends with each heartbeat (tests/examples/conftest.py puts the
plugin's folder on the path)."""

from __future__ import annotations

import json

import pytest

from components.runtime.contract.plugins import ReportError
from components.runtime.testing.conformance.reports import ReportSchemaConformance

pytest.importorskip("strata_primes.report", reason="the example plugin is not importable here")


class TestScratchDiskReportSchema(ReportSchemaConformance):
    report_path = "strata_primes.report:ScratchDiskReport"
    node_payloads = ({"disk_free": 2**30, "disk_total": 2**32, "load1": 0.5},
                     {"disk_free": 0, "disk_total": 512 * 2**30, "load1": 0.0},  # a full disk, an idle node
                     {"disk_free": 7, "disk_total": 7, "load1": 3})  # load1 as an int: returned as a float
    attempt_payloads = ()  # attempts report nothing to primes: attempt() keeps the default refusal

    def test_a_real_service_report_conforms(self, tmp_path):
        from strata_primes.service import ScratchDiskService

        service = ScratchDiskService(tmp_path / "primes")
        service.start()
        report = json.loads(json.dumps(service.report()))  # as it goes over the wire
        service.stop()
        self.node_payloads = (report,)
        self.test_real_payloads_are_accepted_and_normalizing_is_idempotent()
        self.test_node_payloads_split_into_json_parts()

    def test_attempts_report_nothing(self):
        with pytest.raises(ReportError, match="takes no attempt reports"):
            self.schema().attempt({"disk_free": 1, "disk_total": 2, "load1": 0.5})

    def test_an_integer_too_large_for_a_float_is_a_report_error(self):
        with pytest.raises(ReportError):
            self.schema().node({"disk_free": 1, "disk_total": 10**400, "load1": 0.5})
