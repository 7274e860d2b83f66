"""Conformance suites for a plugin's report schema (the manifest's ``reports`` seam,
:class:`components.runtime.contract.plugins.ReportSchema`): what it accepts, and its node metrics.

Subclass them with your schema and real payloads (what your node services' ``report()``, merged, sends with a
heartbeat, and what your component reports for an attempt)::

    class TestMyReports(ReportSchemaConformance):
        report_path = "my_plugin.report:MyReport"
        node_payloads = ({"bytes": 10, "hits": 3},)

    class TestMyMetrics(MetricsConformance):
        plugin = "my-plugin"
        report_path = "my_plugin.report:MyReport"
        reports = ({"bytes": 10, "hits": 3},)

:class:`ReportSchemaConformance` checks that the schema's module is light; that every real payload is accepted,
normalized to a JSON object that the schema accepts again unchanged (idempotent: a retried heartbeat stores the
same); that :meth:`~ReportSchema.parts` splits a node payload into a ``ReportParts`` of JSON values; and that a
malformed payload raises :class:`~components.runtime.contract.plugins.ReportError` (a 400 naming its fields), never another
exception (a 500).

:class:`MetricsConformance` checks the schema's :meth:`~ReportSchema.metrics`: every report gives samples whose
names are valid Prometheus names prefixed ``strata_<plugin>_`` (a counter's ending in ``_total``), whose values
are finite numbers and whose labels are strings (:func:`components.runtime.contract.plugins.sample_problems`); it is pure
(the same report twice gives the same samples; the report is not changed) and a report that went through JSON gives
the same; the node agent's collector serves them (parsed back from the exposition text, with the ``node`` label);
and a malformed report either raises (costing only the plugin's samples) or gives valid samples.
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar

from components.runtime.contract.plugins import (
    ReportError,
    ReportParts,
    ReportSchema,
    Sample,
    metric_prefix,
    sample_problems,
)
from components.runtime.contract.registry import import_path
from components.runtime.testing.conformance.kinds import light_import_problem


class ReportSchemaConformance:
    report_path: ClassVar[str] = ""
    node_payloads: ClassVar[tuple[Any, ...]] = ()
    attempt_payloads: ClassVar[tuple[Any, ...]] = ()
    malformed: ClassVar[tuple[Any, ...]] = (None, "x", 3, [], {"devices": "x"}, {"attempts": 7})

    def schema(self) -> ReportSchema:
        schema_class = import_path(self.report_path)
        assert isinstance(schema_class, type) and issubclass(schema_class, ReportSchema)
        return schema_class()

    def test_it_is_light(self):
        assert light_import_problem(self.report_path.split(":")[0]) is None

    def test_real_payloads_are_accepted_and_normalizing_is_idempotent(self):
        assert self.node_payloads or self.attempt_payloads, "give at least one real payload"
        schema = self.schema()
        for method, payloads in ((schema.node, self.node_payloads), (schema.attempt, self.attempt_payloads)):
            for payload in payloads:
                kept = copy.deepcopy(payload)
                normalized = method(copy.deepcopy(payload))
                assert isinstance(normalized, dict)
                assert json.loads(json.dumps(normalized)) == normalized, "a normalized payload must be JSON"
                assert method(json.loads(json.dumps(normalized))) == normalized, "normalizing is not idempotent"
                assert payload == kept

    def test_node_payloads_split_into_json_parts(self):
        schema = self.schema()
        for payload in self.node_payloads:
            parts = schema.parts(schema.node(copy.deepcopy(payload)))
            assert isinstance(parts, ReportParts)
            json.dumps([parts.node, {str(k): v for k, v in parts.devices.items()}, parts.attempts, parts.series])
            assert all(isinstance(index, int) for index in parts.devices)
            for row in parts.attempts:
                assert {"attempt", "device", "memory", "payload"} <= set(row)
            for row in parts.series:
                assert {"start", "end", "device", "attempt", "data"} <= set(row)

    def test_malformed_payloads_raise_a_report_error(self):
        schema = self.schema()
        for payload in self.malformed:
            for method in (schema.node, schema.attempt):
                try:
                    method(copy.deepcopy(payload))
                except ReportError as error:
                    assert isinstance(error.errors, dict) and error.errors
                # Anything else (a TypeError, a KeyError) would be a 500 on a heartbeat: the test fails on it.


class MetricsConformance:
    plugin: ClassVar[str] = ""
    report_path: ClassVar[str] = ""
    reports: ClassVar[tuple[Any, ...]] = ()
    malformed: ClassVar[tuple[Any, ...]] = (None, {}, [], "x", {"devices": "x"}, {"bytes": -1})

    def function(self):
        schema_class = import_path(self.report_path)
        assert isinstance(schema_class, type) and issubclass(schema_class, ReportSchema)
        assert schema_class.has_metrics(), f"{self.report_path} does not override ReportSchema.metrics"
        return schema_class().metrics

    def samples(self, report: Any) -> list[Sample]:
        return list(self.function()(report) or ())

    def test_it_is_light(self):
        assert light_import_problem(self.report_path.split(":")[0]) is None

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

        from components.runtime.node.metrics import NodeCollector, NodeMetrics

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
