"""``strata bench foresight`` at toy sizes: the three figures come out as numbers in the common document's shape."""

from __future__ import annotations

from benchmarks import benchkit
from benchmarks.foresight import bench


def test_foresight_figures_at_toy_sizes(monkeypatch):
    monkeypatch.setattr(bench, "SNAPSHOT", 3600.0)
    monkeypatch.setattr(bench, "SAMPLES", 4)
    monkeypatch.setattr(bench, "TARGETS", 4)
    first = bench.estimate_error(100, nodes_count=4, arrivals=True)
    assert first["estimates"] > 0
    assert first["ours_median_abs_error_s"] >= 0 and first["slurm_median_abs_error_s"] >= 0
    assert 0.0 <= first["coverage_80"] <= 1.0
    second = bench.replay_time(150)
    assert second["seconds"] > 0 and second["jobs"] == 150
    assert sum(team["current"]["jobs"] for team in second["teams"].values()) == 150
    third = bench.lost_work(150, nodes_count=3)
    assert third["elastic"] > 0 and third["urgent"] > 0
    assert third["ours"]["lost_gpu_hours"] >= 0 and third["preempt_only"]["lost_gpu_hours"] >= 0
    assert third["preempt_only"]["shrinks"] == 0  # the baseline never shrinks
    doc = benchkit.document("foresight", True, [
        benchkit.Figure("estimate_error", "error", first["ours_median_abs_error_s"] or 1.0,
                        first["slurm_median_abs_error_s"] or 1.0, "s", target=3.0),
        benchkit.Figure("whatif_replay", "replay", second["seconds"], 60.0, "s", target=1.0),
        benchkit.Figure("lost_work", "lost", third["ours"]["lost_gpu_hours"] or 1.0,
                        third["preempt_only"]["lost_gpu_hours"] or 1.0, "GPU-h", target=2.0)])
    assert benchkit.validate_document(doc) == []
