"""A smoke run of ``strata bench serving`` at tiny sizes: every variant runs and answers every request.

It checks the harness (processes, gRPC, counts, the result's shape), not speed.
"""

import math

import pytest

from components.runtime.benchkit import document, validate_document
from components.serving import bench

TINY = {"model_steps": 2, "requests": 8, "request_interval_ms": 10.0, "warmup_requests": 1, "train_alone_s": 0.2}


def test_bench_tiny_smoke():
    lines = []
    results = bench.run(True, sizes=TINY, say=lines.append)

    assert set(results["variants"]) == set(bench.VARIANTS)
    assert results["requests"] == TINY["requests"]
    assert results["model"]["workload"] == "tiny-gpt" and results["model"]["input_shape"] == [64]
    for name, item in results["variants"].items():
        assert item["requests"] == TINY["requests"], name
        assert item["answered"] == TINY["requests"] and item["errors"] == {}, (name, item["errors"])
        assert 0 < item["p50_s"] <= item["p99_s"] <= item["max_s"], name
        # The endpoint saw the warm-up calls and every measured call, and failed none.
        assert item["endpoint"]["requests"] == TINY["warmup_requests"] + TINY["requests"], name
        assert item["endpoint"]["errors"] == 0, name
        trains = name != "inference_alone"
        assert ("train_steps_per_s" in item) is trains, name
        if trains:  # a window of a few hundred ms may hold no whole step: only the figures' presence is checked
            assert item["train_alone_steps_per_s"] >= 0 and item["train_steps_per_s"] >= 0, name
    assert results["variants"]["switchflow"]["served_between_operators"] >= 0
    assert results["variants"]["switchflow_stages_only"]["served_between_operators"] == 0
    for key in ("ratio", "ratio_vs_whole_graph_fifo", "ratio_vs_stages_only"):
        assert math.isfinite(results[key]) and results[key] > 0, key
    assert isinstance(results["met"], bool)
    common = {figure.key: figure.as_dict() for figure in bench.figures(results)}
    assert common["inference_p99"]["ratio"] == pytest.approx(results["ratio"])
    assert common["inference_p99"]["target"] == bench.TARGET
    assert validate_document(document("serving", True, bench.figures(results), details=results)) == []
    table = "\n".join(lines)
    assert "naive p99 / SwitchFlow p99" in table and "whole_graph_fifo" in table
