"""``strata bench datacache``: the figures from measured runs, in the common JSON; the concurrent-trials part
run for real at its quick size."""

from __future__ import annotations

import json

import pytest

from benchmarks.benchkit import validate_document
from benchmarks.datacache import bench


def results() -> dict:
    def curve(times, accuracies):
        return [[t, a] for t, a in zip(times, accuracies, strict=True)]

    runs = {"perfect": [{"curve": curve([10, 20, 30], [0.5, 0.86, 0.9]), "reuse": 3}] * 3,
            "dataloader": [{"curve": curve([20, 40, 60], [0.5, 0.8, 0.9])}] * 3,
            "echo": [{"curve": curve([12, 24, 36], [0.4, 0.7, 0.8])}] * 3}
    return {"accuracy": {"definition": "shapes-jpeg", "epochs": 3, "target": 0.85, "runs": runs},
            "trials": {"trials": 4, "epochs": 2, "cpu_s": {"cached": [3.0, 3.2, 2.9], "alone": [12.5, 12.0, 13.1]}},
            "sweep": {"trials": 6, "iterations": 3, "images": 1000,
                      "makespan_s": {"cached": [50.0, 55.0, 52.0], "plain": [80.0, 90.0, 85.0]}}}


def test_figures_from_measured_runs():
    doc = bench.document("datacache", False, bench.figures(results()), details=results())
    assert validate_document(doc) == []
    figures = doc["figures"]
    dataloader = figures["time_to_accuracy_vs_dataloader"]
    assert (dataloader["mechanism"], dataloader["baseline"], dataloader["ratio"]) == (20, 60, 3.0)
    assert dataloader["target"] == 1.5 and dataloader["met"] is True
    assert figures["time_to_accuracy_vs_echo"]["baseline"] is None  # echoing never reached 0.85: no ratio
    # the mean of the last three evaluations: (0.5 + 0.86 + 0.9) / 3 against (0.5 + 0.8 + 0.9) / 3
    assert figures["final_accuracy_gap"]["gap_points"] == pytest.approx(2.0) and figures["final_accuracy_gap"]["met"]
    trials = figures["trial_preprocessing_cpu"]
    assert trials["ratio"] == pytest.approx(12.5 / 3.0) and trials["target"] == 4.0 and trials["met"] is True
    assert figures["sweep_makespan"]["ratio"] == pytest.approx(85 / 52)
    json.dumps(doc)


def test_time_to_is_the_first_epoch_at_the_target():
    assert bench.time_to([[1, 0.5], [2, 0.9], [3, 0.8]], 0.85) == 2
    assert bench.time_to([[1, 0.5]], 0.85) is None


@pytest.mark.timeout(600)
def test_the_quick_trials_part_runs_for_real(tmp_path):
    output = tmp_path / "bench.json"
    assert bench.main(quick=True, output=str(output), parts=("trials",)) == 0
    doc = json.loads(output.read_text())
    assert validate_document(doc) == []
    figure = doc["figures"]["trial_preprocessing_cpu"]
    # Two trials sharing one cache preprocess about half what two alone do.
    assert figure["mechanism"] > 0 and figure["ratio"] > 1.5, figure
