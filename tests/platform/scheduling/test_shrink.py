"""Shrink instead of preempt: elastic jobs give up part of their share, or workers, before anything is stopped."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rest_framework import serializers

from strata.cluster.capacity import FULL, CapacityIndex, DeviceSlot, NodeSlot
from strata.jobs.api.serializers import normalize_resources
from strata.jobs.elastic import elastic_floor
from strata.jobs.models import Allocation, Attempt, Job, JobEvent, JobState
from strata.jobs.services import attempt_claim, attempt_finish
from strata.scheduling.services import Cut, choose_victims

GiB = 2**30
STARTED = datetime(2026, 12, 1, tzinfo=UTC)


def index(layout: dict) -> CapacityIndex:
    """Nodes {node: number of devices}, every device free; ids node * 10 + index."""
    slots = []
    for node, count in layout.items():
        slot = NodeSlot(id=node, name=f"n{node}", labels={})
        slot.devices = [DeviceSlot(id=node * 10 + i, node_id=node, index=i, memory_total=8 * GiB, free_memory=8 * GiB)
                        for i in range(count)]
        slots.append(slot)
    return CapacityIndex(slots)


def running(capacity: CapacityIndex, job: str, devices: list[int], share: float, resources: dict, priority: int = 0):
    """Rows of ``active`` for a running job holding ``share`` of each of ``devices`` (one worker per device when
    it has several workers), taken out of ``capacity``."""
    rows = []
    for rank, device in enumerate(devices):
        memory = int(8 * GiB * share)
        capacity.take(device, round(share * FULL), memory)
        worker = rank if int(resources.get("workers", 1)) > 1 else 0
        rows.append((f"{job}-attempt", job, priority, 1, JobState.RUNNING, STARTED, device, share, memory, "train",
                     share * len(devices), resources, worker))
    return rows


def test_an_elastic_job_is_shrunk_to_its_floor_rather_than_stopped():
    capacity = index({1: 1})
    rows = running(capacity, "a", [10], 1.0, {"gpus": 1.0, "workers": 1, "elastic": {"min_share": 0.5}})
    cuts = choose_victims(rows, 10, {"gpus": 0.5, "workers": 1}, None, capacity, {})
    assert cuts == [Cut("a", {"gpus": 0.5, "workers": 1, "elastic": {"min_share": 0.5}})]
    assert cuts[0].shrink
    assert capacity.devices[10].free == 0  # left as it was


def test_a_shrink_elsewhere_wins_over_a_cheaper_looking_stop():
    capacity = index({1: 1, 2: 1})
    rows = running(capacity, "fixed", [10], 1.0, {"gpus": 1.0, "workers": 1}, priority=-5)
    rows += running(capacity, "elastic", [20], 1.0, {"gpus": 1.0, "workers": 1, "elastic": {"min_share": 0.25}})
    cuts = choose_victims(rows, 10, {"gpus": 0.5, "workers": 1}, None, capacity, {})
    assert [cut.job_id for cut in cuts] == ["elastic"] and cuts[0].resources["gpus"] == 0.25


def test_when_shrinks_cannot_make_room_the_job_is_stopped_not_shrunk_too():
    capacity = index({1: 1})
    rows = running(capacity, "elastic", [10], 0.5, {"gpus": 0.5, "workers": 1, "elastic": {"min_share": 0.25}})
    rows += running(capacity, "fixed", [10], 0.5, {"gpus": 0.5, "workers": 1})
    cuts = choose_victims(rows, 10, {"gpus": 1.0, "workers": 1}, None, capacity, {})
    assert sorted(cuts, key=lambda cut: cut.job_id) == [Cut("elastic"), Cut("fixed")]


def test_a_shrink_and_a_stop_together_when_the_shrink_alone_is_not_enough():
    capacity = index({1: 1})
    rows = running(capacity, "elastic", [10], 0.5, {"gpus": 0.5, "workers": 1, "elastic": {"min_share": 0.25}})
    rows += running(capacity, "fixed", [10], 0.5, {"gpus": 0.5, "workers": 1})
    cuts = choose_victims(rows, 10, {"gpus": 0.75, "workers": 1}, None, capacity, {})
    by_job = {cut.job_id: cut for cut in cuts}
    assert set(by_job) == {"elastic", "fixed"}
    assert by_job["elastic"].resources["gpus"] == 0.25 and not by_job["fixed"].shrink


def test_a_gang_gives_up_workers_down_to_its_minimum():
    capacity = index({1: 4})
    rows = running(capacity, "gang", [10, 11, 12, 13], 1.0, {"gpus": 1.0, "workers": 4, "elastic": {"min_workers": 2}})
    cuts = choose_victims(rows, 10, {"gpus": 1.0, "workers": 1}, None, capacity, {})
    assert cuts == [Cut("gang", {"gpus": 1.0, "workers": 3, "elastic": {"min_workers": 2}})]
    cuts = choose_victims(rows, 10, {"gpus": 2.0, "workers": 1}, None, capacity, {})
    assert [cut.resources["workers"] for cut in cuts] == [2]
    cuts = choose_victims(rows, 10, {"gpus": 3.0, "workers": 1}, None, capacity, {})
    assert cuts == [Cut("gang")]  # it may not go below 2 workers: stopped instead


def test_equal_or_higher_priority_elastic_jobs_are_left_alone():
    capacity = index({1: 1})
    rows = running(capacity, "a", [10], 1.0, {"gpus": 1.0, "workers": 1, "elastic": {"min_share": 0.5}}, priority=10)
    assert choose_victims(rows, 10, {"gpus": 0.5, "workers": 1}, None, capacity, {}) == []


def test_the_floor_comes_from_the_request_and_never_grows():
    assert elastic_floor({"gpus": 1.0, "workers": 1}) is None
    assert elastic_floor({"gpus": 0.5, "workers": 1, "elastic": {"min_share": 0.5}}) is None
    assert elastic_floor({"gpus": 1.0, "workers": 1, "elastic": {}}) is None  # hidden (as the simulator's baseline)
    assert elastic_floor({"gpus": 4.0, "workers": 1, "elastic": {"min_share": 2}})["gpus"] == 2.0


def test_bad_elastic_requests_name_every_field():
    with pytest.raises(serializers.ValidationError) as caught:
        normalize_resources({"gpus": 0.5, "workers": 2, "elastic": {"min_share": 0.75, "min_workers": 3, "x": 1}})
    assert set(caught.value.detail) == {"resources.elastic.min_share", "resources.elastic.min_workers",
                                        "resources.elastic.x"}
    with pytest.raises(serializers.ValidationError) as caught:
        normalize_resources({"gpus": 4, "elastic": {"min_share": 1.5}})
    assert "whole number" in str(caught.value.detail["resources.elastic.min_share"])
    with pytest.raises(serializers.ValidationError) as caught:
        normalize_resources({"elastic": {}})
    assert "resources.elastic" in caught.value.detail
    assert normalize_resources({"gpus": 1, "elastic": {"min_share": 0.25}})["elastic"] == {"min_share": 0.25}


def test_the_api_refuses_a_bad_elastic_request_with_a_400_and_keeps_a_good_one(make_team, make_user, make_token,
                                                                               make_node, api, job_body):
    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("n1", gpus=1)
    client = api(make_token(user, team))
    answer = client.post("/api/v1/jobs/", job_body(resources={"gpus": 0.5, "elastic": {"min_share": 2}}),
                         format="json")
    assert answer.status_code == 400 and "resources.elastic.min_share" in answer.json(), answer.content
    answer = client.post("/api/v1/jobs/", job_body(resources={"gpus": 1, "elastic": {"min_share": 0.25}}),
                         format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["resources"]["elastic"] == {"min_share": 0.25}


# -- through the scheduler and the database -----------------------------------------------------------------------

def test_the_scheduler_shrinks_an_elastic_job_and_both_run(alpha, submit_resources, make_node, run_pass):
    user, team = alpha
    node = make_node("n1", gpus=1)
    elastic = submit_resources(user, team, {"gpus": 1, "elastic": {"min_share": 0.5}}, name="elastic")
    run_pass()
    first = Attempt.objects.get(job=elastic)
    attempt_claim(first.pk, first.fencing_token, node)
    assert Job.objects.get(pk=elastic.pk).state == JobState.RUNNING

    high = submit_resources(user, team, {"gpus": 0.5}, name="high", priority=50)
    result = run_pass()
    assert result.preempted == 1
    elastic.refresh_from_db()
    assert elastic.state == JobState.PREEMPTED and elastic.reason.startswith("shrunk for higher-priority job")
    assert elastic.resources["gpus"] == 0.5 and elastic.resources["elastic"] == {"min_share": 0.5}
    assert "shrinking 1" in Job.objects.get(pk=high.pk).reason
    assert JobEvent.objects.filter(job=elastic, kind="resize").exists()

    # The node stops it at a checkpoint; the next pass places the high-priority job and the shrunk one beside it.
    attempt_finish(first.pk, first.fencing_token, node, "failed", "SIGTERM")
    assert Attempt.objects.get(pk=first.pk).outcome == "preempted"
    run_pass()
    assert Job.objects.get(pk=high.pk).state == JobState.SCHEDULED and Job.objects.get(pk=elastic.pk).state == JobState.SCHEDULED
    shares = sorted(a.share for a in Allocation.objects.filter(active=True))
    assert shares == [0.5, 0.5]
    assert Job.objects.get(pk=elastic.pk).failures == 0


def test_a_job_that_is_not_elastic_is_still_preempted(alpha, submit_resources, make_node, run_pass):
    user, team = alpha
    node = make_node("n1", gpus=1)
    low = submit_resources(user, team, {"gpus": 1}, name="low")
    run_pass()
    attempt = Attempt.objects.get(job=low)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    submit_resources(user, team, {"gpus": 0.5}, name="high", priority=50)
    run_pass()
    low.refresh_from_db()
    assert low.state == JobState.PREEMPTED and low.reason.startswith("preempted by higher-priority job")
    assert low.resources["gpus"] == 1.0


def test_the_elastic_example_is_accepted(make_team, make_user, make_token, make_node, api):
    from pathlib import Path

    import yaml

    team = make_team("alpha")
    make_node("n1", gpus=1)
    client = api(make_token(make_user("alice", team), team))
    body = yaml.safe_load((Path(__file__).parents[3] / "examples/jobs/digits-elastic.yaml").read_text())
    answer = client.post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["resources"]["elastic"] == {"min_share": 0.25}


def test_an_sms_gang_is_elastic_by_default_and_a_floor_the_strategy_cannot_run_at_is_a_400(
        make_team, make_user, make_token, make_node, api, job_body):
    team = make_team("alpha")
    make_node("n1", gpus=4)
    client = api(make_token(make_user("alice", team), team))
    sms = {"workload": "mlp-digits", "distributed": {"strategy": "sms"}}
    answer = client.post("/api/v1/jobs/", job_body(spec=sms, resources={"gpus": 0.5, "workers": 4}), format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["resources"]["elastic"] == {"min_workers": 2}  # the strategy's default, filled in
    answer = client.post("/api/v1/jobs/", job_body(spec=sms, resources={"gpus": 0.5, "workers": 2}), format="json")
    assert answer.status_code == 201 and "elastic" not in answer.json()["resources"]  # already at its floor
    answer = client.post("/api/v1/jobs/", job_body(spec={"workload": "mlp-digits", "distributed": {"strategy": "ddp"}},
                                                   resources={"gpus": 0.5, "workers": 2}), format="json")
    assert answer.status_code == 201 and "elastic" not in answer.json()["resources"]  # DDP is not elastic
    answer = client.post("/api/v1/jobs/", job_body(spec=sms, resources={"gpus": 0.5, "workers": 4,
                                                                        "elastic": {"min_workers": 1}}), format="json")
    assert answer.status_code == 400, answer.content
    assert "needs at least 2 workers" in " ".join(answer.json()["resources.elastic.min_workers"])


def test_the_room_made_for_a_job_is_not_taken_by_lower_priority_jobs_in_the_meantime(alpha, make_team, make_user,
                                                                                    submit, make_node, run_pass):
    user, team = alpha
    beta = make_team("beta")
    bob = make_user("bob", beta)
    node = make_node("n1", gpus=2)
    low = submit(user, team, gpus=1, name="low")
    run_pass()
    attempt = Attempt.objects.get(job=low)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    urgent = submit(user, team, gpus=2, priority=50, name="urgent")
    filler = submit(bob, beta, gpus=1, name="filler")  # fits the free device now: it must leave it to urgent
    assert run_pass().preempted == 1
    assert Job.objects.get(pk=low.pk).state == JobState.PREEMPTED
    assert Job.objects.get(pk=filler.pk).state == JobState.QUEUED
    run_pass()  # the victim has not stopped yet: the room stays kept
    assert Job.objects.get(pk=filler.pk).state == JobState.QUEUED
    assert run_pass().preempted == 0  # and nobody else is preempted for it
    attempt_finish(attempt.pk, attempt.fencing_token, node, "failed", "SIGTERM")
    run_pass()
    assert Job.objects.get(pk=urgent.pk).state == JobState.SCHEDULED
    assert Job.objects.get(pk=filler.pk).state == JobState.QUEUED  # both devices went to the urgent job
