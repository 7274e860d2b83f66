"""The tune kind's panels against the Panel conformance suite, from a recorded sweep (the engine's report of a
simulated ASHA sweep), and what each shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import sibling_module

from components.runtime.contract.panels import StaticPanelData
from components.runtime.testing.conformance.job_routes import JobRouteConformance
from components.runtime.testing.conformance.panels import PanelConformance
from components.tuning.panels import ParametersPanel, RungsPanel, SharesPanel, TrialCurvesPanel

HERE = Path(__file__).parent


def _report(tmp: Path) -> dict:
    module = sibling_module(__file__, "test_component")
    ctx = module.SimulatedCluster(tmp, gpus=1.0)
    spec_ = module.tune_spec()
    spec_["space"] = {"curve": {"type": "int", "low": 0, "high": 26}, "opt": {"type": "choice",
                                                                               "values": ["adam", "sgd"]}}
    module.run(ctx, spec_)
    return ctx.reports["tuning"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("sweep"))


def sweep_data(report) -> StaticPanelData:
    jobs = [{"id": row["job"], "name": f"trial-{row['number']}", "state": "SUCCEEDED"} for row in report["trials"]]
    return StaticPanelData(job={"id": "sweep", "kind": "tune", "state": "SUCCEEDED"},
                           reports={"tuning": {"attempts": [{"job_id": "sweep", "time": 1.0, "payload": report}]}},
                           children=jobs)


class _Base(PanelConformance):
    def data(self):
        return sweep_data(_report(Path(__import__("tempfile").mkdtemp())))


class TestTrialCurvesPanel(_Base):
    panel_path = "components.tuning.panels:TrialCurvesPanel"


class TestParametersPanel(_Base):
    panel_path = "components.tuning.panels:ParametersPanel"


class TestRungsPanel(_Base):
    panel_path = "components.tuning.panels:RungsPanel"


class TestSharesPanel(_Base):
    panel_path = "components.tuning.panels:SharesPanel"


def test_curves_mark_stopped_trials_and_the_best(report):
    figure = TrialCurvesPanel().render(sweep_data(report))["figure"]
    lines = {line["name"]: line for line in figure["data"]}
    assert len(lines) == len(report["trials"])
    best = f"trial {report['best']['number']}"
    assert lines[best]["line"]["width"] == 4
    stopped = [row for row in report["trials"] if row["status"] == "stopped"]
    assert stopped and all(lines[f"trial {row['number']}"]["marker"]["symbol"][-1] == "x" for row in stopped)
    json.dumps(figure)


def test_parameters_rungs_and_shares(report):
    data = sweep_data(report)
    parcoords = ParametersPanel().render(data)["figure"]["data"][0]
    labels = [dimension["label"] for dimension in parcoords["dimensions"]]
    assert labels == ["curve", "opt", "test_accuracy"]
    assert parcoords["dimensions"][1]["ticktext"] == sorted({row["params"]["opt"] for row in report["trials"]})
    rungs = RungsPanel().render(data)["table"]
    assert rungs["columns"][0] == "iteration" and [row[0] for row in rungs["rows"]][:3] == [1, 3, 9]
    shares = SharesPanel().render(data)["figure"]
    # At every moment the stacked shares stay within the tune job's one GPU.
    totals = [sum(trace["y"][index] for trace in shares["data"]) for index in range(len(shares["data"][0]["y"]))]
    assert max(totals) <= 1.0 + 1e-9 and max(totals) > 0.5


def test_nothing_to_show_before_the_first_report():
    empty = StaticPanelData(job={"id": "sweep", "kind": "tune", "state": "RUNNING"})
    assert all(panel().render(empty) is None for panel in (TrialCurvesPanel, ParametersPanel, RungsPanel, SharesPanel))


class TestTrialsRoute(JobRouteConformance):
    """``GET /api/v1/jobs/{id}/trials/`` answers JSON matching its declared schema, for a recorded sweep."""

    route_path = "components.tuning.report:trials"

    def examples(self):
        return [sweep_data(_report(Path(__import__("tempfile").mkdtemp())))]
