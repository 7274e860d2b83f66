"""Lifecycle events reach the plugins' subscribers after commit: transitions (the scheduler's bulk moves too),
attempt ends and metrics; never for a rolled-back transaction; a failing subscriber breaks nothing."""

from __future__ import annotations

import pytest
from django.db import transaction

from components.runtime.contract.events import AttemptEnded, JobTransitioned, MetricsReported
from components.runtime.contract.plugins import Plugin
from strata.jobs.models import Attempt, JobState

SEEN: list = []


def record(event) -> None:
    SEEN.append(event)


def explode(event) -> None:
    raise RuntimeError("a broken subscriber")


RECORDER = Plugin(name="recorder", subscribers=(f"{__name__}:explode", f"{__name__}:record"))


@pytest.fixture
def events(install_plugins):
    SEEN.clear()
    install_plugins(f"{__name__}:RECORDER")
    yield SEEN
    SEEN.clear()


def transitions(seen, job_id=None):
    return [(event.source, event.target) for event in seen
            if isinstance(event, JobTransitioned) and (job_id is None or event.job_id == str(job_id))]


@pytest.mark.django_db(transaction=True)
def test_a_job_life_is_announced_to_subscribers(events, make_team, make_user, make_node, node_protocol, submit,
                                                run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=2)
    first, second = submit(user, team), submit(user, team)  # each commit requests a pass (inline in tests)
    run_pass()
    for job in (first, second):
        assert transitions(events, job.pk)[:3] == [(None, "PENDING"), ("PENDING", "QUEUED"), ("QUEUED", "SCHEDULED")]
    scheduled = [event for event in events if isinstance(event, JobTransitioned) and event.target == "SCHEDULED"]
    assert len(scheduled) == 2 and all(event.reason.startswith("placed") for event in scheduled)  # the bulk move
    assert all(event.kind == "train" and event.team_id == team.pk for event in scheduled)

    attempt = Attempt.objects.get(job=first, ended_at__isnull=True)
    protocol = node_protocol(attempt, node, claim=False)
    assert protocol.claim().status_code == 200
    assert ("SCHEDULED", "RUNNING") in transitions(events, first.pk)
    assert protocol.report(metrics=[
        {"name": "loss", "step": 2, "value": 0.5}, {"name": "loss", "step": 1, "value": 0.9}]).status_code == 200
    reported = [event for event in events if isinstance(event, MetricsReported)]
    assert reported[-1].last == {"loss": 0.5} and reported[-1].step == 2
    assert protocol.finish("succeeded").status_code == 200
    ended = [event for event in events if isinstance(event, AttemptEnded)]
    assert [(event.attempt_id, event.outcome) for event in ended] == [(str(attempt.pk), "succeeded")]
    assert ("RUNNING", "SUCCEEDED") in transitions(events, first.pk)
    first.refresh_from_db()
    assert first.state == JobState.SUCCEEDED  # the raising subscriber broke nothing
    assert events[-1].as_dict()["event"] in {"job.transitioned", "attempt.ended"}


@pytest.mark.django_db(transaction=True)
def test_nothing_is_announced_for_a_rolled_back_transaction(events, make_team, make_user):
    from strata.jobs.models import Job
    from strata.jobs.services import job_cancel

    team = make_team("alpha")
    user = make_user("alice", team)
    job = Job.objects.create(team=team, owner=user, kind="train", name="j", spec={}, resources={},
                             state=JobState.QUEUED)
    with pytest.raises(RuntimeError), transaction.atomic():
        job_cancel(job)
        raise RuntimeError("roll back")
    assert transitions(events, job.pk) == []
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
