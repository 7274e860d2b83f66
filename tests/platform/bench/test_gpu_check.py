"""``make gpu-check``'s script (benchmarks/gpu/check.py): the dry run end to end (every part on the CPU at toy sizes,
so that the GPU minutes of a lent machine are never spent on a crash), and the orchestrator's promises: a part that
crashes, hangs or runs out of time is recorded with what it measured before and its output's tail, and the run goes
on inside its total deadline."""

from __future__ import annotations

import json
import math
import tarfile
import textwrap

import pytest

from benchmarks.benchkit import validate_document
from benchmarks.gpu import check
from benchmarks.gpu.check import FINE, PART_NAMES, SUMMARY, Part, run_all


def _numbers(figure: dict) -> bool:
    return all(isinstance(figure.get(key), int | float) and not isinstance(figure.get(key), bool)
               and math.isfinite(figure[key]) for key in ("mechanism", "baseline"))


@pytest.mark.e2e  # every part in processes of its own, about a minute: not in `make test-fast`
def test_dry_run_every_part_writes_its_figures(tmp_path, monkeypatch):
    # No Ray here (CI never builds .venv-peers): the tuning part must say so and still measure its own ways.
    monkeypatch.setenv("STRATA_PEERS_PYTHON", str(tmp_path / "no-peers-python"))
    summary = run_all(dry=True, device="cpu", output=tmp_path)
    assert validate_document(summary) == []
    assert summary["benchmark"] == SUMMARY and summary["quick"] is True
    assert list(summary["statuses"]) == list(PART_NAMES)
    problems = {name: status for name, status in summary["statuses"].items() if status not in FINE}
    tails = {name: json.loads((tmp_path / f"{name}.json").read_text()).get("errors") for name in problems}
    assert not problems, f"parts that did not finish: {problems}; their errors: {tails}"
    for name in PART_NAMES:
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert validate_document(doc) == [], name
        assert doc["part"] == name and doc["machine"]["dry"] is True and doc["machine"]["torch_device"] == "cpu"
        assert doc["errors"] == {}, (name, doc["errors"])
        if doc["status"] == "not built":
            continue
        assert doc["figures"], f"{name} measured no figure"
        for key, figure in doc["figures"].items():
            assert _numbers(figure), (name, key, figure)
            assert f"{name}.{key}" in summary["figures"]
    tuning = json.loads((tmp_path / "tuning.json").read_text())
    assert any("peer missing" in line for line in tuning["missing"])
    assert "packing" in tuning["figures"] and "vs_ray_tune" not in tuning["figures"]
    gpushare = json.loads((tmp_path / "gpushare.json").read_text())
    assert set(gpushare["figures"]) == {"switch", "admission", "jct", "utilization", "inference"}
    admitted = gpushare["details"]["admission"]
    # Admission with real allocations: the jobs that did not fit waited, every job finished, the peak held.
    assert admitted["succeeded"] == admitted["jobs"] and admitted["peak_within_budget"] is True
    assert admitted["with_admission"]["admitted_at_submit"] < admitted["jobs"]


FAKE_PARTS = textwrap.dedent('''
    import os
    import time

    from benchmarks.benchkit import Figure


    def fine(rec):
        rec.figure(Figure("one", "a figure", 1.0, 2.0, "s"))


    def crash(rec):
        rec.figure(Figure("before", "measured before the crash", 3.0, 6.0, "s"))
        rec.step("raises", lambda: 1 / 0)  # one measurement fails: recorded, the part goes on
        rec.figure(Figure("after", "measured after it", 1.0, 1.0, "s"))
        os._exit(3)  # then the whole process dies


    def hang(rec):
        rec.figure(Figure("kept", "measured before the hang", 2.0, 4.0, "s"))
        print("hanging now", flush=True)
        time.sleep(600)
''')


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    (tmp_path / "fake_gpu_parts.py").write_text(FAKE_PARTS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def part(name: str, function: str, budget: float) -> Part:
        module = tmp_path / f"fake_{name}.py"
        module.write_text(f"from fake_gpu_parts import {function} as run\n")
        return Part(name, f"fake_{name}", budget, budget, name)

    return part


def test_a_failing_or_hanging_part_keeps_what_it_measured_and_the_run_goes_on(tmp_path, fake_parts):
    output = tmp_path / "out"
    # The hanging part's budget leaves its child time to start and say what it kept on a loaded machine.
    catalogue = (fake_parts("crash", "crash", 30), fake_parts("hang", "hang", 12), fake_parts("fine", "fine", 30))
    archive = tmp_path / "gpu-check.tgz"
    summary = run_all(dry=True, device="cpu", output=output, deadline_s=180, catalogue=catalogue, archive=archive)
    assert summary["statuses"] == {"crash": "failed", "hang": "timeout", "fine": "ok"}
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["crash.json", "fine.json", "gpu-check.json", "hang.json"]
        assert json.load(tar.extractfile("gpu-check.json"))["statuses"] == summary["statuses"]
    crashed = json.loads((output / "crash.json").read_text())
    assert set(crashed["figures"]) == {"before", "after"}
    assert "ZeroDivisionError" in crashed["errors"]["raises"] and crashed["errors"]["exit"] == "exit code 3"
    hung = json.loads((output / "hang.json").read_text())
    assert set(hung["figures"]) == {"kept"} and hung["figures"]["kept"]["ratio"] == 2.0
    assert "killed at its budget of 12 s" in hung["errors"]["part"] and "hanging now" in hung["output_tail"]
    assert 12 <= hung["seconds"] < 60
    assert set(summary["figures"]) == {"crash.before", "crash.after", "hang.kept", "fine.one"}
    assert summary["figures"]["crash.before"]["ratio"] == 2.0  # lower is better kept: 6 / 3


def test_the_deadline_skips_the_parts_it_leaves_no_time_for(tmp_path, fake_parts, monkeypatch):
    monkeypatch.setattr(check, "MIN_START_S", 1.0)  # (10 s on a real run)
    output = tmp_path / "out"
    catalogue = (fake_parts("hang", "hang", 30), fake_parts("fine", "fine", 30))
    summary = run_all(dry=True, device="cpu", output=output, deadline_s=3, catalogue=catalogue)
    # The hanging part gets what is left of the deadline (not its own 30 s), the next one is skipped.
    assert summary["statuses"] == {"hang": "timeout", "fine": "skipped"}
    assert json.loads((output / "hang.json").read_text())["budget_s"] == pytest.approx(3, abs=0.5)
    skipped = json.loads((output / "fine.json").read_text())
    assert validate_document(skipped) == [] and "deadline" in skipped["errors"]["part"]


@pytest.mark.parametrize("part", check.PARTS, ids=lambda part: part.name)
def test_the_gpu_sizes_name_what_the_dry_sizes_name(part):
    """The dry run covers the GPU run's code paths only if both size tables have the same entries (a key only the
    GPU table has would be a KeyError found on the lent machine)."""
    import importlib

    module = importlib.import_module(part.module)
    assert callable(module.run)
    assert set(module.DRY) == set(module.GPU)
    assert part.budget_s <= check.DEFAULT_DEADLINE_S


def test_the_gpu_budgets_fit_the_deadline_with_room_for_a_rerun():
    # 8 minutes for every part: a 10-minute device call leaves room for the start and the transfers, and a
    # 15-minute lease for one fix and a rerun of the parts that failed (PARTS=...).
    assert check.DEFAULT_DEADLINE_S <= 480
    assert sum(part.budget_s for part in check.PARTS) <= check.DEFAULT_DEADLINE_S
    assert list(check.PART_NAMES) == ["gpushare", "migration", "serving", "tuning", "distributed", "decentral",
                                      "datacache", "embeddings"]


def test_a_rerun_of_some_parts_keeps_the_others_last_results(tmp_path, fake_parts):
    output = tmp_path / "out"
    catalogue = (fake_parts("crash", "crash", 30), fake_parts("fine", "fine", 30))
    first = run_all(dry=True, device="cpu", output=output, deadline_s=60, catalogue=catalogue)
    assert first["statuses"] == {"crash": "failed", "fine": "ok"}
    again = run_all(dry=True, device="cpu", output=output, deadline_s=60, catalogue=catalogue, parts=("crash",))
    assert again["statuses"] == {"crash": "failed", "fine": "ok"}
    parts = again["details"]["parts"]
    assert "earlier_run" in parts["fine"] and "earlier_run" not in parts["crash"]
    assert set(again["figures"]) == {"crash.before", "crash.after", "fine.one"}
