"""The serve kind's service-level panel: windowed SLO attainment and the live series, from reported metrics."""

import pytest

from components.runtime.contract.panels import StaticPanelData
from components.serving.panels import ServeSloPanel, _windowed_attainment


def test_attainment_is_taken_per_report_window():
    ok = [(1.0, 10.0), (3.0, 30.0), (5.0, 30.0), (7.0, 40.0)]
    missed = [(1.0, 0.0), (3.0, 20.0), (5.0, 20.0), (7.0, 20.0)]
    # 10/10, then 20 answered and 20 missed, then nothing at all (no point), then 10/10.
    assert _windowed_attainment(ok, missed) == [(1.0, 1.0), (3.0, 0.5), (7.0, 1.0)]


def test_the_panel_draws_the_series_and_sums_up():
    def series(values):
        return [(step, value, 100.0 + 2 * step) for step, value in enumerate(values, 1)]

    data = StaticPanelData(job={"id": "j", "spec": {}}, metrics={
        "answered_ok": series([10, 30, 60]), "missed": series([0, 10, 10]), "p50_ms": series([1.5, 1.6, 1.4]),
        "p99_ms": series([5, 9, 4]), "throughput_rps": series([5, 10, 15]), "queue_depth": series([0, 7, 1]),
        "mean_batch": series([1, 2.5, 2]), "requests": series([10, 40, 70]), "slo_attainment": series([1, 0.75, 6 / 7]),
        "batches": series([10, 25, 40]), "dropped_early": series([0, 4, 4])})
    rendered = ServeSloPanel().render(data)
    traces = {trace["name"]: trace for trace in rendered["figure"]["data"]}
    assert traces["SLO attainment (%)"]["y"] == pytest.approx([100.0, 200 / 3, 100.0])  # 20 of 30, then 30 of 30
    assert traces["SLO attainment (%)"]["x"] == [0.0, 2.0, 4.0]
    assert traces["p99 latency (ms)"]["yaxis"] == "y2" and traces["queue depth (requests)"]["y"] == [0, 7, 1]
    rows = dict(rendered["table"]["rows"])
    assert rows["SLO attainment since start"] == "85.71%" and rows["requests answered or refused"] == "70"
    assert ServeSloPanel().render(StaticPanelData(job={"id": "j"})) is None  # nothing reported yet
