"""Jobs that need no GPU (``resources.gpus: 0``): placed on the nodes' CPUs and host memory next to GPU jobs,
without overcommitting either; tied to their node like any attempt (claim, reaper, cancel, preemption, gangs)."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
from django.utils import timezone

from strata.cluster.models import CPU_INDEX, Device, Node
from strata.jobs.models import Allocation, Attempt, Job, JobState
from strata.jobs.services import SubmitRejected, attempt_claim, attempt_finish, job_cancel
from strata.scheduling.services import reap

GiB = 2**30


@pytest.fixture
def submit_cpu(make_team, make_user, submit_resources):
    """``submit_cpu(resources, name=..., priority=...)``: a job of alice, of team alpha (no quota limits)."""
    team = make_team("alpha")
    return functools.partial(submit_resources, make_user("alice", team), team)


def state(job) -> str:
    """The job's state as stored now."""
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def held(node, kind: str) -> float:
    """What the active allocations hold on ``node``'s devices of ``kind`` ("cpu": CPUs; else GPUs)."""
    rows = Allocation.objects.filter(active=True, device__node=node)
    rows = rows.filter(device__kind=Device.Kind.CPU) if kind == "cpu" else rows.exclude(device__kind=Device.Kind.CPU)
    return sum(rows.values_list("share", flat=True))


def test_cpu_and_gpu_jobs_share_a_node_without_overcommitting_either(submit_cpu, make_node, run_pass):
    node = make_node("n1", gpus=2, cpus=4, host_memory=8 * GiB)
    cpu_jobs = [submit_cpu({"gpus": 0, "cpus": 1}, name=f"cpu{i}") for i in range(6)]
    gpu_jobs = [submit_cpu({"gpus": 1}, name=f"gpu{i}") for i in range(3)]
    both = submit_cpu({"gpus": 0.5, "cpus": 1, "memory": "1GiB"}, name="both")
    run_pass()
    assert [state(job) for job in cpu_jobs].count(JobState.SCHEDULED) == 4
    assert [state(job) for job in gpu_jobs].count(JobState.SCHEDULED) == 2
    assert state(both) == JobState.QUEUED  # no device left, and no CPU either
    assert held(node, "cpu") == pytest.approx(4.0) and held(node, "gpu") == pytest.approx(2.0)
    waiting = next(job for job in cpu_jobs if state(job) == JobState.QUEUED)
    assert "no node has free CPUs" in Job.objects.get(pk=waiting.pk).reason

    placed = Attempt.objects.get(job=next(job for job in cpu_jobs if state(job) == JobState.SCHEDULED))
    assert placed.gpu_share == 0 and placed.node_id == node.pk
    [allocation] = Allocation.objects.filter(attempt=placed).select_related("device")
    assert allocation.device.kind == "cpu" and allocation.device.index == CPU_INDEX and allocation.share == 1.0
    assert "on the CPUs of node n1 (1 CPU)" in placed.job.events.filter(kind="state").last().message

    # A finished CPU job frees its CPU: the next one takes it, and the devices stay as they were.
    attempt_claim(placed.pk, placed.fencing_token, node)
    attempt_finish(placed.pk, placed.fencing_token, node, "succeeded", "")
    run_pass()
    assert [state(job) for job in cpu_jobs].count(JobState.SCHEDULED) == 4
    assert held(node, "cpu") == pytest.approx(4.0) and held(node, "gpu") == pytest.approx(2.0)


def test_a_gpu_job_that_states_cpus_reserves_both_on_one_node(submit_cpu, make_node, run_pass):
    make_node("small", gpus=2, cpus=1, host_memory=4 * GiB)
    big = make_node("big", gpus=1, cpus=8, host_memory=32 * GiB)
    job = submit_cpu({"gpus": 0.5, "cpus": 4, "memory": "8GiB"})
    run_pass()
    rows = list(Allocation.objects.filter(attempt__job=job).select_related("device__node"))
    assert {(row.device.node.name, row.device.kind, row.share, row.memory) for row in rows} == {
        ("big", "virtual", 0.5, 4 * GiB), ("big", "cpu", 4.0, 8 * GiB)}
    assert Attempt.objects.get(job=job).gpu_share == 0.5
    assert held(big, "cpu") == 4.0


def test_fractions_of_cpus_and_host_memory_are_both_limits(submit_cpu, make_node, run_pass):
    make_node("n1", gpus=0, cpus=2, host_memory=4 * GiB)
    halves = [submit_cpu({"gpus": 0, "cpus": 0.5}, name=f"h{i}") for i in range(5)]
    run_pass()
    assert [state(job) for job in halves].count(JobState.SCHEDULED) == 4
    Job.objects.filter(pk__in=[job.pk for job in halves]).update(state=JobState.CANCELLED)
    Allocation.objects.update(active=False)
    hungry = [submit_cpu({"gpus": 0, "cpus": 0.1, "memory": "3GiB"}, name=f"m{i}")
              for i in range(2)]
    run_pass()
    assert [state(job) for job in hungry] == [JobState.SCHEDULED, JobState.QUEUED]  # 3 + 3 GiB > 4 GiB


def test_a_gang_of_cpu_workers_spans_nodes_all_or_nothing(submit_cpu, make_node, run_pass):
    make_node("n1", gpus=0, cpus=2)
    make_node("n2", gpus=0, cpus=2)
    gang = submit_cpu({"gpus": 0, "cpus": 1, "workers": 3})
    run_pass()
    assert state(gang) == JobState.SCHEDULED
    rows = Allocation.objects.filter(attempt__job=gang)
    assert sorted(rows.values_list("rank", flat=True)) == [0, 1, 2]
    assert set(rows.values_list("device__node__name", flat=True)) == {"n1", "n2"}
    second = submit_cpu({"gpus": 0, "cpus": 1, "workers": 2}, name="second")
    run_pass()
    assert state(second) == JobState.QUEUED and Allocation.objects.filter(attempt__job=second).count() == 0
    with pytest.raises(SubmitRejected, match="the whole cluster has room for 4"):
        submit_cpu({"gpus": 0, "cpus": 1, "workers": 5})


def test_hardware_no_node_offers_is_refused_at_submit(submit_cpu, make_node):
    make_node("gpus-only", gpus=1)  # an agent that reported no CPUs
    with pytest.raises(SubmitRejected, match="reported its CPUs"):
        submit_cpu({"gpus": 0})
    with pytest.raises(SubmitRejected, match="reported its CPUs"):
        submit_cpu({"gpus": 1, "cpus": 2})
    make_node("n2", gpus=0, cpus=4, host_memory=8 * GiB)
    with pytest.raises(SubmitRejected, match="no node has 8 CPUs"):
        submit_cpu({"gpus": 0, "cpus": 8})
    with pytest.raises(SubmitRejected, match="host memory"):
        submit_cpu({"gpus": 0, "memory": "16GiB"})
    assert submit_cpu({"gpus": 0, "cpus": 4, "memory": "8GiB"}).state == JobState.QUEUED


def test_the_claim_names_a_cpu_rank_with_no_device(submit_cpu, make_node, run_pass, node_protocol):
    node = make_node("n1", gpus=1, cpus=4, host_memory=8 * GiB)
    cpu = submit_cpu({"gpus": 0, "cpus": 2, "memory": "1GiB"}, name="cpu")
    gpu = submit_cpu({"gpus": 1, "cpus": 1}, name="gpu")
    run_pass()
    answers = {}
    for job in (cpu, gpu):
        response = node_protocol(Attempt.objects.get(job=job), node, claim=False).claim()
        assert response.status_code == 200, response.content
        answers[job.name] = response.json()["allocations"]
    assert answers["cpu"] == [{"rank": 0, "node": str(node.pk), "device": None, "cpus": 2.0, "memory": GiB}]
    [worker] = answers["gpu"]  # the CPUs ride with the rank's GPU: one entry per rank's device, as before
    assert worker["device"]["kind"] == "virtual" and worker["cpus"] == 1.0 and worker["memory"] == 0
    assert state(cpu) == JobState.RUNNING
    assert Allocation.objects.filter(attempt__job=cpu, claimed_at__isnull=False).count() == 1


def test_cancel_preemption_and_the_reaper_release_cpus(submit_cpu, make_node, run_pass):
    node = make_node("n1", gpus=0, cpus=2)
    low = submit_cpu({"gpus": 0, "cpus": 2}, name="low")
    run_pass()
    victim = Attempt.objects.get(job=low)
    attempt_claim(victim.pk, victim.fencing_token, node)

    high = submit_cpu({"gpus": 0, "cpus": 1}, name="high", priority=50)
    assert run_pass().preempted == 1
    assert state(low) == JobState.PREEMPTED and state(high) == JobState.QUEUED
    attempt_finish(victim.pk, victim.fencing_token, node, "failed", "SIGTERM")
    run_pass()
    assert state(high) == JobState.SCHEDULED and held(node, "cpu") == 1.0

    job_cancel(Job.objects.get(pk=high.pk))  # unclaimed: released at once
    assert held(node, "cpu") == 0
    run_pass()
    running = Attempt.objects.get(job=low, ended_at__isnull=True)
    attempt_claim(running.pk, running.fencing_token, node)
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reap()["requeued"] == 1
    running.refresh_from_db()
    assert running.outcome == "node_lost" and state(low) == JobState.QUEUED and held(node, "cpu") == 0
