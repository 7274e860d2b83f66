"""datacache's report schema against the ReportSchemaConformance suite, with the payloads its node service sends
(DataCacheService.report(), merged): a cache with entries, an empty one, and one read from a real cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import sibling_module

from components.datacache.service import DataCacheService
from components.runtime.contract.plugins import ReportError
from components.runtime.testing.conformance.reports import ReportSchemaConformance


def _sibling(name: str):
    return sibling_module(__file__, name)


REPORT = _sibling("test_metrics").REPORT  # what DataCacheService.report() sends, with one entry
EMPTY = {"time": 1700000000.25, "bytes": 0, "budget": 4 << 30, "hits": 0, "misses": 0, "evictions": 0,
         "corrupt": 0, "uncached": 0, "entries": []}  # a node whose cache holds nothing yet


class TestDataCacheReportSchema(ReportSchemaConformance):
    report_path = "components.datacache.report:DataCacheReport"
    node_payloads = (REPORT, EMPTY)
    attempt_payloads = ()  # attempts report nothing to datacache: attempt() keeps the default refusal

    def test_a_real_cache_report_conforms(self, tmp_path):
        service = DataCacheService(tmp_path / "cache", budget=64 << 20)
        service.start()
        arrays = {"x": np.arange(1000, dtype=np.float32)}
        for part in ("0", "1", "0"):  # two misses, then a hit
            service.store.get(part * 64, lambda: arrays, meta={"dataset": "d", "pipeline": "p", "part": part})
        report = json.loads(json.dumps(DataCacheService.merge([service.report()])))  # as it goes over the wire
        service.stop()
        assert len(report["entries"]) == 2 and report["hits"] == 1 and report["misses"] == 2
        self.node_payloads = (report,)
        self.test_real_payloads_are_accepted_and_normalizing_is_idempotent()
        self.test_node_payloads_split_into_json_parts()

    def test_attempts_report_nothing(self):
        with pytest.raises(ReportError, match="takes no attempt reports"):
            self.schema().attempt(REPORT)

    def test_an_integer_too_large_for_a_float_is_a_report_error(self):
        with pytest.raises(ReportError):
            self.schema().node({**REPORT, "time": 10**400})
