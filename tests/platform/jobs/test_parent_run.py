"""Children a parent runs itself (strata.jobs.parent_run): recorded, visible and cancellable jobs that the
scheduler never places; the parent's attempt submits, starts, reports and ends them in one batched call per tick,
and stores their files."""

from __future__ import annotations

import pytest

from strata.jobs.models import Artifact, Attempt, Job, JobState, LogLine, MetricPoint

TRIAL = {"kind": "train", "resources": {"gpus": 0.5}, "spec": {"workload": "mlp-digits", "epochs": 1}}


@pytest.fixture
def parent(make_team, make_user, make_node, node_protocol, submit, run_pass):
    team = make_team("alpha", max_gpus=2, max_concurrent_jobs=2)
    user = make_user("alice", team)
    make_node("n1", gpus=2)
    job = submit(user, team, gpus=2, name="sweep")
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    return {"job": job, "attempt": attempt, "node": attempt.node, "protocol": node_protocol(attempt, attempt.node)}


def batch(parent, **body):
    answer = parent["protocol"].post("children/batch", body)
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_a_batch_submits_starts_records_and_ends_children_the_scheduler_never_places(parent, run_pass):
    answer = batch(parent, submit=[{"job": {**TRIAL, "name": f"t{i}"}, "idempotency_key": f"k{i}", "start": i < 2}
                                   for i in range(3)])
    ids = [item["id"] for item in answer["submitted"]]
    assert [item["nested"] for item in answer["submitted"]] == [True] * 3
    assert [item["held"] for item in answer["submitted"]] == [True] * 3
    assert sorted(answer["started"]) == sorted(ids[:2])
    states = {str(job.pk): job.state for job in Job.objects.filter(pk__in=ids)}
    assert [states[i] for i in ids] == [JobState.RUNNING, JobState.RUNNING, JobState.QUEUED]
    assert all(Job.objects.get(pk=i).started_at is not None for i in ids[:2])
    # The scheduler never places them (and they hold nothing).
    run_pass()
    assert not Attempt.objects.filter(job_id__in=ids).exists()
    assert Job.objects.get(pk=ids[2]).state == JobState.QUEUED

    # Points and lines of running children, ends, and the states of every child named, in one call.
    answer = batch(parent, start=[ids[2]],
                   metrics={ids[0]: [{"name": "test_accuracy", "step": 10, "value": 0.5}],
                            ids[1]: [{"name": "test_accuracy", "step": 10, "value": 0.25}]},
                   logs={ids[0]: [{"message": "epoch 1/1"}]},
                   end={ids[0]: {"state": "SUCCEEDED", "reason": "all steps finished"},
                        ids[1]: {"state": "QUEUED", "reason": "paused at its rung"}})
    assert answer["started"] == [ids[2]] and sorted(answer["ended"]) == sorted(ids[:2])
    assert answer["states"][ids[0]]["state"] == JobState.SUCCEEDED
    assert answer["states"][ids[1]]["state"] == JobState.QUEUED
    assert answer["states"][ids[2]]["state"] == JobState.RUNNING
    assert list(MetricPoint.objects.filter(job_id=ids[0]).values_list("name", "step", "value")) == [
        ("test_accuracy", 10, 0.5)]
    assert LogLine.objects.get(job_id=ids[0]).message == "epoch 1/1"
    assert Job.objects.get(pk=ids[0]).finished_at is not None
    # The same idempotency key finds the same job; a paused child runs again.
    again = batch(parent, submit=[{"job": {**TRIAL, "name": "t0"}, "idempotency_key": "k0"}], start=[ids[1]])
    assert again["submitted"][0]["id"] == ids[0] and again["started"] == [ids[1]]


def test_a_child_cancelled_through_the_api_is_told_in_the_next_batch_and_later_reports_are_dropped(parent):
    from strata.jobs.services import job_cancel

    child = batch(parent, submit=[{"job": {**TRIAL, "name": "t0"}, "start": True}])["submitted"][0]["id"]
    job_cancel(Job.objects.get(pk=child), "cancelled by alice")
    answer = batch(parent, watch=[child], metrics={child: [{"name": "loss", "step": 1, "value": 1.0}]},
                   end={child: {"state": "SUCCEEDED"}})
    assert answer["states"][child]["state"] == JobState.CANCELLED and answer["ended"] == []
    assert not MetricPoint.objects.filter(job_id=child).exists()
    assert Job.objects.get(pk=child).state == JobState.CANCELLED


def test_the_parents_files_of_a_child_are_the_childs_and_survive_its_parents_attempt(parent, run_pass):
    from strata.jobs.services import attempt_finish

    child = batch(parent, submit=[{"job": {**TRIAL, "name": "t0"}, "start": True}])["submitted"][0]["id"]
    protocol = parent["protocol"]
    assert protocol.get(f"children/{child}/checkpoint").status_code == 404
    for data in (b"step 10", b"step 20"):
        stored = protocol.put(f"children/{child}/files/checkpoint.pt", data, kind="checkpoint")
        assert stored.status_code == 201, stored.content
    assert protocol.put(f"children/{child}/files/model.pt", b"weights").status_code == 201
    got = protocol.get(f"children/{child}/checkpoint")
    assert got.status_code == 200 and b"".join(got.streaming_content) == b"step 20"
    assert Artifact.objects.get(job_id=child, kind=Artifact.Kind.ARTIFACT).name == "model.pt"
    # The parent's attempt ends: its children wait (held) for its next attempt, which runs them again.
    attempt = parent["attempt"]
    attempt_finish(attempt.pk, attempt.fencing_token, parent["node"], "failed", "crashed")
    job = Job.objects.get(pk=child)
    assert job.state == JobState.QUEUED and job.held
    run_pass()
    assert not Attempt.objects.filter(job_id=child).exists()


def test_only_a_nested_child_may_be_run_by_its_parent(parent):
    from strata.jobs.services import SubmitRejected, child_submit

    with pytest.raises(SubmitRejected):
        child_submit(parent["attempt"], {**TRIAL, "name": "t"}, by_parent=True)
    bad = parent["protocol"].post("children/batch", {"end": {"not-a-job": {"state": "SUCCEEDED"}}})
    assert bad.status_code == 400
