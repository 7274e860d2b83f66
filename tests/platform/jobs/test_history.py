"""The operation history (strata.jobs.history): one JSON line per committed change, in order, with the attempt's
fencing token only as a digest; nothing for a rolled-back transaction; stale node calls are recorded as
rejected. Off unless STRATA_HISTORY_LOG is set."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from strata.jobs.history import token_digest
from strata.jobs.models import Attempt, Job, JobState


@pytest.fixture
def history(settings, tmp_path):
    path = tmp_path / "history.jsonl"
    settings.STRATA_HISTORY_LOG = str(path)

    def lines():
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return lines


@pytest.mark.django_db(transaction=True)
def test_a_job_life_is_one_line_per_committed_change(history, make_team, make_user, make_node, node_protocol,
                                                      submit, run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=1)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    protocol = node_protocol(attempt, node, claim=False)
    assert protocol.claim().status_code == 200
    assert protocol.report(metrics=[{"name": "loss", "step": 1, "value": 1}]).status_code == 200
    assert protocol.finish("succeeded").status_code == 200
    # The node calls again after the attempt ended: refused (409) and recorded as rejected.
    assert protocol.report().status_code == 409

    lines = [line for line in history() if line["job"] == str(job.pk)]
    ops = [(line["op"], line.get("target")) for line in lines]
    assert ops == [("submit", None), ("state", "QUEUED"), ("state", "SCHEDULED"),
                   ("dispatch", None), ("start", None), ("state", "RUNNING"), ("heartbeat", None),
                   ("finish", None), ("state", "SUCCEEDED"), ("rejected", None)], ops
    by_op = {line["op"]: line for line in lines}
    attempt.refresh_from_db()
    digest = token_digest(attempt.fencing_token)
    for op in ("dispatch", "start", "heartbeat", "finish", "rejected"):
        assert by_op[op]["attempt"] == str(attempt.pk) and by_op[op]["token"] == digest, by_op[op]
    assert by_op["dispatch"]["share"] == pytest.approx(attempt.gpu_share) and by_op["dispatch"]["number"] == 1
    assert by_op["dispatch"]["dispatched_at"] == pytest.approx(attempt.dispatched_at.timestamp())
    assert by_op["finish"]["ended_at"] == pytest.approx(attempt.ended_at.timestamp())
    assert by_op["finish"]["outcome"] == "succeeded"
    assert by_op["submit"]["max_attempts"] == job.max_attempts and by_op["submit"]["kind"] == job.kind
    # The raw fencing token is never written: only its 12-digit digest.
    assert attempt.fencing_token not in json.dumps(history())
    times = [line["time"] for line in lines]
    assert times == sorted(times)


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_change_is_not_recorded(history, make_team, make_user):
    from strata.jobs.services import job_cancel

    team = make_team("alpha")
    user = make_user("alice", team)
    job = Job.objects.create(team=team, owner=user, kind="train", name="j", spec={}, resources={},
                             state=JobState.QUEUED)
    with pytest.raises(RuntimeError), transaction.atomic():
        job_cancel(job)
        raise RuntimeError("roll back")
    # The cancel was asked for (written at once), but no state change was committed.
    assert [(line["op"], line.get("target")) for line in history()] == [("cancel", None)]


@pytest.mark.django_db(transaction=True)
def test_off_by_default(settings, make_team, make_user, submit, tmp_path):
    assert settings.STRATA_HISTORY_LOG == ""
    team = make_team("alpha")
    submit(make_user("alice", team), team)
    assert not list(tmp_path.iterdir())
