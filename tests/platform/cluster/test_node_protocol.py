"""The node-side attempt protocol over HTTP: claim, report, finish, fencing, cancel while running."""

from __future__ import annotations

import json

import pytest
from node_protocol import NodeProtocol

from strata.jobs.models import Allocation, Attempt, Job, JobState


@pytest.fixture
def cluster(make_team, make_user, make_token, make_node, node_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=1)
    return {"team": team, "user": user, "node": node, "agent": api(node_token), "client": api(make_token(user, team))}


def _placed(cluster, submit, run_pass, **kwargs) -> tuple[Job, Attempt]:
    job = submit(cluster["user"], cluster["team"], **kwargs)
    run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    return job, Attempt.objects.filter(job=job, ended_at__isnull=True).get()


def _call(cluster, attempt, verb, token=None, **body):
    return NodeProtocol(cluster["agent"], attempt, cluster["node"]).post(verb, body, token=token)


def test_claim_report_finish_success(cluster, submit, run_pass):
    job, attempt = _placed(cluster, submit, run_pass)
    response = _call(cluster, attempt, "claim")
    assert response.status_code == 200, response.content
    claimed = response.json()
    assert claimed["job"] == str(job.pk) and claimed["world_size"] == 1 and claimed["stop"] is False
    assert claimed["allocations"][0]["device"]["share"] == 1.0
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.started_at is not None
    # A redelivered (or republished) dispatch cannot start the attempt a second time on the node: 409, and the
    # attempt runs on undisturbed.
    again = _call(cluster, attempt, "claim")
    assert again.status_code == 409 and "already claimed" in again.json()["detail"]
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert Attempt.objects.get(pk=attempt.pk).ended_at is None

    report = _call(cluster, attempt, "report", logs=[{"message": "epoch 1"}, {"level": "warning", "message": "hot"}],
                   metrics=[{"name": "loss", "step": 1, "value": 0.5}, {"name": "loss", "step": 2, "value": 0.25}])
    assert report.status_code == 200 and report.json() == {"stop": False}
    client = cluster["client"]
    logs = client.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert [(line["level"], line["message"]) for line in logs] == [("info", "epoch 1"), ("warning", "hot")]
    metrics = client.get(f"/api/v1/jobs/{job.pk}/metrics/", {"name": "loss"}).json()
    assert [(m["step"], m["value"]) for m in metrics] == [(1, 0.5), (2, 0.25)]
    after = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"after": logs[0]["id"]}).json()
    assert [line["message"] for line in after] == ["hot"]

    finish = _call(cluster, attempt, "finish", outcome="succeeded")
    assert finish.status_code == 200 and finish.json() == {"job_state": "SUCCEEDED"}
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.finished_at is not None and job.failures == 0
    assert attempt.outcome == "succeeded" and attempt.ended_at is not None
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()


def test_failure_retries_until_max_attempts(cluster, submit, run_pass):
    job = submit(cluster["user"], cluster["team"], max_attempts=3)
    for number in (1, 2, 3):
        run_pass()
        attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
        assert attempt.number == number
        assert _call(cluster, attempt, "claim").status_code == 200
        response = _call(cluster, attempt, "finish", outcome="failed", reason="exit code 1")
        assert response.status_code == 200
        job.refresh_from_db()
        assert job.failures == number
        assert job.state == (JobState.QUEUED if number < 3 else JobState.FAILED), (number, job.state)
    assert job.finished_at is not None
    assert run_pass().placed == 0
    assert list(Attempt.objects.filter(job=job).values_list("outcome", flat=True)) == ["failed"] * 3


def test_time_limit_fails_without_retry(cluster, submit, run_pass):
    job, attempt = _placed(cluster, submit, run_pass, max_attempts=3)
    _call(cluster, attempt, "claim")
    assert _call(cluster, attempt, "finish", outcome="time_limit").json() == {"job_state": "FAILED"}
    assert Job.objects.get(pk=job.pk).failures == 1


def test_stale_fencing_token_and_ended_attempt_are_409(cluster, submit, run_pass):
    job, attempt = _placed(cluster, submit, run_pass)
    assert _call(cluster, attempt, "claim", token="0" * 32).status_code == 409
    assert _call(cluster, attempt, "claim").status_code == 200
    assert _call(cluster, attempt, "report", token="f" * 32, logs=[{"message": "zombie"}]).status_code == 409
    assert _call(cluster, attempt, "finish", token="f" * 32, outcome="succeeded").status_code == 409
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert _call(cluster, attempt, "finish", outcome="failed").status_code == 200
    # The attempt has ended: everything from it is now refused, and nothing is written.
    assert _call(cluster, attempt, "report", logs=[{"message": "late"}]).status_code == 409
    assert _call(cluster, attempt, "finish", outcome="succeeded").status_code == 409
    assert _call(cluster, attempt, "claim").status_code == 409
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.failures == 1
    assert not job.log_lines.filter(message__in=["zombie", "late"]).exists()


def test_attempt_of_another_node_is_409(cluster, submit, run_pass, make_node):
    job, attempt = _placed(cluster, submit, run_pass)
    other = make_node("n2", gpus=1)
    response = NodeProtocol(cluster["agent"], attempt, other).claim()
    assert response.status_code == 409
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED


def test_cancel_running_job_keeps_devices_until_node_finishes(cluster, submit, run_pass):
    job, attempt = _placed(cluster, submit, run_pass)
    _call(cluster, attempt, "claim")
    response = cluster["client"].post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    assert Allocation.objects.get(attempt=attempt).active is True
    # The node learns it must stop, from report answers and heartbeats.
    assert _call(cluster, attempt, "report").json() == {"stop": True}
    beat = NodeProtocol(cluster["agent"], attempt, cluster["node"]).heartbeat(attempts=[str(attempt.pk)])
    assert beat.status_code == 200 and beat.json()["stop"] == [str(attempt.pk)]
    # The device is not handed to anyone else while the child may still be running.
    other = submit(cluster["user"], cluster["team"], name="next")
    run_pass()
    assert Job.objects.get(pk=other.pk).state == JobState.QUEUED
    finish = _call(cluster, attempt, "finish", outcome="failed", reason="killed")
    assert finish.status_code == 200 and finish.json() == {"job_state": "CANCELLED"}
    attempt.refresh_from_db()
    assert attempt.outcome == "cancelled"
    assert Allocation.objects.get(attempt=attempt).active is False
    assert Job.objects.get(pk=job.pk).failures == 0
    run_pass()
    assert Job.objects.get(pk=other.pk).state == JobState.SCHEDULED


def test_cancel_scheduled_unclaimed_job_frees_devices_at_once(cluster, submit, run_pass):
    job, attempt = _placed(cluster, submit, run_pass)
    cluster["client"].post(f"/api/v1/jobs/{job.pk}/cancel/")
    attempt.refresh_from_db()
    assert attempt.ended_at is not None and attempt.outcome == "cancelled"
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()
    assert _call(cluster, attempt, "claim").status_code == 409


def test_register_and_heartbeat_via_api(db, node_token, api):
    agent = api(node_token)
    body = {"name": "gpu-7", "labels": {"zone": "a"},
            "devices": [{"index": 0, "kind": "virtual", "memory_total": 2**30}]}
    registered = agent.post("/api/v1/node/register/", body, format="json")
    assert registered.status_code == 200, registered.content
    node, session = registered.json()["node"], registered.json()["session"]
    beat = agent.post("/api/v1/node/heartbeat/", {"node": node, "session": session,
                                                  "samples": [{"index": 0, "utilization": 50, "memory_used": 10}]},
                      format="json")
    assert beat.status_code == 200 and beat.json()["stop"] == []
    again = agent.post("/api/v1/node/register/", body, format="json").json()
    assert again["node"] == node and again["session"] != session
    stale = agent.post("/api/v1/node/heartbeat/", {"node": node, "session": session}, format="json")
    assert stale.status_code == 409
    bad = agent.post("/api/v1/node/register/", {**body, "devices": [{"index": -1, "kind": "virtual",
                                                                     "memory_total": 0}]}, format="json")
    assert bad.status_code == 400


def test_a_claim_that_cannot_be_answered_does_not_commit(cluster, submit, run_pass, monkeypatch):
    """The claim and its answer go together: if the answer cannot be encoded, the attempt is not started and
    the job is not RUNNING (the node retries the claim; nothing holds a device with no process)."""
    from strata.jobs.api import node_views as views

    job, attempt = _placed(cluster, submit, run_pass)

    class Unencodable(views.JSONRenderer):
        def render(self, data, *args, **kwargs):
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(views, "JSONRenderer", Unencodable)
    cluster["agent"].raise_request_exception = False
    assert _call(cluster, attempt, "claim").status_code == 500
    attempt.refresh_from_db()
    assert attempt.started_at is None
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED
    monkeypatch.undo()
    assert _call(cluster, attempt, "claim").status_code == 200
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_reports_with_unstorable_text_are_refused_whole(cluster, submit, run_pass):
    job, attempt = _placed(cluster, submit, run_pass)
    assert _call(cluster, attempt, "claim").status_code == 200
    protocol = NodeProtocol(cluster["agent"], attempt, cluster["node"])
    body = json.dumps({**protocol.auth, "logs": [{"message": "ok"}, {"message": "bad \x00"}]})  # NUL as \u0000
    response = cluster["agent"].generic("POST", protocol.url("report"), body.encode(), content_type="application/json")
    assert response.status_code == 400 and "logs[1].message" in response.json()
    assert job.log_lines.count() == 0
