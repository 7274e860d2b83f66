"""Nested children: a running job's children that run inside its own allocation (a sweep's trials within the
tune job's GPUs). They skip the team's quota (the parent holds it), are placed only on the parent's devices, do
not change the cluster's free capacity, stop when the parent's attempt ends and run again with its next one.
A parent also holds, releases and resizes its children, and reads their metrics, through fenced node routes."""

from __future__ import annotations

import pytest

from strata.jobs.models import Allocation, Attempt, Job, JobState, MetricPoint
from strata.quotas.services import team_load
from strata.scheduling.services import load_capacity

TRIAL = {"kind": "train", "resources": {"gpus": 0.5}, "spec": {"workload": "mlp-digits", "epochs": 1}}
GiB = 2**30


@pytest.fixture
def parent(make_team, make_user, make_node, node_protocol, submit, run_pass):
    """A running job holding both devices of n1 (2 GPUs), on a cluster with a second node n2, in a team whose
    quota allows 2 GPUs and 2 concurrent jobs."""
    team = make_team("alpha", max_gpus=2, max_concurrent_jobs=2)
    user = make_user("alice", team)
    n1 = make_node("n1", gpus=2)
    make_node("n2", gpus=2)
    job = submit(user, team, gpus=2, name="sweep")
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    node = attempt.node
    return {"team": team, "user": user, "job": job, "attempt": attempt, "node_protocol": node_protocol(attempt, node),
            "node": node, "n1": n1}


def call(parent, path, method="post", **body):
    if method == "get":
        return parent["node_protocol"].get(f"children/{path}", **body)
    return parent["node_protocol"].post(f"children/{path}", body)


def trial(parent, name, gpus=0.5, **extra) -> Job:
    answer = call(parent, "", job={**TRIAL, "name": name, "resources": {"gpus": gpus}}, nested=True, **extra)
    assert answer.status_code == 201, answer.content
    assert answer.json()["nested"] is True
    return Job.objects.get(pk=answer.json()["id"])


def devices_of(job):
    return sorted((a.device.node.name, a.device.index, a.share) for a in
                  Allocation.objects.filter(attempt__job=job, active=True).select_related("device__node"))


def test_nested_children_run_inside_the_parent_without_its_quota(parent, run_pass):
    trials = [trial(parent, f"t{i}") for i in range(5)]
    # Admitted at once, though the team is at max_gpus and max_concurrent_jobs would count 6 jobs.
    assert {job.state for job in trials} == {JobState.QUEUED}
    result = run_pass()
    assert result.placed == 4
    placed = [job for job in trials if Job.objects.get(pk=job.pk).state == JobState.SCHEDULED]
    assert len(placed) == 4
    # Only on the parent's devices: two halves on each of its two GPUs.
    held = sorted(d for job in placed for d in devices_of(job))
    parent_devices = sorted((a.device.node.name, a.device.index) for a in
                            Allocation.objects.filter(attempt=parent["attempt"]).select_related("device__node"))
    assert sorted({(name, index) for name, index, _ in held}) == parent_devices
    assert [share for _, _, share in held] == [0.5] * 4
    waiting = next(job for job in trials if job not in placed)
    assert Job.objects.get(pk=waiting.pk).reason == "waiting: no room left in its parent's allocation"
    # The cluster's free capacity and the team's load are the parent's alone.
    capacity = load_capacity()
    assert sum(slot.free for slot in capacity.devices.values()) == 2000  # n2's two devices
    load = team_load(parent["team"].pk)
    assert load.jobs == 1 and load.gpus == pytest.approx(2.0)
    assert all(Attempt.objects.get(job=job).gpu_share == 0 for job in placed)


def test_a_nested_child_that_can_never_fit_is_refused(parent):
    too_big = call(parent, "", job={**TRIAL, "resources": {"gpus": 3}}, nested=True)
    assert too_big.status_code == 400 and "resources" in too_big.json()
    assert "inside its parent's allocation" in str(too_big.json())
    two = call(parent, "", job={**TRIAL, "name": "two", "resources": {"gpus": 2}}, nested=True)
    assert two.status_code == 201  # both of the parent's whole devices
    workers = call(parent, "", job={**TRIAL, "resources": {"gpus": 0.5, "workers": 2}}, nested=True)
    assert workers.status_code == 400


def test_children_stop_with_the_parents_attempt_and_wait_for_its_next(parent, run_pass):
    from strata.jobs.services import attempt_finish

    child = trial(parent, "t0")
    run_pass()
    assert Job.objects.get(pk=child.pk).state == JobState.SCHEDULED
    # The parent's attempt dies (a failure, retried): the child stops with it and waits.
    attempt_finish(parent["attempt"].pk, parent["attempt"].fencing_token, parent["node"], "failed", "crashed")
    assert Job.objects.get(pk=child.pk).state == JobState.PREEMPTED
    child_attempt = Attempt.objects.get(job=child, ended_at__isnull=True)
    from strata.jobs.services import attempt_end

    attempt_end(child_attempt, Attempt.Outcome.PREEMPTED, "stopped")
    assert Job.objects.get(pk=child.pk).state == JobState.QUEUED
    # The parent is placed again first; its children follow it in the next pass.
    run_pass()
    assert Job.objects.get(pk=parent["job"].pk).state == JobState.SCHEDULED
    run_pass()
    assert Job.objects.get(pk=child.pk).state == JobState.SCHEDULED
    parent_attempt = Attempt.objects.get(job=parent["job"], ended_at__isnull=True)
    parent_devices = {a.device_id for a in Allocation.objects.filter(attempt=parent_attempt)}
    assert {a.device_id for a in Allocation.objects.filter(attempt__job=child, active=True)} <= parent_devices


def test_hold_release_and_resize_through_the_parent(parent, run_pass):
    child = trial(parent, "t0")
    run_pass()
    child_attempt = Attempt.objects.get(job=child, ended_at__isnull=True)
    held = call(parent, f"{child.pk}/hold/", reason="rung 1 done")
    assert held.status_code == 200 and held.json()["held"] is True
    child.refresh_from_db()
    assert child.state == JobState.PREEMPTED and "held: rung 1 done" in child.reason
    from strata.jobs.services import attempt_end

    attempt_end(child_attempt, Attempt.Outcome.PREEMPTED, "checkpointed")
    child.refresh_from_db()
    assert child.state == JobState.QUEUED and "waiting for release" in child.reason
    assert run_pass().placed == 0  # held: never placed
    assert Job.objects.get(pk=child.pk).state == JobState.QUEUED

    # Resized while held, then released: placed with its new share.
    resized = call(parent, f"{child.pk}/resize/", resources={"gpus": 1.0})
    assert resized.status_code == 200 and resized.json()["resources"]["gpus"] == 1.0
    bad = call(parent, f"{child.pk}/resize/", resources={"gpus": -1, "workers": 0})
    assert bad.status_code == 400 and {"resources.gpus", "resources.workers"} <= set(bad.json())
    too_big = call(parent, f"{child.pk}/resize/", resources={"gpus": 4})
    assert too_big.status_code == 400
    released = call(parent, f"{child.pk}/release/")
    assert released.status_code == 200 and released.json()["held"] is False
    run_pass()
    assert Job.objects.get(pk=child.pk).state == JobState.SCHEDULED
    assert [share for _, _, share in devices_of(child)] == [1.0]

    # Resizing a placed child restarts it with the new share (it checkpoints first).
    call(parent, f"{child.pk}/resize/", resources={"gpus": 0.25})
    assert Job.objects.get(pk=child.pk).state == JobState.PREEMPTED


def test_a_parent_reads_its_childrens_metrics_after_a_cursor(parent, run_pass):
    child = trial(parent, "t0")
    run_pass()
    child_attempt = Attempt.objects.get(job=child)
    for step in range(1, 6):
        MetricPoint.objects.create(job=child, attempt=child_attempt, name="val_accuracy", step=step,
                                   value=step / 10)
    first = call(parent, f"{child.pk}/metrics/", method="get", limit=3)
    assert first.status_code == 200, first.content
    body = first.json()
    assert [p["step"] for p in body["points"]] == [1, 2, 3] and body["state"] == "SCHEDULED"
    rest = call(parent, f"{child.pk}/metrics/", method="get", after=body["cursor"]).json()
    assert [p["value"] for p in rest["points"]] == [0.4, 0.5]
    assert call(parent, f"{child.pk}/metrics/", method="get", after="x").status_code == 400
    stranger = Job.objects.create(team=parent["team"], owner=parent["user"], kind="train", name="x", spec={},
                                  resources={}, state=JobState.QUEUED)
    assert call(parent, f"{stranger.pk}/metrics/", method="get").status_code == 404
    assert call(parent, f"{stranger.pk}/hold/").status_code == 404


def test_a_parent_reads_many_childrens_metrics_in_one_call(parent, run_pass):
    first, second = trial(parent, "t0"), trial(parent, "t1")
    run_pass()
    for child, values in ((first, [0.1, 0.2, 0.3]), (second, [0.7])):
        attempt = Attempt.objects.get(job=child)
        for step, value in enumerate(values, 1):
            MetricPoint.objects.create(job=child, attempt=attempt, name="val_accuracy", step=step, value=value)
    stranger = Job.objects.create(team=parent["team"], owner=parent["user"], kind="train", name="x", spec={},
                                  resources={}, state=JobState.QUEUED)
    answer = call(parent, "metrics/", after={str(first.pk): 0, str(second.pk): 0, str(stranger.pk): 0}, limit=2)
    assert answer.status_code == 200, answer.content
    children = answer.json()["children"]
    assert set(children) == {str(first.pk), str(second.pk)}  # not a child: left out
    assert [p["value"] for p in children[str(first.pk)]["points"]] == [0.1, 0.2]
    assert [p["value"] for p in children[str(second.pk)]["points"]] == [0.7]
    assert children[str(first.pk)]["state"] == "SCHEDULED"
    cursor = children[str(first.pk)]["cursor"]
    rest = call(parent, "metrics/", after={str(first.pk): cursor}).json()["children"]
    assert [p["value"] for p in rest[str(first.pk)]["points"]] == [0.3]
    assert call(parent, "metrics/", after={}).json() == {"children": {}}

    bad = call(parent, "metrics/", after={"nope": -1, str(first.pk): "x"}, limit=0)
    assert bad.status_code == 400
    errors = bad.json()
    text = str(errors)
    assert "after" in text and "limit" in text  # every bad field at once
    stale = parent["node_protocol"].post("children/metrics", {"after": {}}, token="0" * 32)
    assert stale.status_code in (403, 409)


def test_a_child_starts_from_a_siblings_checkpoint(parent, run_pass):
    """``checkpoint_from``: the new child's first attempt restores a copy of its sibling's latest checkpoint
    (population based training's exploit step), recorded with the child, so it can never start without it."""
    donor = trial(parent, "t0")
    run_pass()
    donor_attempt = Attempt.objects.get(job=donor, ended_at__isnull=True)
    donor_node = parent["node_protocol"].of(donor_attempt)
    assert donor_node.claim().status_code == 200

    # No checkpoint yet: refused, naming the field.
    early = call(parent, "", job={**TRIAL, "name": "t1"}, nested=True, checkpoint_from=str(donor.pk))
    assert early.status_code == 400 and "checkpoint_from" in early.json(), early.content
    for old in (b"step 10", b"step 20"):  # the newest one is copied
        stored = donor_node.put("artifacts/checkpoint.pt", old, kind="checkpoint")
        assert stored.status_code == 201, stored.content

    # Not a child of this job, or not a job at all: a 400 naming the field, nothing submitted.
    stranger = Job.objects.create(team=parent["team"], owner=parent["user"], kind="train", name="x", spec={},
                                  resources={}, state=JobState.QUEUED)
    before = Job.objects.count()
    for bad in (str(stranger.pk), "not-a-uuid"):
        answer = call(parent, "", job={**TRIAL, "name": "t1"}, nested=True, checkpoint_from=bad)
        assert answer.status_code == 400 and "checkpoint_from" in answer.json(), answer.content
    assert Job.objects.count() == before

    child = trial(parent, "t1", checkpoint_from=str(donor.pk), idempotency_key="t1")
    again = call(parent, "", job={**TRIAL, "name": "t1", "resources": {"gpus": 0.5}}, nested=True,
                 checkpoint_from=str(donor.pk), idempotency_key="t1")
    assert again.status_code == 200 and again.json()["id"] == str(child.pk)
    run_pass()
    child_attempt = Attempt.objects.get(job=child, ended_at__isnull=True)
    child_node = parent["node_protocol"].of(child_attempt)
    got = child_node.get("checkpoint")
    assert got.status_code == 200 and b"".join(got.streaming_content) == b"step 20"
    # A copy, not a shared file: the donor's next checkpoint leaves the child's alone.
    donor_node.put("artifacts/checkpoint.pt", b"step 30", kind="checkpoint")
    got = child_node.get("checkpoint")
    assert b"".join(got.streaming_content) == b"step 20"
    assert child.events.filter(kind="checkpoint").count() == 1
