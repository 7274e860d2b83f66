"""Property-based test of the job state machine: random transition attempts against the real database."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from strata.jobs.models import TERMINAL_STATES, Job, JobEvent, JobState
from strata.jobs.states import TRANSITIONS, InvalidTransition, allowed, transition

STATES = list(JobState.values)


def test_transition_table_is_closed_and_terminal_states_are_sinks():
    assert set(TRANSITIONS) == set(STATES)
    for source, targets in TRANSITIONS.items():
        assert targets <= set(STATES)
        assert source not in targets
    for state in TERMINAL_STATES:
        assert not TRANSITIONS[state]
    # Every non-terminal state can reach a terminal one.
    assert all(TRANSITIONS[state] & TERMINAL_STATES or state == JobState.PENDING or state == JobState.QUEUED
               for state in STATES if state not in TERMINAL_STATES)


@pytest.mark.django_db
def test_job_transitions_follow_the_table(make_team, make_user):
    team = make_team("alpha")
    owner = make_user("alice", team)

    class JobMachine(RuleBasedStateMachine):
        jobs = Bundle("jobs")

        def __init__(self):
            super().__init__()
            self.model: dict = {}  # job id -> expected state
            self.events: dict = {}  # job id -> expected number of state events

        def _new_job(self):
            job = Job.objects.create(team=team, owner=owner, kind="train", name="prop", resources={"gpus": 1.0})
            self.model[job.pk] = JobState.PENDING
            self.events[job.pk] = 0
            return job.pk

        @initialize(target=jobs)
        def first_job(self):
            return self._new_job()

        @rule(target=jobs)
        def another_job(self):
            return self._new_job()

        def _attempt(self, job_id, sources, target):
            current = self.model[job_id]
            expect = current in sources and allowed(current, target)
            try:
                transition(job_id, sources, target, reason="prop")
            except InvalidTransition as error:
                assert not expect, f"{current} -> {target} via {sources} should have succeeded"
                assert error.actual == current
            else:
                assert expect, f"{current} -> {target} via {sources} should have been refused"
                assert current not in TERMINAL_STATES
                self.model[job_id] = target
                self.events[job_id] += 1

        @rule(job_id=jobs, sources=st.lists(st.sampled_from(STATES), min_size=0, max_size=3),
              to=st.sampled_from(STATES))
        def random_transition(self, job_id, sources, to):
            self._attempt(job_id, sources, to)

        @rule(job_id=jobs, to=st.sampled_from(STATES))
        def transition_from_current(self, job_id, to):
            # Naming the true current state explores the allowed edges far more often than random sources.
            self._attempt(job_id, [self.model[job_id]], to)

        @rule(job_id=jobs, to=st.sampled_from(STATES))
        def transition_from_any(self, job_id, to):
            self._attempt(job_id, STATES, to)

        @invariant()
        def database_matches_model(self):
            states = dict(Job.objects.filter(pk__in=list(self.model)).values_list("id", "state"))
            assert states == self.model
            for job_id, count in self.events.items():
                assert JobEvent.objects.filter(job_id=job_id, kind="state").count() == count
            for job_id, state in self.model.items():
                if state in TERMINAL_STATES:
                    assert Job.objects.get(pk=job_id).finished_at is not None

    run_state_machine_as_test(JobMachine, settings=settings(
        max_examples=40, stateful_step_count=25, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


@pytest.mark.django_db
def test_transition_updates_the_passed_instance_and_sets_timestamps(make_team, make_user):
    team = make_team("alpha")
    job = Job.objects.create(team=team, owner=make_user("alice", team), kind="train", name="x")
    transition(job, JobState.PENDING, JobState.QUEUED, "admitted")
    assert job.state == JobState.QUEUED and job.queued_at is not None and job.reason == "admitted"
    transition(job, [JobState.QUEUED], JobState.CANCELLED)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.finished_at is not None
    with pytest.raises(InvalidTransition):
        transition(job, STATES, JobState.QUEUED)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
