"""A started attempt its node no longer lists in its heartbeats (the node's worker was SIGKILLed and restarted
without it, or it could not report the attempt's end) ends as for a lost node after a node lease, instead of
holding its devices RUNNING for as long as the node lives. Found by the chaos suite (tests/chaos)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from node_protocol import NodeProtocol

from strata.jobs.models import Allocation, Attempt, Job, JobState


@pytest.fixture
def cluster(make_team, make_user, make_node, node_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    return {"team": team, "user": user, "node": make_node("n1", gpus=2), "agent": api(node_token)}


def _protocol(cluster, attempt=None) -> NodeProtocol:
    return NodeProtocol(cluster["agent"], attempt, cluster["node"])


def beat(cluster, attempts):
    cluster["node"].refresh_from_db()
    answer = _protocol(cluster).heartbeat(samples=[], attempts=[str(a.pk) for a in attempts])
    assert answer.status_code == 200, answer.content
    return answer.json()


def started(cluster, submit, run_pass) -> tuple[Job, Attempt]:
    job = submit(cluster["user"], cluster["team"], max_attempts=1)
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    claimed = _protocol(cluster, attempt).claim()
    assert claimed.status_code == 200
    return job, attempt


def age(attempt, seconds: float) -> None:
    """As if the node had stopped listing the attempt ``seconds`` ago."""
    Allocation.objects.filter(attempt=attempt).update(unreported_since=timezone.now() - timedelta(seconds=seconds))


def test_an_attempt_its_node_stops_listing_ends_node_lost_after_a_lease(cluster, submit, run_pass, settings):
    job, attempt = started(cluster, submit, run_pass)
    beat(cluster, [attempt])
    assert Allocation.objects.get(attempt=attempt).unreported_since is None
    # The worker died and forgot it: the next heartbeat does not list it. Noted, not yet ended (a lease of grace:
    # the claim and the node's list of running attempts are not one step).
    beat(cluster, [])
    attempt.refresh_from_db()
    assert attempt.ended_at is None and Allocation.objects.get(attempt=attempt).unreported_since is not None
    # Still unlisted a node lease later: ended as for a lost node, requeued without counting a failure, devices freed.
    age(attempt, settings.STRATA_NODE_LEASE_SECONDS + 1)
    beat(cluster, [])
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.outcome == Attempt.Outcome.NODE_LOST and "no longer runs it" in attempt.exit_reason
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()
    assert job.failures == 0 and job.state in {JobState.QUEUED, JobState.SCHEDULED}
    # Its late calls are fenced off: a zombie child cannot report for it.
    late = _protocol(cluster, attempt).report()
    assert late.status_code == 409


def test_listing_it_again_clears_the_mark(cluster, submit, run_pass, settings):
    _, attempt = started(cluster, submit, run_pass)
    beat(cluster, [])
    age(attempt, settings.STRATA_NODE_LEASE_SECONDS - 1)
    beat(cluster, [attempt])  # listed again in time: it runs
    assert Allocation.objects.get(attempt=attempt).unreported_since is None
    beat(cluster, [])
    attempt.refresh_from_db()
    assert attempt.ended_at is None


def test_attempts_not_yet_claimed_are_left_alone(cluster, submit, run_pass, settings):
    job = submit(cluster["user"], cluster["team"])
    run_pass()
    attempt = Attempt.objects.get(job=job)
    for _ in range(2):
        beat(cluster, [])
    age(attempt, settings.STRATA_NODE_LEASE_SECONDS + 1)
    beat(cluster, [])
    attempt.refresh_from_db()
    job.refresh_from_db()
    # Waiting for the node's worker to claim it (the dispatch republisher's business), never ended here.
    assert attempt.ended_at is None and job.state == JobState.SCHEDULED


def test_a_node_that_never_claims_its_dispatches_is_told_its_worker_stalled(cluster, submit, run_pass, settings):
    job = submit(cluster["user"], cluster["team"])
    run_pass()
    attempt = Attempt.objects.get(job=job)
    assert "stalled" not in beat(cluster, [])
    # Dispatched longer ago than the claim timeout, still unclaimed: the node's worker takes no work.
    Attempt.objects.filter(pk=attempt.pk).update(
        dispatched_at=timezone.now() - timedelta(seconds=settings.STRATA_CLAIM_TIMEOUT_SECONDS + 1))
    answer = beat(cluster, [])
    assert answer["stalled"] == {"attempts": 1, "after_seconds": settings.STRATA_CLAIM_TIMEOUT_SECONDS}
    # Once claimed it is no longer stalled.
    claimed = _protocol(cluster, attempt).claim()
    assert claimed.status_code == 200
    assert "stalled" not in beat(cluster, [attempt])
