"""`strata bench tuning --quick`: the simulated sweep runs both ways on the same trials and writes the common
JSON; the simulator's bookkeeping holds (every trial ends, the shares never exceed the GPUs)."""

from __future__ import annotations

import json

from benchmarks.benchkit import validate_document
from benchmarks.tuning.bench import main, simulate


def test_the_quick_bench_writes_the_common_document(tmp_path, capsys):
    assert main(quick=True, output=str(tmp_path / "tuning.json"), real=False) == 0
    doc = json.loads((tmp_path / "tuning.json").read_text())
    assert validate_document(doc) == []
    assert set(doc["figures"]) == {"simulated_makespan", "decision_overhead"}
    makespan = doc["figures"]["simulated_makespan"]
    assert makespan["mechanism"] > 0 and makespan["baseline"] > 0
    assert set(makespan["ratio_by_trials"]) == {"60", "120"}
    assert "simulated sweep" in capsys.readouterr().out


def test_both_ways_run_the_same_trials_to_the_end():
    for fluid in (True, False):
        result = simulate(40, 4, fluid=fluid, seed=3, iterations=9)
        assert result["stopped"] + result["completed"] == 40
        assert result["gpu_seconds"] <= 4 * result["makespan_s"] + 1e-6  # never more than the GPUs
    same = simulate(40, 4, fluid=True, seed=3, iterations=9), simulate(40, 4, fluid=True, seed=3, iterations=9)
    assert same[0]["makespan_s"] == same[1]["makespan_s"]  # deterministic for a seed


def test_peers_without_their_interpreter_fail_in_one_line_before_anything_runs(tmp_path, monkeypatch):
    import pytest

    monkeypatch.setenv("STRATA_PEERS_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(RuntimeError, match="make bench-peers"):
        main(quick=True, real=True, peers=True)


def test_gpu_seconds_integrate_each_trials_shares():
    from benchmarks.tuning.bench import gpu_seconds

    table = {"trials": [{"shares": [[0.0, 0.25], [4.0, 0.5], [6.0, 0.0]]},  # 1 + 1
                        {"shares": [[1.0, 1.0], [3.0, 0.0]]}, {"shares": []}]}
    assert gpu_seconds(table) == 4.0


def test_real_figures_compare_medians_and_need_equal_accuracy():
    from benchmarks.tuning.bench import _real_figures

    def runs(*makespans, best=0.95, gpu=10.0):
        return [{"makespan_s": m, "best": best, "trials": 16, "gpu_seconds": gpu} for m in makespans]

    real = {"cnn-synthetic": {"fluid": runs(10, 12, 11), "fifo": runs(30, 31, 29),
                              "ray": runs(20, 21, 19, best=0.90), "optuna": runs(9, 9, 9)}}
    found = {figure.key: figure for figure in _real_figures(real)}
    assert found["cnn-synthetic_vs_fifo"].ratio == 30 / 11 and found["cnn-synthetic_vs_fifo"].met is True
    ray = found["cnn-synthetic_vs_ray"]
    assert ray.ratio == 20 / 11 and ray.ratio >= ray.target
    assert ray.met is False  # faster, but 5 points less accurate: not at equal accuracy
    assert found["cnn-synthetic_vs_optuna"].met is None  # no target
    assert found["cnn-synthetic_vs_fifo"].extra["ratio_range"] == [31 / 12, 30 / 10]  # run i against run i
