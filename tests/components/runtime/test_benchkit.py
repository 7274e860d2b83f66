"""The one bench harness: percentiles, repeated runs, schedules, ratio orientation and the common document."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks import benchkit
from benchmarks.benchkit import Figure, percentile


def test_percentile_interpolates_between_order_statistics():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([4, 1, 3, 2], 0.5) == 2.5
    assert percentile(range(101), 0.99) == 99.0
    assert percentile([0, 10], 0.25) == 2.5
    values = [float(v) for v in range(1, 1001)]
    assert percentile(values, 0.5) == statistics.median(values)
    with pytest.raises(ValueError):
        percentile([1], 1.5)


def test_summary_and_repeat_report_median_and_range():
    assert benchkit.summary([])["count"] == 0
    summary = benchkit.summary([1, 2, 3, 4])
    assert summary["mean"] == 2.5 and summary["min"] == 1 and summary["max"] == 4 and summary["p50"] == 2.5
    values = iter([3.0, 1.0, 2.0])
    repeated = benchkit.repeat(lambda: next(values), runs=3)
    assert repeated == {"runs": [3.0, 1.0, 2.0], "median": 2.0, "range": [1.0, 3.0]}


def test_ratio_is_oriented_so_higher_is_better_for_us():
    latency = Figure("p99", "p99 latency", mechanism=0.002, baseline=0.01, unit="s", target=5.0)
    assert latency.ratio == pytest.approx(5.0) and latency.met is True
    throughput = Figure("tput", "throughput", mechanism=300.0, baseline=100.0, unit="req/s", lower_is_better=False,
                        target=4.0)
    assert throughput.ratio == pytest.approx(3.0) and throughput.met is False
    assert Figure("x", "x", None, 1.0, "s", target=2.0).met is False  # no measurement: the target is missed
    assert Figure("x", "x", 1.0, 2.0, "s").met is None  # no target
    assert Figure("x", "x", 0.0, 2.0, "s").ratio is None


def test_arrival_schedules_are_seeded_and_have_the_asked_rate():
    first = benchkit.poisson_arrivals(50.0, 4000, seed=3)
    assert first == benchkit.poisson_arrivals(50.0, 4000, seed=3)
    assert first != benchkit.poisson_arrivals(50.0, 4000, seed=4)
    assert all(a < b for a, b in zip(first, first[1:], strict=False))
    assert 4000 / first[-1] == pytest.approx(50.0, rel=0.08)
    uniform = benchkit.uniform_arrivals(0.1, 5)
    assert uniform == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    jittered = benchkit.uniform_arrivals(0.1, 100, jitter=0.2, seed=1)
    assert all(abs(t - (i + 1) * 0.1) <= 0.02 + 1e-12 for i, t in enumerate(jittered))
    with pytest.raises(ValueError):
        benchkit.poisson_arrivals(0, 10)


def test_the_document_has_the_common_shape_and_is_written_as_json(tmp_path):
    figures = [Figure("p99", "p99 latency", 0.002, 0.01, "s", target=5.0),
               Figure("util", "utilization", 0.9, 0.3, "busy", lower_is_better=False, target=2.0)]
    doc = benchkit.document("demo", True, figures, details={"nan": float("nan")})
    assert benchkit.validate_document(doc) == []
    assert doc["figures"]["p99"]["ratio"] == pytest.approx(5.0) and doc["figures"]["util"]["met"] is True
    path = tmp_path / "out.json"
    benchkit.write(doc, path)
    written = json.loads(path.read_text())
    assert written["details"] == {"nan": None} and benchkit.validate_document(written) == []
    with pytest.raises(ValueError):
        benchkit.document("demo", True, [figures[0], figures[0]])


def test_validate_document_names_what_is_wrong():
    assert benchkit.validate_document([]) == ["the document must be an object"]
    problems = benchkit.validate_document({"benchmark": "x", "quick": "yes", "machine": {}, "figures": {
        "a": {"figure": "a", "mechanism": "fast", "baseline": 1.0, "unit": "s", "ratio": 2.0, "target": 3.0,
              "met": True}, "b": {"figure": "b"}}})
    assert "quick must be a bool" in problems
    assert "figures.a.mechanism must be a finite number or null" in problems
    assert "figures.a.met disagrees with ratio and target" in problems
    assert "figures.b.ratio is missing" in problems


def test_tables_align_columns():
    text = benchkit.table([["a", 1], ["bbb", None]], ["name", "n"])
    assert text.splitlines() == ["name  n", "----  -", "a     1", "bbb   -"]
