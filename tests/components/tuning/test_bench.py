"""`strata bench tuning --quick`: the simulated sweep runs both ways on the same trials and writes the common
JSON; the simulator's bookkeeping holds (every trial ends, the shares never exceed the GPUs)."""

from __future__ import annotations

import json

from components.runtime.benchkit import validate_document
from components.tuning.bench import main, simulate


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
