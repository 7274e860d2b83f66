"""straggler's report schema against the ReportSchemaConformance suite, with the payloads the plugin sends: the
AvailabilityService's forecast with every heartbeat (node), and the SMS and Stanza strategies' reports from
rank 0 of a distributed attempt (``SMSRuntime.report()`` and ``StanzaRuntime.report()``, as they arrive over JSON)."""

from __future__ import annotations

import json

import pytest
from support import sibling_module

from components.runtime.contract.plugins import ReportError
from components.runtime.contract.services import NodeInfo
from components.runtime.testing.conformance.reports import ReportSchemaConformance
from components.straggler.availability import AvailabilityService


def _sibling(name: str):
    return sibling_module(__file__, name)


_report = _sibling("test_report")
NODE, ATTEMPT = _report.NODE, _report.ATTEMPT
# The service's first forecast: a few samples, no scored accuracy yet, the naive model, no GPU on the node.
FIRST = {"time": 1700000000.5, "predicted": {"cpu": 0.61, "memory": 0.5, "gpu": 1.0, "network": 1.0},
         "std": {"cpu": 0.0, "memory": 0.0, "gpu": 0.0, "network": 0.0},
         "current": {"cpu": 0.61, "memory": 0.5, "gpu": 1.0, "network": 1.0},
         "accuracy": {"mae": {"cpu": None, "memory": None, "gpu": None, "network": None},
                      "naive_mae": {"cpu": None, "memory": None, "gpu": None, "network": None}, "n": 0},
         "horizon_s": 60.0, "samples": 1, "model": "naive", "gpu_source": "none", "load": 0.0}
# SMSRuntime.report() at its first step (no heatmap row yet, no straggler seen) and StanzaRuntime.report() (with its phases).
SMS_EARLY = {"strategy": "sms", "world_size": 3, "step": 0,
             "ranks": [{"rank": rank, "node": f"n{rank}", "step_ms": 0.0, "keep": 1.0} for rank in range(3)],
             "heatmap": {"steps": [], "ms": []},
             "stragglers": {"predicted": [], "actual": [], "precision": None, "recall": None},
             "dropped_samples": 0, "bytes_sent": 0, "bytes_skipped": 0, "bytes_full": 0}
STANZA = {"strategy": "stanza", "world_size": 2, "step": 12,
          "ranks": [{"rank": 0, "node": "n0", "step_ms": 81.25, "keep": 1.0},
                    {"rank": 1, "node": "", "step_ms": 90.5, "keep": 1.0}],
          "heatmap": {"steps": [11, 12], "ms": [[80.0, 91.0], [82.5, 90.0]]},
          "stragglers": {"predicted": [], "actual": [], "precision": None, "recall": None},
          "dropped_samples": 0, "bytes_sent": 4096, "bytes_skipped": 0, "bytes_full": 1 << 20,
          "phases": {"conv_ms": 50.125, "fc_ms": 10.0, "exchange_ms": 21.5}}


class TestStragglerReportSchema(ReportSchemaConformance):
    report_path = "components.straggler.report:StragglerReport"
    node_payloads = (NODE, FIRST, {key: value for key, value in NODE.items() if key != "time"})
    attempt_payloads = (ATTEMPT, SMS_EARLY, STANZA)

    def test_a_real_availability_service_report_conforms(self):
        service = AvailabilityService(NodeInfo(name="n"), interval_s=1.0, horizon_s=10.0, history=200)
        service.sampler = _sibling("test_availability").FakeSampler()
        for index in range(60):
            service.step(float(index), fit=index % 30 == 29, forecast=index % 5 == 0 or index == 59)
        report = json.loads(json.dumps(service.report()))  # as it goes over the wire
        self.node_payloads = (report,)
        self.test_real_payloads_are_accepted_and_normalizing_is_idempotent()
        self.test_node_payloads_split_into_json_parts()

    def test_a_timed_node_report_is_one_series_row(self):
        schema = self.schema()
        assert len(schema.parts(schema.node(NODE)).series) == 1
        assert schema.parts(schema.node({k: v for k, v in NODE.items() if k != "time"})).series == []

    def test_an_integer_too_large_for_a_float_is_a_report_error(self):
        with pytest.raises(ReportError):
            self.schema().attempt({**STANZA, "phases": {"conv_ms": 10**400}})
