"""Conformance suite for a plugin's node metrics (the manifest's ``metrics`` seam, :mod:`components.runtime.metrics`).

Subclass it, name your plugin and its function, and give real reports (what your node services' ``report()``,
merged, sends with a heartbeat)::

    class TestMyMetrics(MetricsConformance):
        plugin = "my-plugin"
        metrics_path = "my_plugin.metrics:metrics"
        reports = ({"bytes": 10, "hits": 3},)

It checks that the function's module is light, that every report gives samples whose names are valid Prometheus
names prefixed ``strata_<plugin>_`` (a counter's ending in ``_total``), whose values are finite numbers and whose
labels are strings (:func:`components.runtime.plugins.sample_problems`), that it is pure (the same report twice
gives the same samples; the report is not changed) and that a report that went through JSON gives the same,
that the node agent's collector serves them (parsed back from the exposition text, with the ``node`` label),
and that a malformed report either raises (costing only the plugin's samples) or gives valid samples.
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar

from components.runtime.conformance.kinds import light_import_problem
from components.runtime.plugins import Sample, metric_prefix, sample_problems
from components.runtime.registry import import_path


class MetricsConformance:
    plugin: ClassVar[str] = ""
    metrics_path: ClassVar[str] = ""
    reports: ClassVar[tuple[Any, ...]] = ()
    malformed: ClassVar[tuple[Any, ...]] = (None, {}, [], "x", {"devices": "x"}, {"bytes": -1})

    def function(self):
        function = import_path(self.metrics_path)
        assert callable(function) and not isinstance(function, type), f"{self.metrics_path} is not a function"
        return function

    def samples(self, report: Any) -> list[Sample]:
        return list(self.function()(report) or ())

    def test_it_is_light(self):
        assert light_import_problem(self.metrics_path.split(":")[0]) is None

    def test_reports_give_valid_prefixed_samples(self):
        assert self.plugin and self.reports, "name the plugin and give at least one real report"
        prefix = metric_prefix(self.plugin)
        for report in self.reports:
            samples = self.samples(copy.deepcopy(report))
            assert samples, f"no sample from {report!r}"
            assert sample_problems(self.plugin, samples) == []
            assert all(sample.name.startswith(prefix) for sample in samples)

    def test_it_is_pure(self):
        for report in self.reports:
            kept = copy.deepcopy(report)
            first = self.samples(report)
            assert report == kept, "the metrics function changed the report"
            assert self.samples(report) == first
            assert self.samples(json.loads(json.dumps(report))) == first  # as it went over the wire

    def test_the_node_collector_serves_them(self):
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.parser import text_string_to_metric_families

        from components.runtime.metrics import NodeCollector, NodeMetrics

        class _Options:
            name = "conformance-node"

        class _Agent:
            options = _Options()
            devices: list = []
            services = None

        for report in self.reports:
            metrics = NodeMetrics(_Agent(), plugin_metrics=lambda: {self.plugin: self.function()})
            metrics.observe([], {self.plugin: copy.deepcopy(report)}, [])
            registry = CollectorRegistry(auto_describe=False)
            registry.register(NodeCollector(metrics))
            text = generate_latest(registry).decode()
            served = {(s.name, tuple(sorted(s.labels.items()))): s.value
                      for family in text_string_to_metric_families(text) for s in family.samples}
            assert served[("strata_node_plugin_metrics_up",
                           (("node", "conformance-node"), ("plugin", self.plugin)))] == 1.0
            for sample in self.samples(copy.deepcopy(report)):
                key = (sample.name, tuple(sorted({**sample.labels, "node": "conformance-node"}.items())))
                assert key in served, f"{key} not served"
                assert served[key] == float(sample.value)

    def test_malformed_reports_raise_or_give_valid_samples(self):
        for report in self.malformed:
            try:
                samples = self.samples(report)
            except Exception:  # noqa: BLE001 - raising is allowed: it costs only this plugin's samples
                continue
            assert sample_problems(self.plugin, samples) == [], report
