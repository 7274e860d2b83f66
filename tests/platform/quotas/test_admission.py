"""Quota admission, quota changes, exact GPU-second accounting and who may change quotas."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from strata.jobs.models import Attempt, Job, JobState
from strata.jobs.services import QuotaRejected, attempt_claim
from strata.quotas.models import Quota
from strata.quotas.services import gpu_seconds, team_usage


def state(job) -> str:
    return Job.objects.get(pk=job.pk).state


def set_quota(team, **fields):
    Quota.objects.filter(team=team).update(**fields)


def test_fractional_max_gpus(make_team, make_user, submit):
    team = make_team("alpha", max_gpus=1.0)
    user = make_user("alice", team)
    jobs = [submit(user, team, gpus=0.5, name=f"h{i}") for i in range(3)]
    assert [state(job) for job in jobs] == [JobState.QUEUED, JobState.QUEUED, JobState.PENDING]
    assert "max_gpus" in Job.objects.get(pk=jobs[2].pk).reason
    quarter = submit(user, team, gpus=0.25)
    assert state(quarter) == JobState.PENDING
    with pytest.raises(QuotaRejected):
        submit(user, team, gpus=2)


def test_quota_rejection_over_api_is_400(make_team, make_user, make_token, api, job_body):
    team = make_team("alpha", max_gpus=0.5)
    client = api(make_token(make_user("alice", team), team))
    response = client.post("/api/v1/jobs/", job_body(resources={"gpus": 1}), format="json")
    assert response.status_code == 400 and "resources" in response.json()
    assert client.post("/api/v1/jobs/", job_body(resources={"gpus": 0.5}), format="json").status_code == 201
    set_quota(team, max_concurrent_jobs=0)
    assert client.post("/api/v1/jobs/", job_body(resources={"gpus": 0.5}), format="json").status_code == 400


def test_max_gpu_memory(make_team, make_user, submit):
    team = make_team("alpha", max_gpu_memory=3 * 2**30)
    user = make_user("alice", team)
    first = submit(user, team, gpus=0, memory=2 * 2**30)
    second = submit(user, team, gpus=0, memory=2 * 2**30)
    assert (state(first), state(second)) == (JobState.QUEUED, JobState.PENDING)
    assert "max_gpu_memory" in Job.objects.get(pk=second.pk).reason


def _ended_attempt(job, dispatched, ended, share):
    number = Attempt.objects.filter(job=job).count() + 1
    return Attempt.objects.create(job=job, number=number, fencing_token=f"t{number}", gpu_share=share,
                                  dispatched_at=dispatched, ended_at=ended, outcome="succeeded")


def test_gpu_hours_window_blocks_admission(make_team, make_user, submit, run_pass):
    team = make_team("alpha", gpu_hours=1.0, window_hours=24)
    user = make_user("alice", team)
    old = submit(user, team, name="old")
    now = timezone.now()
    # 1.5 GPU-hours inside the window: over the 1 GPU-hour budget.
    _ended_attempt(old, now - timedelta(hours=2), now - timedelta(minutes=30), 1.0)
    Job.objects.filter(pk=old.pk).update(state=JobState.SUCCEEDED)
    blocked = submit(user, team, name="blocked")
    assert state(blocked) == JobState.PENDING
    assert "GPU-hours" in Job.objects.get(pk=blocked.pk).reason
    # A job sized by memory alone holds a real share of a device: the budget holds it back too.
    small = submit(user, team, gpus=0, memory=2**20, name="small")
    assert state(small) == JobState.PENDING
    # Usage from before the window does not count.
    Attempt.objects.filter(job=old).update(dispatched_at=now - timedelta(hours=50), ended_at=now - timedelta(hours=48))
    run_pass()
    assert state(blocked) == JobState.QUEUED


def test_lowering_quota_leaves_running_jobs_but_blocks_new(make_team, make_user, submit, make_node, run_pass):
    team = make_team("alpha", max_concurrent_jobs=2)
    user = make_user("alice", team)
    node = make_node("n1", gpus=4)
    running = [submit(user, team, name=f"r{i}") for i in range(2)]
    run_pass()
    for job in running:
        attempt = Attempt.objects.get(job=job)
        attempt_claim(attempt.pk, attempt.fencing_token, node)
    set_quota(team, max_concurrent_jobs=1)
    run_pass()
    assert [state(job) for job in running] == [JobState.RUNNING, JobState.RUNNING]
    newcomer = submit(user, team, name="new")
    run_pass()
    assert state(newcomer) == JobState.PENDING
    set_quota(team, max_concurrent_jobs=3)
    result = run_pass()
    assert result.admitted == 1 and result.placed == 1
    assert state(newcomer) == JobState.SCHEDULED


def test_raising_quota_via_api_admits_pending_on_next_pass(make_team, make_user, make_token, submit, api,
                                                           django_capture_on_commit_callbacks):
    team = make_team("alpha", max_concurrent_jobs=1)
    user = make_user("alice", team)
    jobs = [submit(user, team, name=f"j{i}") for i in range(3)]
    assert [state(job) for job in jobs].count(JobState.PENDING) == 2
    admin = api(make_token(make_user("root", admin=True), team))
    with django_capture_on_commit_callbacks(execute=True):
        response = admin.patch("/api/v1/quotas/alpha/", {"max_concurrent_jobs": 3}, format="json")
    assert response.status_code == 200 and response.json()["max_concurrent_jobs"] == 3
    assert all(state(job) == JobState.QUEUED for job in jobs)


def test_gpu_seconds_are_exact(make_team, make_user, submit):
    team = make_team("alpha")
    other = make_team("beta")
    user = make_user("alice", team)
    job = submit(user, team)
    t0 = timezone.now() - timedelta(hours=1)
    _ended_attempt(job, t0, t0 + timedelta(seconds=100), 0.5)            # 50
    _ended_attempt(job, t0 + timedelta(seconds=10), t0 + timedelta(seconds=70), 2.0)  # 120
    running = _ended_attempt(job, t0 + timedelta(seconds=200), None, 0.25)
    Attempt.objects.filter(pk=running.pk).update(outcome="")
    never = Attempt.objects.create(job=job, number=9, fencing_token="x", gpu_share=1.0)  # never dispatched
    assert never.billed_seconds() == 0.0
    until = t0 + timedelta(seconds=400)  # the running one has held 0.25 GPU for 200 s by then: 50
    assert gpu_seconds(team.pk, until=until) == pytest.approx(50 + 120 + 50)
    # Clipped to a window starting at t0+50: 50 s * 0.5 + 20 s * 2 + 200 s * 0.25.
    assert gpu_seconds(team.pk, since=t0 + timedelta(seconds=50), until=until) == pytest.approx(25 + 40 + 50)
    assert gpu_seconds(other.pk) == 0.0
    Attempt.objects.filter(pk=running.pk).update(ended_at=t0 + timedelta(seconds=300))
    assert gpu_seconds(team.pk) == pytest.approx(50 + 120 + 25)
    usage = team_usage(team.pk)
    assert usage["gpu_hours_total"] == pytest.approx(195 / 3600)
    assert usage["gpu_hours_window"] == pytest.approx(195 / 3600)
    assert usage["jobs"] == 1 and usage["gpus"] == 1.0


def test_usage_endpoint(make_team, make_user, make_token, submit, api):
    team = make_team("alpha", max_gpus=4)
    user = make_user("alice", team)
    job = submit(user, team, gpus=0.5)
    submit(user, team, gpus=0.25)
    t0 = timezone.now() - timedelta(hours=2)
    _ended_attempt(job, t0, t0 + timedelta(seconds=3600), 0.5)
    response = api(make_token(user, team)).get("/api/v1/quotas/alpha/usage/")
    assert response.status_code == 200
    data = response.json()
    assert data["team"] == "alpha" and data["quota"]["max_gpus"] == 4
    assert data["usage"]["gpu_hours_total"] == pytest.approx(0.5)
    assert data["usage"]["gpu_hours_window"] == pytest.approx(0.5)
    assert data["usage"]["jobs"] == 2 and data["usage"]["gpus"] == pytest.approx(0.75)
    assert data["usage"]["pending"] == 0


def test_only_cluster_admins_may_change_quotas(make_team, make_user, make_token, api):
    team = make_team("alpha")
    member = api(make_token(make_user("alice", team), team))
    team_admin = api(make_token(make_user("boss", team, role="team-admin"), team))
    for client in (member, team_admin):
        assert client.patch("/api/v1/quotas/alpha/", {"max_gpus": 100}, format="json").status_code == 403
        assert client.put("/api/v1/quotas/alpha/", {"max_gpus": 100}, format="json").status_code == 403
    assert Quota.objects.get(team=team).max_gpus is None
    assert member.get("/api/v1/quotas/alpha/").status_code == 200
    root = api(make_token(make_user("root", admin=True), team))
    response = root.patch("/api/v1/quotas/alpha/", {"max_gpus": 1.5, "weight": 2}, format="json")
    assert response.status_code == 200
    quota = Quota.objects.get(team=team)
    assert (quota.max_gpus, quota.weight) == (1.5, 2.0)
    bad = root.patch("/api/v1/quotas/alpha/", {"max_gpus": -1, "weight": 0}, format="json")
    assert bad.status_code == 400 and {"max_gpus", "weight"} <= set(bad.json())
    assert root.patch("/api/v1/quotas/alpha/", {"team": "beta"}, format="json").status_code == 200
    assert Quota.objects.get(team=team).team.slug == "alpha"
    # Sizes read like the web editor's: "16GiB" or bytes; a bad size names the field.
    sized = root.patch("/api/v1/quotas/alpha/", {"max_gpu_memory": "16GiB"}, format="json")
    assert sized.status_code == 200 and sized.json()["max_gpu_memory"] == 16 * 2**30
    assert Quota.objects.get(team=team).max_gpu_memory == 16 * 2**30
    wrong = root.patch("/api/v1/quotas/alpha/", {"max_gpu_memory": "lots"}, format="json")
    assert wrong.status_code == 400 and "max_gpu_memory" in wrong.json()
    assert root.patch("/api/v1/quotas/alpha/", {"max_gpu_memory": None}, format="json").json()["max_gpu_memory"] is None
