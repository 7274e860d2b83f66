"""Quotas of jobs that need no GPU: max_cpus and max_memory at admission, exact CPU-seconds accounting, and the
quota fields through the API (the one table of rules, QUOTA_FIELDS)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from strata.cluster.models import Device
from strata.jobs.models import Allocation, Attempt, Job, JobState
from strata.jobs.services import QuotaRejected
from strata.quotas.models import Quota
from strata.quotas.services import QuotaInvalid, cpu_seconds, gpu_seconds, quota_clean, team_usage

GiB = 2**30


def state(job) -> str:
    return Job.objects.get(pk=job.pk).state


def test_max_cpus_holds_cpu_jobs_back_with_a_visible_reason(make_team, make_user, submit_resources):
    team = make_team("alpha", max_cpus=2.0)
    user = make_user("alice", team)
    jobs = [submit_resources(user, team, {"gpus": 0, "cpus": 0.75}, name=f"c{i}") for i in range(3)]
    assert [state(job) for job in jobs] == [JobState.QUEUED, JobState.QUEUED, JobState.PENDING]
    assert Job.objects.get(pk=jobs[2].pk).reason == "waiting: team at max_cpus (1.5 held + 0.75 requested > 2)"
    gang = submit_resources(user, team, {"gpus": 0, "cpus": 1, "workers": 2}, name="gang")
    assert state(gang) == JobState.PENDING  # workers count: 2 CPUs
    # A GPU job that states no CPUs is not held back by max_cpus; one that states them is.
    assert state(submit_resources(user, team, {"gpus": 0.5}, name="gpu")) == JobState.QUEUED
    assert state(submit_resources(user, team, {"gpus": 0.5, "cpus": 1}, name="gpu+cpu")) == JobState.PENDING
    usage = team_usage(team.pk)
    assert usage["cpus"] == pytest.approx(1.5) and usage["gpus"] == pytest.approx(0.5)
    with pytest.raises(QuotaRejected, match="max_cpus"):
        submit_resources(user, team, {"gpus": 0, "cpus": 3})


def test_max_memory_holds_back_what_the_jobs_reserve(make_team, make_user, submit_resources):
    team = make_team("alpha", max_memory=3 * GiB)
    user = make_user("alice", team)
    first = submit_resources(user, team, {"gpus": 0, "memory": "2GiB"}, name="first")
    second = submit_resources(user, team, {"gpus": 0, "memory": 2 * GiB}, name="second")
    unsized = submit_resources(user, team, {"gpus": 0}, name="unsized")  # reserves no memory
    assert [state(job) for job in (first, second, unsized)] == [JobState.QUEUED, JobState.PENDING, JobState.QUEUED]
    assert "team at max_memory" in Job.objects.get(pk=second.pk).reason
    assert team_usage(team.pk)["memory"] == 2 * GiB


def test_zero_limits_refuse_only_what_they_limit(make_team, make_user, submit_resources):
    team = make_team("alpha", max_gpus=0)
    user = make_user("alice", team)
    assert state(submit_resources(user, team, {"gpus": 0})) == JobState.QUEUED  # it holds no GPU
    with pytest.raises(QuotaRejected, match="max_gpus=0"):
        submit_resources(user, team, {"gpus": 0.5})
    Quota.objects.filter(team=team).update(max_gpus=None, max_cpus=0)
    with pytest.raises(QuotaRejected, match="max_cpus=0"):
        submit_resources(user, team, {"gpus": 0, "cpus": 0.5})
    assert state(submit_resources(user, team, {"gpus": 1}, name="gpu")) == JobState.QUEUED


def test_a_used_up_gpu_hours_window_does_not_hold_back_cpu_jobs(make_team, make_user, submit_resources):
    team = make_team("alpha", gpu_hours=0.0)
    user = make_user("alice", team)
    assert state(submit_resources(user, team, {"gpus": 0})) == JobState.QUEUED
    assert state(submit_resources(user, team, {"gpus": 1}, name="gpu")) == JobState.PENDING


def test_cpu_seconds_are_exact_and_separate_from_gpu_seconds(make_team, make_user, submit_resources, make_node,
                                                              run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("n1", gpus=1, cpus=8)
    job = submit_resources(user, team, {"gpus": 0, "cpus": 2, "workers": 2})
    gpu_job = submit_resources(user, team, {"gpus": 0.5, "cpus": 1}, name="gpu")
    run_pass()
    now = timezone.now()
    Attempt.objects.filter(job=job).update(dispatched_at=now - timedelta(hours=2), ended_at=now - timedelta(hours=1))
    Allocation.objects.filter(attempt__job=job).update(active=False)
    Attempt.objects.filter(job=gpu_job).update(dispatched_at=now - timedelta(minutes=30))
    assert Allocation.objects.filter(attempt__job=job, device__kind=Device.Kind.CPU).count() == 2
    # 2 workers x 2 CPUs for an hour, and the GPU job's CPU for the half hour it has run so far.
    assert cpu_seconds(team.pk, until=now) == pytest.approx(4 * 3600 + 1800, rel=1e-6)
    assert cpu_seconds(team.pk, since=now - timedelta(minutes=90), until=now) == pytest.approx(4 * 1800 + 1800,
                                                                                                  rel=1e-6)
    assert gpu_seconds(team.pk, until=now) == pytest.approx(0.5 * 1800, rel=1e-6)  # CPU jobs bill no GPU
    usage = team_usage(team.pk)
    assert usage["cpu_hours_total"] == pytest.approx(4 + 0.5, rel=1e-3)


def test_quota_fields_through_the_api_and_quota_clean(make_team, make_user, make_token, api):
    team = make_team("alpha")
    admin = make_user("root", admin=True)
    client = api(make_token(admin, team))
    response = client.patch("/api/v1/quotas/alpha/", {"max_cpus": 2.5, "max_memory": "16GiB"}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["max_cpus"], response.json()["max_memory"]) == (2.5, 16 * GiB)
    quota = Quota.objects.get(team=team)
    assert (quota.max_cpus, quota.max_memory) == (2.5, 16 * GiB)
    bad = client.patch("/api/v1/quotas/alpha/", {"max_cpus": -1, "max_memory": "lots"}, format="json")
    assert bad.status_code == 400 and {"max_cpus", "max_memory"} <= set(bad.json())
    with pytest.raises(QuotaInvalid) as error:
        quota_clean({"max_cpus": "abc", "max_memory": "-1GiB"})
    assert set(error.value.errors) == {"max_cpus", "max_memory"}
    assert quota_clean({"max_cpus": "", "max_memory": "512MiB"}) == {"max_cpus": None, "max_memory": 512 * 2**20}
    usage = client.get("/api/v1/quotas/alpha/usage/").json()["usage"]
    assert {"cpus", "memory", "cpu_hours_window", "cpu_hours_total"} <= set(usage)
