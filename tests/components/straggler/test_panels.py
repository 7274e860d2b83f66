"""The straggler panels: the panel contract, and what each shows from reports and rank-tagged metrics."""

from __future__ import annotations

from typing import ClassVar

from components.runtime.contract.panels import StaticPanelData
from components.runtime.testing.conformance.panels import PanelConformance
from components.straggler.panels import (
    NodeGroupsPanel,
    PredictedStragglersPanel,
    SavingsPanel,
    StepTimeHeatmapPanel,
    straggler_cost,
)

JOB = {"id": "j", "kind": "train", "state": "RUNNING",
       "spec": {"workload": "cnn-synthetic", "distributed": {"strategy": "sms"}}}
# Rank 1 takes twice as long as rank 0 over steps 10-30 (10 steps a window), then catches up.
SERIES = {
    "rank0.step_ms": [(10, 10.0, 1.0), (20, 10.0, 2.0), (30, 10.0, 3.0), (40, 10.0, 4.0)],
    "rank1.step_ms": [(10, 10.0, 1.0), (20, 20.0, 2.0), (30, 20.0, 3.0), (40, 10.5, 4.0)],
    "rank1.slowed_steps": [(40, 20.0, 4.0)],
    "loss": [(10, 1.0, 1.0)],
}
ATTEMPT = {"strategy": "sms", "world_size": 2, "step": 40,
           "ranks": [{"rank": 0, "node": "n1", "step_ms": 10.0, "keep": 1.0},
                     {"rank": 1, "node": "n2", "step_ms": 10.5, "keep": 0.5}],
           "heatmap": {"steps": [39, 40], "ms": [[10.0, 10.5], [10.0, 10.4]]},
           "stragglers": {"predicted": [[21, 1], [22, 1]], "actual": [[20, 1], [21, 1], [22, 1]],
                          "precision": 1.0, "recall": 0.67},
           "dropped_samples": 640, "bytes_sent": 750, "bytes_skipped": 250, "bytes_full": 1000}


def node(name: str, level: float, spread: float) -> dict:
    resources = ("cpu", "memory", "gpu", "network")
    return {"node": name, "node_id": name, "time": 5.0,
            "payload": {"predicted": {r: level for r in resources}, "std": {r: spread for r in resources},
                        "current": {r: level for r in resources},
                        "accuracy": {"mae": {r: 0.05 for r in resources}, "naive_mae": {r: 0.1 for r in resources},
                                     "n": 12}, "horizon_s": 60.0, "samples": 100}}


NODES = [node("steady-1", 0.95, 0.01), node("steady-2", 0.94, 0.01), node("steady-3", 0.96, 0.012),
         node("busy-1", 0.3, 0.2), node("busy-2", 0.25, 0.22), node("busy-3", 0.35, 0.18)]
REPORTS = {"straggler": {"nodes": NODES, "devices": [], "series": [],
                         "attempts": [{"attempt": "a", "number": 1, "job_id": "j", "job_name": "x", "foreign": False,
                                       "device": None, "time": 5.0, "current": True, "payload": ATTEMPT}]}}


def data() -> StaticPanelData:
    return StaticPanelData(job=JOB, metrics=SERIES, reports=REPORTS)


class _Panel(PanelConformance):
    job_view: ClassVar[dict] = JOB

    def data(self):
        return data()


class TestStepTimeHeatmapPanel(_Panel):
    panel_path = "components.straggler.panels:StepTimeHeatmapPanel"


class TestPredictedStragglersPanel(_Panel):
    panel_path = "components.straggler.panels:PredictedStragglersPanel"


class TestSavingsPanel(_Panel):
    panel_path = "components.straggler.panels:SavingsPanel"


class TestNodeGroupsPanel(_Panel):
    panel_path = "components.straggler.panels:NodeGroupsPanel"


def test_the_heatmap_names_the_straggler_when_and_what_it_cost():
    content = StepTimeHeatmapPanel().render(data())
    heatmap = content["figure"]["data"][0]
    assert heatmap["y"] == ["rank 0", "rank 1"] and heatmap["x"] == [10, 20, 30, 40]
    assert heatmap["z"][1] == [10.0, 20.0, 20.0, 10.5]
    rows = {row[0]: row for row in content["table"]["rows"]}
    assert rows["rank 1"][2] == 2 and rows["rank 0"][2] == 0  # two windows as the straggler
    assert rows["rank 1"][3] == 20
    # (20 - 15) ms x 10 steps, twice: 0.1 s lost waiting for rank 1.
    assert rows["time lost waiting for the slowest worker"][1] == "0.1 s"
    worst, lost = straggler_cost({0: {10: 10.0, 20: 10.0}, 1: {10: 10.0, 20: 30.0}})
    assert worst == {20: 1} and abs(lost - 0.1) < 1e-9


def test_only_distributed_jobs_get_the_job_panels():
    plain = {"id": "p", "kind": "train", "spec": {"workload": "mlp-digits"}}
    for panel in (StepTimeHeatmapPanel(), PredictedStragglersPanel(), SavingsPanel()):
        assert panel.applies(JOB) and not panel.applies(plain)
    ddp = {**JOB, "spec": {"distributed": {"strategy": "ddp"}}}
    assert StepTimeHeatmapPanel().applies(ddp) and not PredictedStragglersPanel().applies(ddp)
    assert not SavingsPanel().applies(ddp)


def test_predictions_and_savings_come_from_the_latest_attempt_report():
    predicted = PredictedStragglersPanel().render(data())
    rows = dict(predicted["table"]["rows"])
    assert rows["Predicted"] == 2 and rows["Actual"] == 3 and rows["Precision"] == "1.00"
    savings = SavingsPanel().render(data())
    rows = dict(savings["table"]["rows"])
    assert rows["Samples dropped (near duplicates)"] == 640 and rows["Saved"] == "25.0 %"
    assert savings["figure"]["data"][0]["y"] == [750, 250, 1000]


def test_the_cluster_panel_groups_steady_and_busy_nodes_apart():
    content = NodeGroupsPanel().render(data())
    groups = {row[0]: row[1] for row in content["table"]["rows"]}
    assert groups["steady-1"] == groups["steady-2"] == groups["steady-3"]
    assert groups["busy-1"] == groups["busy-2"] == groups["busy-3"] != groups["steady-1"]
    assert all(row[-1] == 12 and "naive" in row[-2] for row in content["table"]["rows"])
