"""``strata bench straggler``: the figures from measured runs, in the common JSON (the runs themselves are the
benchmark's; gangs of the train loop are tested in tests/components/train/test_parallel.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.benchkit import validate_document
from benchmarks.straggler import bench


def gang(seconds: float, steps: int, evaluations: list, **extra) -> dict:
    accuracies = [accuracy for _, _, accuracy in evaluations]
    return {"seconds": seconds, "steps": steps, "evaluations": evaluations,
            "final_accuracy": sum(accuracies[-3:]) / len(accuracies[-3:]),
            "time_to_target": bench.time_to(evaluations, bench.SMS_TARGET), **extra}


def results() -> dict:
    # SMS: twice as fast per step, and trains on for 1.5x the steps; DDP and PostLocalSGD slower.
    sms = gang(6.0, 300, [(1.0, 50, 0.7), (2.0, 100, 0.85), (3.0, 150, 0.88), (4.0, 200, 0.89), (6.0, 300, 0.9)])
    ddp = gang(8.0, 200, [(2.0, 50, 0.7), (4.0, 100, 0.85), (6.0, 150, 0.88), (8.0, 200, 0.895)])
    local = gang(7.0, 200, [(1.5, 50, 0.6), (3.5, 100, 0.75), (5.5, 150, 0.85), (7.0, 200, 0.88)])
    scenario = {"runs": {"sms": [sms] * 3, "ddp": [ddp] * 3, "post-local-sgd": [local] * 3}}
    stanza = {"runs": {"stanza": [{"bytes_per_iteration": 3e5, "step_ms": 40.0, "final_accuracy": 0.7}] * 3,
                       "ddp": [{"bytes_per_iteration": 8.5e6, "step_ms": 250.0, "final_accuracy": 0.71}] * 3},
              "mbit": 100.0}
    sas = {"figures": {"sas-jct": {"figure": "average JCT", "mechanism": 2400.0, "baseline": 2600.0, "unit": "s",
                                   "lower_is_better": True, "target": 1.3, "runs": [1.0, 1.1, 1.08]}}}
    return {"sms": {"target": bench.SMS_TARGET, "scenarios": {"one-slow": scenario, "random": scenario}},
            "stanza": stanza, "sas": sas}


def test_interpolated_time_to_accuracy_and_accuracy_by_time_and_step():
    evaluations = [(1.0, 10, 0.6), (3.0, 20, 0.9), (4.0, 30, 0.95)]
    assert bench.time_to(evaluations, 0.8) == pytest.approx(1.0 + 2.0 * (0.2 / 0.3))
    assert bench.time_to(evaluations, 0.6) == pytest.approx(1.0 * 0.6 / 0.6)
    assert bench.time_to(evaluations, 0.99) is None
    assert bench.accuracy_at(evaluations, 3.5) == pytest.approx(0.75)
    assert bench.accuracy_at(evaluations, 0.5) is None
    assert bench.accuracy_by_step(evaluations, 30) == pytest.approx((0.6 + 0.9 + 0.95) / 3)


def test_figures_from_measured_runs():
    doc = bench.document("straggler", False, bench.figures(results()), details=results())
    assert validate_document(doc) == []
    figures = doc["figures"]
    versus_ddp = figures["sms_time_to_accuracy_one-slow_vs_ddp"]
    # 0.8 is crossed two thirds of the way from 0.7 to 0.85: SMS at 1.67 s, DDP at 3.33 s.
    assert versus_ddp["ratio"] == pytest.approx(2.0) and versus_ddp["target"] == pytest.approx(1 / 0.7)
    assert versus_ddp["met"] is True
    assert figures["sms_time_to_accuracy_random_vs_post-local-sgd"]["target"] is None
    # After DDP's 200 steps SMS had (0.85 + 0.88 + 0.89) / 3; DDP (0.85 + 0.88 + 0.895) / 3: 0.17 point behind.
    same_steps = figures["sms_final_accuracy_one-slow"]
    assert same_steps["gap_points"] == pytest.approx(-0.5 / 3) and same_steps["met"] is True
    # At DDP's 8 s, SMS had trained on to (0.88 + 0.89 + 0.9) / 3: ahead.
    same_time = figures["sms_accuracy_at_equal_time_one-slow"]
    assert same_time["gap_points"] == pytest.approx(((0.88 + 0.89 + 0.9) - (0.85 + 0.88 + 0.895)) / 3 * 100)
    assert figures["stanza_bytes_per_iteration"]["ratio"] == pytest.approx(8.5e6 / 3e5)
    assert figures["stanza_iteration_time"]["ratio"] == pytest.approx(250 / 40)
    assert figures["sas_jct"]["ratio"] == pytest.approx(2600 / 2400) and figures["sas_jct"]["met"] is False
    json.dumps(doc)
