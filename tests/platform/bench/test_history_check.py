"""The chaos suite's history checker finds each kind of violation in a history built to have it, and passes a
clean one (so a passing chaos run means something)."""

from __future__ import annotations

import copy

import pytest

from benchmarks.core.history_check import CHECKS, check, read_lines


def clean():
    """One job: attempt 1 lost with its node, attempt 2 succeeded; billed 2 x 0.5 + 3 x 0.5 GPU-seconds."""
    server = [
        {"op": "submit", "job": "j", "team": "t", "max_attempts": 1, "time": 1.0},
        {"op": "state", "job": "j", "source": "PENDING", "target": "QUEUED", "time": 1.1},
        {"op": "dispatch", "job": "j", "attempt": "a1", "number": 1, "share": 0.5, "dispatched_at": 2.0, "time": 2.0},
        {"op": "start", "job": "j", "attempt": "a1", "node": "n1", "started_at": 2.5, "time": 2.5},
        {"op": "finish", "job": "j", "attempt": "a1", "number": 1, "outcome": "node_lost", "ended_at": 4.0,
         "share": 0.5, "time": 4.0},
        {"op": "dispatch", "job": "j", "attempt": "a2", "number": 2, "share": 0.5, "dispatched_at": 5.0, "time": 5.0},
        {"op": "start", "job": "j", "attempt": "a2", "node": "n2", "started_at": 5.5, "time": 5.5},
        {"op": "rejected", "job": "j", "attempt": "a1", "time": 6.0},
        {"op": "finish", "job": "j", "attempt": "a2", "number": 2, "outcome": "succeeded", "ended_at": 8.0,
         "share": 0.5, "time": 8.0},
        {"op": "state", "job": "j", "source": "RUNNING", "target": "SUCCEEDED", "time": 8.0},
    ]
    client = [{"op": "submit-ack", "job": "j", "time": 1.0}, {"op": "fault", "name": "sigkill-node", "time": 3.0},
              {"op": "request", "rid": "r1", "time": 6.0}, {"op": "answer", "rid": "r1", "time": 6.1},
              {"op": "request", "rid": "r2", "time": 6.0}, {"op": "status", "rid": "r2", "code": "UNAVAILABLE",
                                                           "time": 6.2}]
    final = {"j": {"state": "SUCCEEDED", "max_attempts": 1,
                   "attempts": [{"id": "a1", "outcome": "node_lost"}, {"id": "a2", "outcome": "succeeded"}]}}
    return server, client, final, {"t": 2.5}


def test_a_clean_history_passes_with_its_figures():
    report = check(*clean())
    assert report.ok, report.summary()
    assert report.figures["jobs acknowledged"] == 1 and report.figures["attempts"] == 2
    assert report.figures["stale calls rejected"] == 1 and report.figures["faults injected"] == {"sigkill-node": 1}
    assert report.figures["replica answers"] == 1 and report.figures["replica statuses"] == {"UNAVAILABLE": 1}
    assert report.figures["cancels at completion (won, lost)"] == [0, 0]
    assert "PASS" in report.summary()


def test_the_cancel_races_are_counted():
    server, client, final, billed = clean()
    client += [{"op": "cancel-race", "job": "j", "won": True, "time": 9.0},
               {"op": "cancel-race", "job": "k", "won": False, "time": 9.5},
               {"op": "cancel-race", "job": "l", "won": False, "time": 9.9}]
    assert check(server, client, final, billed).figures["cancels at completion (won, lost)"] == [1, 2]


def broken(change):
    server, client, final, billed = copy.deepcopy(clean())
    change(server, client, final, billed)
    return check(server, client, final, billed)


CASES = {
    "lost submit": ("one_terminal_state",
                    lambda s, c, f, b: c.append({"op": "submit-ack", "job": "ghost", "time": 9})),
    "never ends": ("one_terminal_state", lambda s, c, f, b: s.remove(s[-1])),
    "two terminal states": ("one_terminal_state", lambda s, c, f, b: s.append(
        {"op": "state", "job": "j", "source": "SUCCEEDED", "target": "FAILED", "time": 9})),
    "API disagrees": ("one_terminal_state", lambda s, c, f, b: f["j"].update(state="FAILED")),
    "change after the end": ("terminal_is_final", lambda s, c, f, b: s.append(
        {"op": "state", "job": "j", "source": "SUCCEEDED", "target": "QUEUED", "time": 9})),
    "overlap": ("no_overlap", lambda s, c, f, b: s[4].update(ended_at=5.5)),
    "attempt ended twice": ("no_overlap", lambda s, c, f, b: s.append(dict(s[4], time=9))),
    "started after its end": ("no_overlap", lambda s, c, f, b: s.append(
        {"op": "start", "job": "j", "attempt": "a1", "node": "n1", "started_at": 4.5, "time": 4.5})),
    "too many attempts": ("bounded_attempts", lambda s, c, f, b: f["j"]["attempts"][0].update(outcome="failed")),
    "overbilled": ("billing", lambda s, c, f, b: b.update(t=3.5)),
    "attempt never ended": ("billing", lambda s, c, f, b: s.remove(s[8])),
    "attempt not in the history": ("billing", lambda s, c, f, b: f["j"]["attempts"].append(
        {"id": "a3", "outcome": "cancelled"})),
    "unanswered request": ("replica_requests", lambda s, c, f, b: c.append({"op": "request", "rid": "r3", "time": 7})),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_violation_is_found(case):
    expected, change = CASES[case]
    report = broken(change)
    assert not report.ok
    assert report.violations[expected], report.summary()
    assert expected in CHECKS and "VIOLATED" in report.summary()


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"op": "submit", "job": "j"}\n{"op": "sta')
    assert read_lines(path) == [{"op": "submit", "job": "j"}]
    assert read_lines(tmp_path / "missing.jsonl") == []
