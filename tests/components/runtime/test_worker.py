"""The node worker's supervision of an attempt's ranks (components.runtime.node.worker.AttemptRunner.supervise)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from components.runtime.node import worker


def runner_with(tmp_path, monkeypatch, *programs: str) -> worker.AttemptRunner:
    """A runner whose ranks are these Python programs (rank r runs ``programs[r]``); no control plane."""
    config = {"server": "http://127.0.0.1:9", "node_token": "t", "node": "n1", "state_dir": str(tmp_path)}
    runner = worker.AttemptRunner(config, "a" * 32, "token")
    monkeypatch.setattr(runner, "_poll", lambda: False)
    for rank, program in enumerate(programs):
        runner.children.append((None, subprocess.Popen([sys.executable, "-c", program])))
        runner.ranks.append(rank)
    return runner


@pytest.fixture
def reap():
    runners: list[worker.AttemptRunner] = []
    yield runners.append
    for runner in runners:
        for _, child in runner.children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=10)


SLEEP = "import time; time.sleep(60)"


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failing_rank_stops_its_siblings_at_once(tmp_path, monkeypatch, reap, failing):
    programs = [SLEEP, SLEEP, SLEEP]
    programs[failing] = "import time, sys; time.sleep(0.5); sys.exit(3)"
    runner = runner_with(tmp_path, monkeypatch, *programs)
    reap(runner)
    began = time.monotonic()
    outcome, reason = runner.supervise(time_limit=3600)
    assert time.monotonic() - began < 20  # not the 60 s the other ranks would sleep
    assert (outcome, reason) == ("failed", f"rank {failing} exit code 3: ")
    assert all(child.returncode is not None for _, child in runner.children)
    assert any(f"rank {failing} exited with code 3; stopping the attempt's other ranks" in line["message"]
               for line in runner.pending_logs)


def test_ranks_that_all_succeed_succeed(tmp_path, monkeypatch, reap):
    runner = runner_with(tmp_path, monkeypatch, "pass", "import time; time.sleep(0.3)")
    reap(runner)
    assert runner.supervise(time_limit=3600) == ("succeeded", "")


def test_one_rank_keeps_the_plain_reason(tmp_path, monkeypatch, reap):
    runner = runner_with(tmp_path, monkeypatch, "import sys; sys.exit(2)")
    reap(runner)
    assert runner.supervise(time_limit=3600) == ("failed", "exit code 2: ")
