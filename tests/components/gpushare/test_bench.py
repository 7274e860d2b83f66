"""A smoke run of the benchmark harness at tiny sizes: every figure runs and reports its ratio."""

import math

import pytest

from benchmarks.benchkit import document, validate_document
from benchmarks.gpushare import bench

TINY = {
    "switch_steps": 8, "checkpoint_switches": 6,
    "trace_jobs": 4, "trace_scale": 0.15, "load": 0.8,
    "pack_jobs": 2, "pack_steps": 8, "host_ms": 3.0,
    "requests": 6, "request_interval_ms": 15.0, "train_alone_s": 0.2,
    "migration_low_steps": 10, "migration_hold_steps": 4, "migration_requests": 6,
}


def test_bench_quick_smoke():
    lines = []
    results = bench.run(True, sizes=TINY, say=lines.append)
    figures = results["figures"]
    assert set(figures) == {"switch", "jct", "utilization", "inference", "migration"}
    for figure in figures.values():
        assert figure["ratio"] is not None and math.isfinite(figure["ratio"]) and figure["ratio"] > 0
        assert isinstance(figure["met"], bool)
    assert figures["switch"]["switches"] >= 10
    assert figures["switch"]["checkpoint_p50_s"] > figures["switch"]["switch_p50_s"]
    assert set(figures["jct"]["fifo"]["jct"]) == {job["job_id"] for job in figures["jct"]["trace"]}
    assert 0 < figures["utilization"]["exclusive_utilization"] <= 1
    assert 0 < figures["utilization"]["packed_utilization"] <= 1
    assert {"switchflow", "whole_graph_fifo", "naive"} <= set(figures["inference"]["variants"])
    migration = figures["migration"]
    assert migration["migrated_weights_bit_identical"] is True
    assert migration["held_by_job"]["migration"]["migration"]["migrations"] >= 1
    assert migration["held_by_job"]["preempt_only"]["low_steps_during_hold"] == 0  # it waited
    assert migration["held_by_job"]["migration"]["state"] == "succeeded"
    common = {figure.key: figure.as_dict() for figure in bench.common_figures(results)}
    assert set(common) == set(figures) | {"migration_inference"}
    for key, figure in common.items():  # the harness's ratios agree with the benchmark's own
        own = figures["migration"]["ratio_inference_p99"] if key == "migration_inference" else figures[key]["ratio"]
        assert figure["ratio"] == pytest.approx(own), key
    assert validate_document(document("gpushare", True, bench.common_figures(results), details=results)) == []
    table = lines[-1]
    assert "a. switch latency" in table and "d. inference p99" in table and "ratio" in table


def test_fifo_lock_hands_over_in_request_order():
    import threading
    import time

    lock = bench.FifoLock()
    lock.acquire()
    order = []

    def take(name):
        lock.acquire()
        order.append(name)
        lock.release()

    threads = []
    for name in "abc":
        thread = threading.Thread(target=take, args=(name,))
        thread.start()
        threads.append(thread)
        time.sleep(0.02)  # queue up in a known order
    lock.release()
    for thread in threads:
        thread.join(5)
    assert order == ["a", "b", "c"]
