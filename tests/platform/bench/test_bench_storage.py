"""Smoke test of ``strata bench storage`` (benchmarks.core.storage): it is a core benchmark, and its figures, built
from a made-up result, have the common document's shape (no store is started and nothing is timed here)."""

from __future__ import annotations

import pytest

from benchmarks import benchkit
from benchmarks.core import storage
from strata.cli.bench import benchmarks as all_benchmarks

MIB = 1 << 20


def part(cpu: list[float], direct: bool) -> dict:
    return {"upload_s": [4.0, 5.0, 6.0], "transfer_s": [8.0, 9.0, 10.0], "cpu_s": cpu, "checked": [True] * 3,
            "cpu_s_by_role": [{"server": value} for value in cpu], "ours_mib_s": [64.0, 51.2, 42.7],
            "boto3_mib_s": [60.0, 50.0, 40.0] if direct else [], "idle_cpu_s": 0.3, "idle_window_s": 9.0}


def test_storage_is_a_core_benchmark_and_its_figures_have_the_common_shape():
    assert all_benchmarks()["storage"] == "benchmarks.core.storage:main"
    result = {"bytes": 256 * MIB, "runs": 3, "direct": part([0.2, 0.3, 0.25], True),
              "through": part([5.0, 6.0, 5.5], False)}
    made = storage.figures(result)
    assert [figure.key for figure in made] == ["checkpoint_write_mib_s", "control_plane_cpu_s_per_gib"]
    doc = benchkit.document("storage", True, made, details=result)
    assert benchkit.validate_document(doc) == []
    write, cpu = doc["figures"]["checkpoint_write_mib_s"], doc["figures"]["control_plane_cpu_s_per_gib"]
    for figure in (write, cpu):
        assert set(benchkit.FIGURE_KEYS) <= set(figure) and {"runs", "range", "baseline_runs"} <= set(figure)
    assert write["target"] == storage.WRITE_TARGET and write["unit"] == "MiB/s"
    assert write["ratio"] == pytest.approx(51.2 / 50.0)  # ours / baseline: higher is better
    assert cpu["target"] == storage.CPU_TARGET
    assert cpu["ratio"] == pytest.approx(5.5 / 0.25)  # baseline / ours: lower is better
    assert cpu["mechanism"] == pytest.approx(0.25 / 0.5)  # per GiB moved: 256 MiB up and down
