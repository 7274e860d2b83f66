"""``finish`` with outcome ``service_lost``: the node's GPU-sharing service died under the attempt. The job is
requeued without counting a failure, as for a lost node, until it has lost its service three times."""

from __future__ import annotations

import pytest
from node_protocol import NodeProtocol

from strata.jobs.models import Allocation, Attempt, Job, JobEvent, JobState
from strata.jobs.services import SERVICE_LOST_LIMIT


@pytest.fixture
def cluster(make_team, make_user, make_token, make_node, node_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=1)
    return {"team": team, "user": user, "node": node, "agent": api(node_token)}


def _call(cluster, attempt, verb, **body):
    return NodeProtocol(cluster["agent"], attempt, cluster["node"]).post(verb, body)


def _run(cluster, job, run_pass, number) -> Attempt:
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    assert attempt.number == number
    assert _call(cluster, attempt, "claim").status_code == 200
    return attempt


def test_service_lost_requeues_without_a_failure_then_fails_at_the_limit(cluster, submit, run_pass):
    job = submit(cluster["user"], cluster["team"], gpus=0.5, max_attempts=5)
    for number in range(1, SERVICE_LOST_LIMIT):
        attempt = _run(cluster, job, run_pass, number)
        response = _call(cluster, attempt, "finish", outcome="service_lost",
                         reason="the GPU-sharing service died mid-attempt (EOFError)")
        assert response.status_code == 200, response.content
        assert response.json() == {"job_state": "QUEUED"}
        job.refresh_from_db()
        attempt.refresh_from_db()
        assert job.failures == 0
        assert attempt.outcome == Attempt.Outcome.SERVICE_LOST
        assert attempt.exit_reason.startswith("GPU-sharing service died; requeued"), attempt.exit_reason
        assert "EOFError" in attempt.exit_reason
        assert job.reason.startswith("GPU-sharing service died; requeued"), job.reason
        assert not Allocation.objects.filter(attempt=attempt, active=True).exists()

    # An ordinary failure in between still counts, and does not count as a lost service.
    attempt = _run(cluster, job, run_pass, SERVICE_LOST_LIMIT)
    assert _call(cluster, attempt, "finish", outcome="failed", reason="exit code 1").json() == {"job_state": "QUEUED"}
    assert Job.objects.get(pk=job.pk).failures == 1

    # The third loss of its service fails the job, although attempts are left.
    attempt = _run(cluster, job, run_pass, SERVICE_LOST_LIMIT + 1)
    response = _call(cluster, attempt, "finish", outcome="service_lost", reason="the service crashed")
    assert response.json() == {"job_state": "FAILED"}
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.state == JobState.FAILED and job.failures == 2 and job.finished_at is not None
    assert attempt.outcome == Attempt.Outcome.FAILED
    assert f"GPU-sharing service died under this job {SERVICE_LOST_LIMIT} times" in attempt.exit_reason
    assert run_pass().placed == 0
    assert JobEvent.objects.filter(job_id=job.pk, kind="state", message__contains="requeued").count() >= 2


def test_service_lost_of_a_cancelled_job_stays_cancelled(cluster, submit, run_pass):
    from strata.jobs.services import job_cancel

    job = submit(cluster["user"], cluster["team"], gpus=0.5)
    attempt = _run(cluster, job, run_pass, 1)
    job_cancel(Job.objects.get(pk=job.pk))
    response = _call(cluster, attempt, "finish", outcome="service_lost", reason="EOFError")
    assert response.json() == {"job_state": "CANCELLED"}
    attempt.refresh_from_db()
    assert attempt.outcome == Attempt.Outcome.CANCELLED
    assert Job.objects.get(pk=job.pk).failures == 0


def test_unknown_outcomes_are_still_refused(cluster, submit, run_pass):
    job = submit(cluster["user"], cluster["team"], gpus=0.5)
    attempt = _run(cluster, job, run_pass, 1)
    assert _call(cluster, attempt, "finish", outcome="node_lost").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_old_service_losses_their_own_outcome(make_team, make_user, make_node, submit, run_pass):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("n1", gpus=1)
    lost, node_lost = submit(user, team, gpus=0.5, name="lost"), submit(user, team, gpus=0.5, name="node")
    run_pass()
    service_attempt, node_attempt = Attempt.objects.get(job=lost), Attempt.objects.get(job=node_lost)
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("jobs", "0007_remove_attempt_sharing")])
        old = MigrationExecutor(connection).loader.project_state([("jobs", "0007_remove_attempt_sharing")]).apps
        OldAttempt = old.get_model("jobs", "Attempt")
        OldAttempt.objects.filter(pk=service_attempt.pk).update(
            outcome="node_lost", exit_reason="GPU-sharing service died; requeued (EOFError)")
        OldAttempt.objects.filter(pk=node_attempt.pk).update(outcome="node_lost", exit_reason="node lease expired")
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert Attempt.objects.get(pk=service_attempt.pk).outcome == Attempt.Outcome.SERVICE_LOST
    assert Attempt.objects.get(pk=node_attempt.pk).outcome == Attempt.Outcome.NODE_LOST
