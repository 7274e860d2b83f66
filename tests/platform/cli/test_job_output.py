"""What ``strata jobs`` and ``strata submit --wait`` print: the table's columns fit every kind name (none cut),
and a waited job's end state is the last line, after every metric line."""

from __future__ import annotations

import argparse

from strata.cli import client_commands

JOBS = [
    {"id": "0b0e6a41-7a8e-4a41-9d4e-9a2d8f0c1e01", "name": "atom-swarm", "kind": "decentralized-train",
     "team": "alpha", "state": "RUNNING", "reason": "", "resources": {"gpus": 1, "workers": 4}},
    {"id": "0b0e6a41-7a8e-4a41-9d4e-9a2d8f0c1e02", "name": "saec", "kind": "compress-embeddings",
     "team": "a-rather-long-team-name", "state": "SUCCEEDED", "reason": "done", "resources": {"gpus": 0.5}},
    {"id": "0b0e6a41-7a8e-4a41-9d4e-9a2d8f0c1e03", "name": "n" * 60, "kind": "tune", "team": "alpha",
     "state": "QUEUED", "reason": "r" * 100, "resources": {"cpus": 2}},
]


class Pages:
    def __init__(self, results):
        self.results = results

    def get(self, path, params=None):
        assert path == "jobs/"
        return {"results": self.results}


def test_the_job_table_cuts_no_kind_and_lines_up(monkeypatch, capsys):
    monkeypatch.setattr(client_commands, "connect", lambda args: Pages(JOBS))
    args = argparse.Namespace(state=None, kind=None, team=None, limit=50, json=False)
    assert client_commands.jobs(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    header, *rows = lines
    for job, line in zip(JOBS, rows, strict=True):
        assert f"  {job['kind']}  " in line  # whole, with room on both sides
        assert f"  {job['team']}  " in line
    # Every column starts at the same place on every line.
    for title, key in (("KIND", "kind"), ("TEAM", "team"), ("STATE", "state"), ("HOLDS", None)):
        start = header.index(title)
        for job, line in zip(JOBS, rows, strict=True):
            if key:
                assert line[start:].startswith(job[key]), (title, line)
            else:
                assert line[start - 1] == " " and line[start] != " "
    assert "n" * 40 in rows[2] and "n" * 41 not in rows[2]  # a very long name is cut at 40
    assert rows[2].endswith("r" * 60) and "r" * 61 not in rows[2]
    assert "1 GPU ×4" in rows[0] and "2 CPU" in rows[2]


class Waited:
    """A job that reports a point at step 1 while RUNNING, and its last point (step 2) together with its end: the
    poll that first sees SUCCEEDED also sees that last point."""

    def __init__(self, end="SUCCEEDED", pages=1):
        self.polls, self.end, self.pages = 0, end, pages

    def get(self, path, params=None):
        if path.endswith("/metrics/"):
            after = params["after"]
            if self.polls == 1 and after == 0:
                return [{"id": 1, "name": "loss", "step": 1, "value": 0.5}]
            if self.polls >= 2 and after < 1 + self.pages:  # the last points, a page per answer
                return [{"id": after + 1, "name": "loss", "step": after + 1, "value": 0.25}]
            return []
        self.polls += 1
        state = "RUNNING" if self.polls == 1 else self.end
        return {"id": "j1", "kind": "no-such-kind", "state": state, "reason": "" if state == "RUNNING" else "done"}


def test_submit_wait_prints_the_end_state_last(monkeypatch, capsys):
    monkeypatch.setattr(client_commands.time, "sleep", lambda seconds: None)
    assert client_commands.wait_for_job(Waited(pages=3), "j1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert "SUCCEEDED (done)" in lines[-1], lines
    assert sum("SUCCEEDED" in line for line in lines) == 1
    steps = [line.split("step ")[1].split(":")[0] for line in lines if "step " in line]
    assert steps == ["1", "2", "3", "4"]  # every page drained before the end state
    assert lines.index(next(line for line in lines if "RUNNING" in line)) < lines.index(
        next(line for line in lines if "step 1:" in line))


def test_a_failed_waited_job_ends_on_its_state_too(monkeypatch, capsys):
    monkeypatch.setattr(client_commands.time, "sleep", lambda seconds: None)
    assert client_commands.wait_for_job(Waited(end="FAILED"), "j1") == 1
    lines = capsys.readouterr().out.splitlines()
    assert "FAILED (done)" in lines[-1] and any("step 2:" in line for line in lines)
