"""datacache's node metrics: the conformance suite, and real values from a real cache's report."""

from __future__ import annotations

import numpy as np

from components.datacache.report import DataCacheReport
from components.datacache.service import DataCacheService
from components.runtime.contract.plugins import Sample
from components.runtime.testing.conformance.reports import MetricsConformance

REPORT = {"time": 5.0, "bytes": 2 << 20, "budget": 1 << 30, "hits": 3, "misses": 1, "evictions": 2, "corrupt": 0,
          "uncached": 1, "entries": [{"key": "k" * 16, "dataset": "pets", "pipeline": "p", "part": "variant-0",
                                      "bytes": 2 << 20, "hits": 3, "last_used": 5.0, "build_seconds": 1.0}]}


class TestDataCacheMetrics(MetricsConformance):
    plugin = "datacache"
    report_path = "components.datacache.report:DataCacheReport"
    reports = (REPORT, {**REPORT, "hits": 0, "misses": 0, "entries": []})


def _values(samples: list[Sample]) -> dict[str, float]:
    return {sample.name: sample.value for sample in samples}


def test_a_real_cache_report_becomes_its_sizes_and_counts(tmp_path):
    service = DataCacheService(tmp_path / "cache", budget=64 << 20)
    service.start()
    arrays = {"x": np.arange(1000, dtype=np.float32)}
    for _ in range(3):  # one miss, then two hits
        service.store.get("a" * 64, lambda: arrays, meta={"dataset": "d", "pipeline": "p", "part": "0"})
    report = DataCacheService.merge([service.report()])
    values = _values(list(DataCacheReport().metrics(report)))
    assert values["strata_datacache_misses_total"] == 1
    assert values["strata_datacache_hits_total"] == 2
    assert values["strata_datacache_budget_bytes"] == 64 << 20
    assert values["strata_datacache_bytes"] == report["bytes"] > 0
    assert values["strata_datacache_entries_reported"] == 1
    assert values["strata_datacache_hit_ratio"] == 2 / 3
    service.stop()


def test_no_lookup_yet_has_no_hit_ratio():
    values = _values(list(DataCacheReport().metrics({**REPORT, "hits": 0, "misses": 0})))
    assert "strata_datacache_hit_ratio" not in values
    assert values["strata_datacache_evictions_total"] == 2
