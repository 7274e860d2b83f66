"""embeddings' report schema against the ReportSchemaConformance suite, with the reports a compress-embeddings
attempt publishes as it goes (``Compression.publish``): the first one (every result still null), the DLRM
model.pt path when done (reused from test_report) and the user embeddings.pt path (a field kept whole)."""

from __future__ import annotations

import pytest
from support import sibling_module

from components.runtime.contract.plugins import ReportError
from components.runtime.testing.conformance.reports import ReportSchemaConformance


def _sibling(name: str):
    return sibling_module(__file__, name)


DONE = _sibling("test_report").PAYLOAD
# Compression.__init__'s report, published with the first "loading" phase.
LOADING = {"phase": "loading", "source": "0b7a4c1e-1111-2222-3333-444455556666", "artifact": "model.pt",
           "workload": None, "dataset": None, "ratio_target": 8, "ratio": None, "bytes_before": None,
           "bytes_after": None, "clustering_s": None, "auc_before": None, "auc_after": None, "auc_finetuned": None,
           "logloss_before": None, "logloss_after": None, "logloss_finetuned": None, "fields": []}
# Compression.tables(): a user's embeddings.pt, one field clustered and one kept as a full table (no AUC).
TABLES = {**LOADING, "phase": "evaluating", "artifact": "embeddings.pt", "ratio_target": 4.0, "ratio": 3.2,
          "bytes_before": 6400, "bytes_after": 2000, "clustering_s": 0.75,
          "fields": [{"name": "user", "features": 100, "seen": 90, "distinct": 80, "head": 5, "lossless": False,
                      "distortion": 0.125, "clusters": 20, "bytes_before": 3200, "bytes_after": 400,
                      "seconds": 0.5, "delta_auc": None},
                     {"name": "item", "features": 50, "seen": 50, "distinct": 0, "clusters": None, "head": 0,
                      "bytes_before": 3200, "bytes_after": 3200, "seconds": 0.0, "lossless": True,
                      "distortion": 0.0, "delta_auc": None}]}


class TestCompressionReportSchema(ReportSchemaConformance):
    report_path = "components.embeddings.report:CompressionReport"
    node_payloads = ()  # nodes report nothing to embeddings: node() keeps the default refusal
    attempt_payloads = (LOADING, DONE, TABLES)

    def test_nodes_report_nothing(self):
        with pytest.raises(ReportError, match="takes no node reports"):
            self.schema().node(DONE)

    def test_an_integer_too_large_for_a_float_is_a_report_error(self):
        with pytest.raises(ReportError):
            self.schema().attempt({**DONE, "ratio": 10**400})
