"""The straggler report schema: a node's availability forecast (heartbeats) and a distributed attempt's
straggler picture (attempt reports). Good payloads pass unchanged and idempotently; every bad field is named;
unknown keys, NaN and oversized lists are refused."""

from __future__ import annotations

import copy
import json

import pytest

from components.runtime.contract.plugins import ReportError
from components.straggler.report import MAX_PAIRS, MAX_STEPS, StragglerReport

FRACTIONS = {"cpu": 0.7, "memory": 0.5, "gpu": 0.9, "network": 0.99}
NODE = {"time": 1700000000.0, "predicted": FRACTIONS, "std": {"cpu": 0.05, "memory": 0.01, "gpu": 0.1,
                                                              "network": 0.02},
        "current": {"cpu": 0.6, "memory": 0.5, "gpu": 1.0, "network": 1.0},
        "accuracy": {"mae": {"cpu": 0.04, "memory": None, "gpu": 0.1, "network": 0.0},
                     "naive_mae": {"cpu": 0.08, "memory": None, "gpu": 0.2, "network": 0.0}, "n": 12},
        "horizon_s": 60.0, "samples": 600, "model": "ridge", "gpu_source": "cpu", "load": 0.4}

ATTEMPT = {"strategy": "sms", "world_size": 2, "step": 40,
           "ranks": [{"rank": 0, "node": "n1", "step_ms": 120.5, "keep": 1.0},
                     {"rank": 1, "node": "n2", "step_ms": 250.0, "keep": 0.5}],
           "heatmap": {"steps": [38, 39, 40], "ms": [[120.0, 240.0], [119.0, None], [121.0, 250.0]]},
           "stragglers": {"predicted": [[39, 1], [40, 1]], "actual": [[40, 1]], "precision": 0.5, "recall": 1.0},
           "dropped_samples": 64, "bytes_sent": 1000, "bytes_skipped": 300, "bytes_full": 1300,
           "phases": {"compute": 0.2, "sync": 0.05}}


def errors_of(call, payload) -> dict[str, str]:
    with pytest.raises(ReportError) as caught:
        call(payload)
    return caught.value.errors


def test_a_good_node_report_passes_unchanged_and_idempotently():
    schema = StragglerReport()
    clean = schema.node(copy.deepcopy(NODE))
    assert clean == NODE
    assert schema.node(clean) == clean
    json.dumps(clean)
    minimal = {key: NODE[key] for key in ("predicted", "std", "current", "horizon_s", "samples")}
    minimal["accuracy"] = {"mae": {"cpu": None}, "n": 0}
    minimal.update(predicted={"cpu": 1.0}, std={"cpu": 0.0}, current={"cpu": 1})
    assert schema.node(minimal)["predicted"] == {"cpu": 1.0}


def test_every_bad_node_field_is_named():
    bad = {**NODE, "predicted": {"cpu": 1.5, "disk": 0.3}, "std": {"cpu": float("nan")}, "current": "x",
           "accuracy": {"mae": {"cpu": -1}, "n": -1}, "horizon_s": 0, "samples": 1.5, "model": "lstm",
           "gpu_source": "magic", "time": float("inf"), "load": float("nan")}
    errors = errors_of(StragglerReport().node, bad)
    assert {"predicted.cpu", "predicted.disk", "std.cpu", "current", "accuracy.mae.cpu", "accuracy.n",
            "horizon_s", "samples", "model", "gpu_source", "time", "load"} <= set(errors)
    assert "must be an object" in errors_of(StragglerReport().node, [1])[""]
    errors = errors_of(StragglerReport().node, {**NODE, "predicted": {"cpu": 0.5}})
    assert "same resources" in errors["std"]


def test_unknown_node_keys_are_refused_by_name():
    errors = errors_of(StragglerReport().node, {**NODE, "colour": "red", "accuracy": {**NODE["accuracy"], "x": 1}})
    assert "colour" in errors[""] and errors["colour"] == "unknown key"
    assert "accuracy.x" in errors


def test_parts_keep_the_node_report_and_one_series_row_at_the_nodes_time():
    schema = StragglerReport()
    parts = schema.parts(schema.node(NODE))
    assert parts.node == NODE
    assert parts.series == [{"start": NODE["time"], "end": NODE["time"], "device": None, "attempt": None,
                             "data": {"current": NODE["current"], "predicted": NODE["predicted"],
                                      "std": NODE["std"]}}]
    untimed = schema.node({key: value for key, value in NODE.items() if key != "time"})
    assert schema.parts(untimed).series == []


def test_a_good_attempt_report_passes_and_defaults_fill_the_rest():
    schema = StragglerReport()
    assert schema.attempt(copy.deepcopy(ATTEMPT)) == ATTEMPT
    assert schema.attempt(schema.attempt(ATTEMPT)) == ATTEMPT
    bare = schema.attempt({"strategy": "stanza", "world_size": 3, "step": 0})
    assert bare == {"strategy": "stanza", "world_size": 3, "step": 0, "ranks": [],
                    "heatmap": {"steps": [], "ms": []},
                    "stragglers": {"predicted": [], "actual": [], "precision": None, "recall": None},
                    "dropped_samples": 0, "bytes_sent": 0, "bytes_skipped": 0, "bytes_full": 0, "phases": {}}
    assert schema.attempt(bare) == bare
    json.dumps(bare)


def test_every_bad_attempt_field_is_named():
    bad = {**ATTEMPT, "strategy": "", "world_size": 0, "step": -1,
           "ranks": [{"rank": -1, "node": 3, "step_ms": float("nan"), "keep": 2.0}, "x"],
           "heatmap": {"steps": [1, 2], "ms": [[1.0], [float("nan")]]},
           "stragglers": {"predicted": [[1]], "actual": [[1, 2, 3]], "precision": 1.5, "recall": "high"},
           "dropped_samples": -5, "bytes_sent": 1.5, "phases": {"compute": float("inf")}}
    errors = errors_of(StragglerReport().attempt, bad)
    assert {"strategy", "world_size", "step", "ranks.0.rank", "ranks.0.node", "ranks.0.step_ms", "ranks.0.keep",
            "ranks.1", "heatmap.ms.1", "stragglers.predicted", "stragglers.actual", "stragglers.precision",
            "stragglers.recall", "dropped_samples", "bytes_sent", "phases.compute"} <= set(errors)
    assert "strategy" in errors_of(StragglerReport().attempt, {"world_size": 1, "step": 0})


def test_unknown_attempt_keys_are_refused_by_name_at_every_level():
    errors = errors_of(StragglerReport().attempt, {
        **ATTEMPT, "gpu": 1, "ranks": [{**ATTEMPT["ranks"][0], "speed": 2}],
        "heatmap": {**ATTEMPT["heatmap"], "colour": "red"}, "stragglers": {**ATTEMPT["stragglers"], "f1": 0.6}})
    assert "gpu" in errors[""] and "gpu" in errors
    assert {"ranks.0.speed", "heatmap.colour", "stragglers.f1"} <= set(errors)


def test_list_sizes_are_capped():
    steps = list(range(MAX_STEPS + 1))
    errors = errors_of(StragglerReport().attempt, {**ATTEMPT, "heatmap": {"steps": steps, "ms": [[1.0]] * len(steps)}})
    assert "heatmap.steps" in errors
    pairs = [[step, 0] for step in range(MAX_PAIRS + 1)]
    errors = errors_of(StragglerReport().attempt, {**ATTEMPT, "stragglers": {"predicted": pairs}})
    assert "stragglers.predicted" in errors
    full = StragglerReport().attempt({**ATTEMPT, "heatmap": {"steps": steps[:-1], "ms": [[1.0]] * MAX_STEPS},
                                      "stragglers": {"predicted": pairs[:-1], "actual": pairs[:-1]}})
    assert len(full["heatmap"]["steps"]) == MAX_STEPS and len(full["stragglers"]["actual"]) == MAX_PAIRS
    errors = errors_of(StragglerReport().attempt, {**ATTEMPT, "heatmap": {"steps": [1, 2], "ms": [[1.0]]}})
    assert "heatmap.ms" in errors
