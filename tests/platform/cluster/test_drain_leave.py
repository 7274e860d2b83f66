"""A node's graceful drain and leave (POST /api/v1/node/drain/ and /node/leave/), fenced like a heartbeat.

Drain: the node is DRAINING, the scheduler places nothing new on it, its attempts keep their devices and its
heartbeats keep its lease. Leave: the node is DOWN at once and its attempts end as for a lost node (``node_lost``,
requeued without counting a failure), so the worker's late reports about them are refused as stale. A new
registration makes the node UP again.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from node_protocol import NODE_API, NodeProtocol

from strata.cluster.models import Node
from strata.jobs.models import Attempt, Job, JobState


@pytest.fixture
def world(make_team, make_user, make_token, make_node, node_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    return {"team": team, "user": user, "n1": make_node("n1", gpus=1), "n2": make_node("n2", gpus=1),
            "agent": api(node_token), "client": api(make_token(user, team))}


def _call(world, node: Node, verb: str, session=None, **body):
    return NodeProtocol(world["agent"], node=node).node_post(verb, body, session=session)


def _attempt_call(world, node: Node, attempt: Attempt, verb: str, **body):
    return NodeProtocol(world["agent"], attempt, node).post(verb, body)


def _running_on(world, node: Node, submit, run_pass) -> tuple[Job, Attempt]:
    """A job placed on ``node`` (the other node is full or draining) and claimed there."""
    job = submit(world["user"], world["team"])
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    assert attempt.node_id == node.pk, "the job was expected on " + node.name
    assert _attempt_call(world, node, attempt, "claim").status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job, attempt


def test_a_draining_node_gets_no_new_work_but_keeps_its_attempts_and_lease(world, submit, run_pass):
    n1, n2 = world["n1"], world["n2"]
    # Fill n2 first, so the first job lands on n1.
    assert _call(world, n2, "drain").status_code == 200
    first, attempt = _running_on(world, n1, submit, run_pass)
    n2 = Node.objects.get(pk=n2.pk)
    # n2 comes back (a new registration is UP again); now n1 drains.
    from strata.cluster.services import node_register

    n2 = node_register(name="n2", devices=[{"index": 0, "kind": "virtual", "memory_total": 8 * 2**30}])
    assert n2.state == Node.State.UP
    answer = _call(world, n1, "drain")
    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == "draining" and answer.json()["attempts_left"] == 1
    assert _call(world, n1, "drain").status_code == 200  # twice is the same as once
    n1.refresh_from_db()
    assert n1.state == Node.State.DRAINING and n1.lease_valid

    # New work goes to the other node only; a third job waits (both devices are taken).
    second = submit(world["user"], world["team"])
    third = submit(world["user"], world["team"])
    run_pass()
    assert Attempt.objects.get(job=second).node_id == n2.pk
    third.refresh_from_db()
    assert third.state == JobState.QUEUED and not Attempt.objects.filter(job=third).exists()

    # Heartbeats keep it DRAINING and extend its lease; the running attempt is not told to stop.
    before = Node.objects.get(pk=n1.pk).lease_expires_at
    beat = _call(world, n1, "heartbeat", attempts=[str(attempt.pk)])
    assert beat.status_code == 200, beat.content
    assert beat.json()["state"] == "draining" and beat.json()["attempts_left"] == 1 and beat.json()["stop"] == []
    n1.refresh_from_db()
    assert n1.state == Node.State.DRAINING and n1.lease_expires_at >= before

    # The attempt finishes normally on the draining node; then nothing is left there, and still nothing new
    # is placed on it.
    assert _attempt_call(world, n1, attempt, "finish", outcome="succeeded").status_code == 200
    assert Job.objects.get(pk=first.pk).state == JobState.SUCCEEDED
    run_pass()
    assert not Attempt.objects.filter(job=third).exists()
    beat = _call(world, n1, "heartbeat")
    assert beat.json()["state"] == "draining" and beat.json()["attempts_left"] == 0


def test_a_free_draining_node_takes_nothing(world, submit, run_pass):
    n1, n2 = world["n1"], world["n2"]
    assert _call(world, n1, "drain").status_code == 200
    jobs = [submit(world["user"], world["team"]) for _ in range(2)]
    run_pass()
    placed = list(Attempt.objects.filter(job__in=jobs).values_list("node_id", flat=True))
    assert placed == [n2.pk]


def test_leave_requeues_the_nodes_attempts_without_counting_a_failure(world, submit, run_pass):
    n1, n2 = world["n1"], world["n2"]
    assert _call(world, n2, "drain").status_code == 200
    job, attempt = _running_on(world, n1, submit, run_pass)
    answer = _call(world, n1, "leave")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"state": "down", "released": 1}
    attempt.refresh_from_db()
    job.refresh_from_db()
    n1.refresh_from_db()
    assert attempt.outcome == Attempt.Outcome.NODE_LOST and attempt.ended_at is not None
    assert job.state == JobState.QUEUED and job.failures == 0
    assert n1.state == Node.State.DOWN and not n1.lease_valid
    # The worker's late report of its killed child is stale, not a failure.
    late = _attempt_call(world, n1, attempt, "finish", outcome="failed", reason="killed by signal 15")
    assert late.status_code == 409
    assert Job.objects.get(pk=job.pk).failures == 0
    # Leaving again is harmless; heartbeats and drains of the old session are refused (register again).
    assert _call(world, n1, "leave").json() == {"state": "down", "released": 0}
    assert _call(world, n1, "heartbeat").status_code == 409
    assert _call(world, n1, "drain").status_code == 409
    # Nothing is placed on the DOWN node: the job waits (n2 drains).
    run_pass()
    assert Attempt.objects.filter(job=job, ended_at__isnull=True).count() == 0

    # A new registration makes it UP again, and the job runs there.
    from strata.cluster.services import node_register

    again = node_register(name="n1", devices=[{"index": 0, "kind": "virtual", "memory_total": 8 * 2**30}])
    assert again.state == Node.State.UP and again.session != n1.session
    run_pass()
    assert Attempt.objects.get(job=job, ended_at__isnull=True).node_id == n1.pk
    assert _call(world, again, "heartbeat").json()["state"] == "up"


def test_leave_with_a_draining_node_and_an_unclaimed_attempt(world, submit, run_pass):
    n1, n2 = world["n1"], world["n2"]
    assert _call(world, n2, "drain").status_code == 200
    job = submit(world["user"], world["team"])
    run_pass()
    attempt = Attempt.objects.get(job=job)
    assert attempt.node_id == n1.pk and attempt.started_at is None
    assert _call(world, n1, "drain").json()["attempts_left"] == 1
    assert _call(world, n1, "leave").json()["released"] == 1
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.failures == 0
    assert _attempt_call(world, n1, attempt, "claim").status_code == 409


def test_another_session_or_node_cannot_drain_or_leave(world, submit, run_pass, make_token, make_user, api):
    n1, n2 = world["n1"], world["n2"]
    # Another node's session, a made-up session: 409, as a heartbeat of a replaced session.
    for verb in ("drain", "leave"):
        assert _call(world, n1, verb, session=n2.session).status_code == 409
        assert _call(world, n1, verb, session=uuid.uuid4()).status_code == 409
        unknown = _call(world, Node(pk=uuid.uuid4()), verb, session=n1.session)
        assert unknown.status_code == 404
        bad = world["agent"].post(f"{NODE_API}/{verb}/", {"node": str(n1.pk)}, format="json")
        assert bad.status_code == 400 and "session" in bad.json()
        # A user token is no node token.
        assert NodeProtocol(world["client"], node=n1).node_post(verb).status_code == 403
    n1.refresh_from_db()
    assert n1.state == Node.State.UP
    # A replaced session (the node registered again) cannot drain the new one.
    from strata.cluster.services import node_register

    old = n1.session
    node_register(name="n1", devices=[{"index": 0, "kind": "virtual", "memory_total": 8 * 2**30}])
    assert _call(world, n1, "drain", session=old).status_code == 409
    assert _call(world, n1, "leave", session=old).status_code == 409
    assert Node.objects.get(pk=n1.pk).state == Node.State.UP


def test_the_reaper_loses_a_draining_node_whose_lease_expired(world, submit, run_pass):
    from strata.scheduling.services import reap

    n1, n2 = world["n1"], world["n2"]
    assert _call(world, n2, "drain").status_code == 200
    job, attempt = _running_on(world, n1, submit, run_pass)
    assert _call(world, n1, "drain").status_code == 200
    Node.objects.filter(pk=n1.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    result = reap()
    assert result["lost_nodes"] >= 1 and result["requeued"] == 1
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.outcome == Attempt.Outcome.NODE_LOST and job.state == JobState.QUEUED and job.failures == 0
    assert Node.objects.get(pk=n1.pk).state == Node.State.DOWN
