"""A smoke run of ``strata bench serving`` at tiny sizes: every variant runs and answers every request.

It checks the harness (processes, gRPC, counts, the result's shape), not speed.
"""

import math

import pytest

from benchmarks.benchkit import document, validate_document
from benchmarks.serving import bench

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


def test_sla_and_emoe_parts_tiny_smoke():
    """The SLA part's harness (server and load-generator processes, calibration, every policy, the figures) and
    the eMoE part's, at tiny sizes: counts and shapes, not speed."""
    from benchmarks.serving import emoebench, slabench

    lines = []
    sizes = {"requests": 12, "warmup": 6, "calibration": 3, "overhead_calls": 5, "patterns": ["poisson"],
             "multipliers": [3.0], "static_multipliers": [3.0], "rate_rps": 50.0, "width": 32, "model_steps": 2,
             "exit_width": 16, "exit_steps": 2, "exit_pool": 6, "exit_load": 0.1}
    results = slabench.run(True, say=lines.append, sizes=sizes)
    for key in ("dynamic/poisson/3", "static/poisson/3", "early-exit/poisson/3"):
        assert set(results["runs"][key]) == set(slabench.POLICIES)
        for outcome in results["runs"][key].values():
            assert outcome["requests"] == 12 and 0 <= outcome["on_time"] <= 12
    assert set(results["calibration"]["dynamic"]) == {"short", "long"} and results["calibration"]["static"]["row"] > 0
    # The early-exit model: one SLO for every request (the client cannot tell how deep a row goes).
    assert results["calibration"]["early-exit"]["mean"] > 0
    for policy, stats in results["runs"]["early-exit/endpoint"].items():  # each row that ran left at one exit
        assert len(stats["exit_depths"]) == 4 and 0 < sum(stats["exit_depths"]) <= 6 + 12, policy
    assert results["overhead"]["grpc_p50_s"] > results["overhead"]["direct_p50_s"] > 0
    found = slabench.figures(results)
    keys = {figure.key for figure in found}
    assert keys == {"finish_rate_dynamic_vs_fifo", "finish_rate_dynamic_vs_edf", "finish_rate_static_vs_fifo",
                    "overhead_p50", "finish_rate_exit_3x_vs_fifo", "finish_rate_exit_3x_vs_edf"}
    assert "dynamic/poisson/3" in slabench.format_table(results)
    # Several runs: the medians, every run's values and the ranges.
    twice = {figure.key: figure.as_dict() for figure in slabench.combine([found, found])}
    assert set(twice) == keys
    one = {figure.key: figure.as_dict() for figure in found}["finish_rate_exit_3x_vs_edf"]
    assert twice["finish_rate_exit_3x_vs_edf"]["runs"]["mechanism"] == [one["mechanism"]] * 2
    assert twice["finish_rate_exit_3x_vs_edf"]["target"] == slabench.TARGET_EXIT_EDF
    assert validate_document(document("serving", True, slabench.combine([found, found]))) == []

    emoe = emoebench.run(True, say=lines.append, sizes={"steps": 2, "hidden": 16, "windows": 8, "batch": 4,
                                                         "warmup": 1, "step": 0.5})
    assert [row["budget"] for row in emoe["budgets"]] == [0.5, 1.0]
    assert emoe["load"]["relative"] == pytest.approx(0.0, abs=1e-6)  # misses loaded: the full model's outputs
    assert emoe["load"]["peak_fraction"] <= emoebench.TARGET_FRACTION + 1e-9
    figures = {figure.key: figure for figure in emoebench.figures(emoe)}
    assert figures["emoe_resident_fraction"].met is True
    assert validate_document(document("serving", True, [*slabench.figures(results), *emoebench.figures(emoe)])) == []
