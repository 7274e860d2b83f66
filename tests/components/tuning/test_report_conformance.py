"""tuning's report schema against the ReportSchemaConformance suite, with the tables a tune attempt publishes
(``Engine.table()`` through ``ctx.report("tuning", ...)``): the recorded ones of test_report, the first one of a
sweep, and every one a simulated ASHA and PBT sweep (test_component's SimulatedCluster) published."""

from __future__ import annotations

import json

import pytest
from support import sibling_module

from components.runtime.contract.plugins import ReportError
from components.runtime.testing.conformance.reports import ReportSchemaConformance


def _sibling(name: str):
    return sibling_module(__file__, name)


GOOD = _sibling("test_report").GOOD
PBT = {**GOOD, "trials": [{**GOOD["trials"][0], "jobs": ["j9"],
                           "exploits": [{"iteration": 2, "from": 1, "params": {"lr": 0.02}, "job": "j0"}]}],
       "rungs": [{"iteration": 2, "trial": "0", "from": "1", "config": {"lr": 0.02}}]}  # PBT.rungs(): its exploits
FIRST = {"metric": "test_accuracy", "mode": "max", "budget": 2, "trials": [], "best": None, "rungs": []}


def published(tmp_path, **overrides) -> list[dict]:
    """Every table a simulated sweep published, as each went over the wire."""
    sim = _sibling("test_component")
    ctx = sim.SimulatedCluster(tmp_path, gpus=1.0)
    tables: list[dict] = []
    ctx.report = lambda plugin, payload: tables.append(json.loads(json.dumps(payload))) if plugin == "tuning" \
        else None
    sim.run(ctx, sim.tune_spec(**overrides))
    assert tables, "the sweep published no table"
    return tables


class TestTuningReportSchema(ReportSchemaConformance):
    report_path = "components.tuning.report:TuningReport"
    node_payloads = ()  # nodes report nothing to tuning: node() keeps the default refusal
    attempt_payloads = (FIRST, GOOD, PBT)

    @pytest.mark.parametrize("overrides", [
        {},
        {"space": {"curve": {"type": "choice", "values": [0, 5, 10, 15, 20, 25]}}, "trials": 6, "max_concurrent": 6,
         "scheduler": {"name": "pbt", "options": {"perturbation_interval": 2, "quantile_fraction": 0.34,
                                                  "hyperparam_mutations": {"curve": {"values": [0, 5, 10, 15]}}}}},
    ], ids=["asha", "pbt"])
    def test_a_real_sweeps_tables_conform(self, tmp_path, overrides):
        tables = published(tmp_path, **overrides)
        assert tables[-1]["trials"] and tables[-1]["best"] is not None
        self.attempt_payloads = tuple(tables)
        self.test_real_payloads_are_accepted_and_normalizing_is_idempotent()

    def test_nodes_report_nothing(self):
        with pytest.raises(ReportError, match="takes no node reports"):
            self.schema().node(GOOD)

    def test_an_integer_too_large_for_a_float_is_a_report_error(self):
        with pytest.raises(ReportError):
            self.schema().attempt({**GOOD, "budget": 10**400})
