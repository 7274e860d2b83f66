"""``strata bench foresight`` at toy sizes: both figures come out as numbers in the common document's shape."""

from __future__ import annotations

from benchmarks import benchkit
from benchmarks.foresight import bench


def test_foresight_figures_at_toy_sizes(monkeypatch):
    monkeypatch.setattr(bench, "SNAPSHOT", 1800.0)
    monkeypatch.setattr(bench, "SAMPLES", 4)
    first = bench.estimate_error(150, nodes_count=3)
    assert first["estimates"] > 0
    assert first["ours_median_abs_error_s"] >= 0 and first["slurm_median_abs_error_s"] >= 0
    assert 0.0 <= first["coverage_80"] <= 1.0
    second = bench.replay_time(150)
    assert second["seconds"] > 0 and second["jobs"] == 150
    assert sum(team["current"]["jobs"] for team in second["teams"].values()) == 150
    doc = benchkit.document("foresight", True, [
        benchkit.Figure("estimate_error", "error", first["ours_median_abs_error_s"] or 1.0,
                        first["slurm_median_abs_error_s"] or 1.0, "s", target=3.0),
        benchkit.Figure("whatif_replay", "replay", second["seconds"], 60.0, "s", target=1.0)])
    assert benchkit.validate_document(doc) == []
