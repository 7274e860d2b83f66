"""Concurrent submits against PostgreSQL: admission under a quota is serialized on the quota row."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from strata.jobs.models import Job, JobState

N = 50


def _run_concurrently(target, count):
    barrier = threading.Barrier(count)
    errors = []

    def worker(i):
        try:
            barrier.wait(timeout=30)
            target(i)
        except Exception as error:  # collected and asserted on in the main thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return errors


def _assert_one_admitted(team, count=N):
    jobs = list(Job.objects.filter(team=team))
    assert len(jobs) == count
    admitted = [job for job in jobs if job.state in {JobState.QUEUED, JobState.SCHEDULED}]
    pending = [job for job in jobs if job.state == JobState.PENDING]
    assert len(admitted) == 1, [job.state for job in jobs]
    assert len(pending) == count - 1
    assert all("max_concurrent_jobs" in job.reason for job in pending), {job.reason for job in pending}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_service_submits_admit_exactly_one(make_team, make_user, monkeypatch):
    """50 racing submits: only the quota-row lock stands between them (the inline scheduling pass each
    submit would trigger is switched off here so the race is on admission alone)."""
    from strata import celery
    from strata.jobs.services import job_submit

    monkeypatch.setattr(celery, "request_pass", lambda: None)

    team = make_team("alpha", max_concurrent_jobs=1)
    user = make_user("alice", team)
    data = {"kind": "train", "spec": {"workload": "mlp-digits", "epochs": 1}, "resources": {"gpus": 1.0,
            "gpu_memory": None, "workers": 1}, "priority": 0, "max_attempts": 3, "time_limit": 3600}

    errors = _run_concurrently(lambda i: job_submit(user=user, team=team, data={**data, "name": f"j{i}"}), N)
    assert not errors, errors
    _assert_one_admitted(team)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_api_submits_admit_exactly_one(make_team, make_user, make_token, make_node, job_body):
    """Racing API submits, each running the inline scheduling pass (advisory lock) after its commit: one job
    is admitted and placed on the single device, the rest wait under the quota."""
    from rest_framework.test import APIClient

    count = 20  # each submit also runs a full pass; 20 keeps this test to a few seconds
    make_node("n1", gpus=1)

    team = make_team("alpha", max_concurrent_jobs=1)
    raw = make_token(make_user("alice", team), team)
    codes = []

    def submit(i):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        codes.append(client.post("/api/v1/jobs/", job_body(name=f"j{i}"), format="json").status_code)

    errors = _run_concurrently(submit, count)
    assert not errors, errors
    assert codes == [201] * count
    _assert_one_admitted(team, count)
    assert Job.objects.filter(team=team, state=JobState.SCHEDULED).count() == 1, [(j.state, j.reason) for j in Job.objects.filter(team=team).exclude(state=JobState.PENDING)]
