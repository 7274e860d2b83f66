"""The tune attempt's `tuning` report: the schema the control plane checks it with, and the `trials` job route
that reads it back merged with the trial jobs' states."""

from __future__ import annotations

import pytest

from components.runtime.contract.panels import StaticPanelData
from components.runtime.contract.plugins import ReportError
from components.tuning.report import TuningReport, trials

GOOD = {"metric": "test_accuracy", "mode": "max", "budget": 1.0,
        "trials": [{"number": 0, "job": "j0", "params": {"lr": 0.01}, "status": "completed", "iterations": 3,
                    "best": 0.9, "last": 0.9, "share": 0.0, "reason": "", "values": [[1, 0.5]], "shares": []},
                   {"number": 1, "job": "j1", "params": {"lr": 0.1}, "status": "running", "iterations": 1,
                    "best": 0.4, "last": 0.4, "share": 0.5, "reason": "", "values": [[1, 0.4]], "shares": []}],
        "best": {"number": 0, "job": "j0", "params": {"lr": 0.01}, "value": 0.9}, "rungs": []}


def test_a_good_report_passes_and_every_bad_field_is_named():
    assert TuningReport().attempt(GOOD) == GOOD
    bad = {**GOOD, "mode": "up", "budget": -1, "trials": [{**GOOD["trials"][0], "status": "lost", "best": "x"},
                                                          {"number": 1}]}
    with pytest.raises(ReportError) as error:
        TuningReport().attempt(bad)
    assert {"mode", "budget", "trials.0.status", "trials.0.best", "trials.1.job", "trials.1.status",
            "trials.1.params"} <= set(error.value.errors)
    with pytest.raises(ReportError):
        TuningReport().attempt({**GOOD, "trials": [{**GOOD["trials"][0], "colour": 1}]})
    with pytest.raises(ReportError):
        TuningReport().attempt({**GOOD, "budget": float("nan")})
    # PBT: a trial's earlier jobs and its exploit steps.
    pbt = {**GOOD, "trials": [{**GOOD["trials"][0], "jobs": ["j9"],
                               "exploits": [{"iteration": 2, "from": 1, "params": {"lr": 0.02}, "job": "j0"}]}]}
    assert TuningReport().attempt(pbt) == pbt
    with pytest.raises(ReportError) as error:
        TuningReport().attempt({**GOOD, "trials": [{**GOOD["trials"][0], "jobs": [3], "exploits": [{}]}]})
    assert {"trials.0.jobs", "trials.0.exploits"} <= set(error.value.errors)
    with pytest.raises(ReportError, match="this plugin takes no node reports"):
        TuningReport().node({})


def test_trials_reads_the_latest_report_and_the_trial_jobs_states():
    old = {**GOOD, "trials": GOOD["trials"][:1]}
    data = StaticPanelData(
        job={"id": "sweep"},
        reports={"tuning": {"attempts": [{"job_id": "sweep", "time": 1.0, "payload": old},
                                         {"job_id": "sweep", "time": 2.0, "payload": GOOD},
                                         {"job_id": "other", "time": 3.0, "payload": {**GOOD, "trials": []}}]}},
        children=[{"id": "j0", "name": "trial-0", "state": "SUCCEEDED"}, {"id": "j1", "name": "trial-1",
                                                                           "state": "RUNNING"}])
    answer = trials(data)
    assert [row["number"] for row in answer["trials"]] == [0, 1]
    assert [(row["state"], row["name"]) for row in answer["trials"]] == [("SUCCEEDED", "trial-0"),
                                                                         ("RUNNING", "trial-1")]
    assert answer["best"]["job"] == "j0" and answer["metric"] == "test_accuracy"
    assert [(row["jobs"], row["exploits"]) for row in answer["trials"]] == [([], []), ([], [])]
    assert trials(StaticPanelData(job={"id": "sweep"}))["trials"] == []


def test_the_wait_table_has_a_row_per_trial():
    from components.runtime.contract import registry

    route, progress = registry.progress_route("tune")
    assert route == "trials" and registry.progress_route("train") is None
    header, rows = progress.rows(trials(StaticPanelData(
        job={"id": "sweep"}, reports={"tuning": {"attempts": [{"job_id": "sweep", "time": 1.0, "payload": GOOD}]}})))
    assert header.split()[:3] == ["trial", "status", "its"]
    assert [key for key, _ in rows] == ["0", "1"]
    assert rows[0][1].split()[:5] == ["trial", "0", "completed", "3", "0.9"] and "lr=0.01" in rows[0][1]
    assert progress.rows({}) == (header, [])
