"""The scheduling pass: placement, fair share, preemption, reaping and reconciling."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from strata.cluster.models import Node
from strata.jobs.models import Allocation, Attempt, Job, JobState
from strata.jobs.services import SubmitRejected, attempt_claim, attempt_finish
from strata.scheduling.services import reap, reconcile

GiB = 2**30


def state(job) -> str:
    return Job.objects.get(pk=job.pk).state


def allocations(job):
    return list(Allocation.objects.filter(attempt__job=job, active=True).select_related("device"))


def test_whole_gpu_placement_fills_devices_then_waits(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=2)
    jobs = [submit(user, team, name=f"j{i}") for i in range(3)]
    result = run_pass()
    assert result.placed == 2 and result.waiting == 1
    assert [state(job) for job in jobs] == [JobState.SCHEDULED, JobState.SCHEDULED, JobState.QUEUED]
    devices = {allocations(job)[0].device_id for job in jobs[:2]}
    assert len(devices) == 2
    assert "no node has free devices" in Job.objects.get(pk=jobs[2].pk).reason


def test_multi_gpu_job_gets_whole_devices_on_one_node(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1)
    make_node("n2", gpus=2)
    job = submit(user, team, gpus=2)
    run_pass()
    taken = allocations(job)
    assert len(taken) == 2 and {a.device.node.name for a in taken} == {"n2"}
    assert all(a.share == 1.0 for a in taken)
    assert Attempt.objects.get(job=job).gpu_share == 2.0


def test_fractional_jobs_pack_onto_one_device(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=2)
    jobs = [submit(user, team, gpus=0.25, name=f"q{i}") for i in range(4)]
    assert run_pass().placed == 4
    devices = {a.device_id for job in jobs for a in allocations(job)}
    assert len(devices) == 1, "four quarter-GPU jobs must share one device (best fit)"
    assert sum(a.share for job in jobs for a in allocations(job)) == pytest.approx(1.0)
    # The other device is still whole: a 1-GPU job fits, a fifth quarter goes there too.
    whole = submit(user, team, gpus=1, name="whole")
    run_pass()
    assert state(whole) == JobState.SCHEDULED
    assert allocations(whole)[0].device_id not in devices
    fifth = submit(user, team, gpus=0.25, name="q5")
    run_pass()
    assert state(fifth) == JobState.QUEUED


def test_memory_aware_placement(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    with pytest.raises(SubmitRejected, match="no device has 16 GiB of memory"):
        submit(user, team, gpus=0, memory=16 * GiB, name="big")
    fits = submit(user, team, gpus=0, memory=2 * GiB, name="small")
    waits = submit(user, team, gpus=0, memory=7 * GiB, name="waits")
    run_pass()
    assert state(waits) == JobState.QUEUED
    assert Job.objects.get(pk=waits.pk).reason.startswith("waiting")
    assert state(fits) == JobState.SCHEDULED
    (allocation,) = allocations(fits)
    assert allocation.memory == 2 * GiB and allocation.share == pytest.approx(0.25)


def test_memory_limits_packing_of_fractions(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    jobs = [submit(user, team, gpus=0.25, memory=3 * GiB, name=f"m{i}") for i in range(3)]
    run_pass()
    assert Counter(state(job) for job in jobs) == {JobState.SCHEDULED: 2, JobState.QUEUED: 1}


def test_a_shared_job_is_placed_on_the_memory_it_measured(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    holder = submit(user, team, gpus=0.25, memory=6 * GiB, name="holder")
    run_pass()
    assert state(holder) == JobState.SCHEDULED  # n1's device: 0.75 GPU and 2 GiB left
    # A quarter-GPU job whose earlier shared attempt measured 3 GiB (its share alone would reserve 2 GiB).
    job = submit(user, team, gpus=0.25, name="measured")
    Attempt.objects.create(job=job, number=1, fencing_token="t", ended_at=timezone.now(), outcome="node_lost",
                           measured_memory=3 * GiB)
    run_pass()
    assert state(job) == JobState.QUEUED, "3.3 GiB does not fit the 2 GiB left: it must wait or go elsewhere"
    make_node("n2", gpus=1, memory=8 * GiB)
    run_pass()
    assert state(job) == JobState.SCHEDULED
    (allocation,) = allocations(job)
    assert allocation.device.node.name == "n2"
    assert allocation.memory == int(3 * GiB * 1.1) and allocation.share == pytest.approx(0.25)


def test_gang_placement_is_all_or_nothing(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1)
    make_node("n2", gpus=1)
    busy = submit(user, team, priority=9, name="busy")
    run_pass()
    assert state(busy) == JobState.SCHEDULED  # one device left: not enough for the 2-worker gang
    gang = submit(user, team, workers=2, priority=5, name="gang")
    single = submit(user, team, name="single")
    run_pass()
    assert state(gang) == JobState.QUEUED
    assert not Attempt.objects.filter(job=gang).exists()
    assert state(single) == JobState.SCHEDULED  # the gang's failed try did not hold the free device


def test_gang_spans_two_devices(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1)
    make_node("n2", gpus=1)
    gang = submit(user, team, workers=2)
    run_pass()
    assert state(gang) == JobState.SCHEDULED
    taken = allocations(gang)
    assert sorted(a.rank for a in taken) == [0, 1]
    assert len({a.device_id for a in taken}) == 2
    assert Attempt.objects.get(job=gang).gpu_share == 2.0


def test_priority_order(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1)
    low = submit(user, team, priority=0, name="low")
    high = submit(user, team, priority=10, name="high")
    run_pass()
    assert state(high) == JobState.SCHEDULED and state(low) == JobState.QUEUED


def test_priority_ties_go_first_come_first_served(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1)
    first = submit(user, team, name="first")
    second = submit(user, team, name="second")
    Job.objects.filter(pk=second.pk).update(queued_at=timezone.now() - timedelta(hours=1))
    run_pass()
    assert state(second) == JobState.SCHEDULED and state(first) == JobState.QUEUED


def test_weighted_fair_share_between_teams(make_team, make_user, submit, make_node, run_pass):
    heavy = make_team("heavy", weight=2.0)
    light = make_team("light", weight=1.0)
    alice, bob = make_user("alice", heavy), make_user("bob", light)
    make_node("n1", gpus=6)
    jobs = {team.slug: [submit(user, team, name=f"{team.slug}{i}") for i in range(6)]
            for team, user in ((heavy, alice), (light, bob))}
    assert run_pass().placed == 6
    placed = {slug: sum(state(job) == JobState.SCHEDULED for job in group) for slug, group in jobs.items()}
    assert placed == {"heavy": 4, "light": 2}


def test_equal_weights_split_evenly(make_team, make_user, submit, make_node, run_pass):
    teams = [make_team("t1"), make_team("t2")]
    users = [make_user("u1", teams[0]), make_user("u2", teams[1])]
    make_node("n1", gpus=4)
    jobs = [[submit(user, team, name=f"{team.slug}-{i}") for i in range(4)] for team, user in zip(teams, users, strict=True)]
    run_pass()
    assert [sum(state(job) == JobState.SCHEDULED for job in group) for group in jobs] == [2, 2]


def test_preemption_and_requeue(alpha, submit, make_node, run_pass):
    user, team = alpha
    node = make_node("n1", gpus=1)
    low = submit(user, team, priority=0, name="low")
    run_pass()
    victim = Attempt.objects.get(job=low)
    attempt_claim(victim.pk, victim.fencing_token, node)
    assert state(low) == JobState.RUNNING

    high = submit(user, team, priority=50, name="high")
    result = run_pass()
    assert result.preempted == 1
    assert state(low) == JobState.PREEMPTED
    assert state(high) == JobState.QUEUED  # the device is still held until the victim's node lets go
    assert "preempting" in Job.objects.get(pk=high.pk).reason
    assert run_pass().preempted == 0  # a stopping victim is not preempted twice

    attempt_finish(victim.pk, victim.fencing_token, node, "failed", "SIGTERM")
    low.refresh_from_db()
    victim.refresh_from_db()
    assert low.state == JobState.QUEUED and low.failures == 0
    assert victim.outcome == "preempted"
    run_pass()
    assert state(high) == JobState.SCHEDULED
    assert state(low) == JobState.QUEUED


def test_no_preemption_of_equal_or_higher_priority(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("n1", gpus=1)
    first = submit(user, team, priority=5, name="first")
    run_pass()
    second = submit(user, team, priority=5, name="second")
    assert run_pass().preempted == 0
    assert state(first) == JobState.SCHEDULED and state(second) == JobState.QUEUED


def test_reaper_requeues_attempts_of_lost_nodes_without_counting_failures(alpha, submit, make_node, run_pass):
    user, team = alpha
    node = make_node("n1", gpus=1)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    assert reap()["lost_nodes"] == 0
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    result = reap()
    assert result["lost_nodes"] == 1 and result["requeued"] == 1
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.outcome == "node_lost" and attempt.ended_at is not None
    assert job.state == JobState.QUEUED and job.failures == 0
    assert Node.objects.get(pk=node.pk).state == Node.State.DOWN
    assert not Allocation.objects.filter(attempt=attempt, active=True).exists()
    assert run_pass().placed == 0  # a down node takes no work
    assert reap()["requeued"] == 0


def test_reaper_fails_overdue_attempts(alpha, submit, make_node, run_pass):
    user, team = alpha
    node = make_node("n1", gpus=1)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    Attempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now() - timedelta(seconds=3600 + 61))
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() + timedelta(hours=1))
    assert reap()["overdue"] == 1
    job.refresh_from_db()
    assert job.state == JobState.FAILED and Attempt.objects.get(pk=attempt.pk).outcome == "time_limit"


def test_reregistering_a_node_releases_its_old_sessions_attempts(alpha, submit, make_node, run_pass):
    user, team = alpha
    node = make_node("n1", gpus=1)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    again = make_node("n1", gpus=1)
    assert again.pk == node.pk and again.session != node.session
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.outcome == "node_lost" and "restarted" in attempt.exit_reason
    assert job.state == JobState.QUEUED and job.failures == 0
    run_pass()
    new = Attempt.objects.get(job=job, ended_at__isnull=True)
    assert new.number == 2 and new.node_session == again.session


def test_reconciler_republishes_stale_unclaimed_dispatches(alpha, submit, make_node, run_pass, published):
    user, team = alpha
    node = make_node("n1", gpus=2)
    stale_job = submit(user, team, name="stale")
    claimed_job = submit(user, team, name="claimed")
    run_pass()
    stale = Attempt.objects.get(job=stale_job)
    claimed = Attempt.objects.get(job=claimed_job)
    attempt_claim(claimed.pk, claimed.fencing_token, node)
    assert reconcile() == 0 and published == []
    old = timezone.now() - timedelta(minutes=5)
    Attempt.objects.filter(pk__in=[stale.pk, claimed.pk]).update(published_at=old)
    assert reconcile() == 1
    assert published == [[(f"node.{node.pk}", str(stale.pk), stale.fencing_token)]]
    assert Attempt.objects.get(pk=stale.pk).published_at > old
    assert reconcile() == 0  # just republished


def test_pass_with_dispatch_publishes_after_commit(alpha, submit, make_node, published,
                                                   django_capture_on_commit_callbacks):
    from strata.scheduling.services import schedule_pass

    user, team = alpha
    node = make_node("n1", gpus=1)
    job = submit(user, team)
    with django_capture_on_commit_callbacks(execute=True):
        result = schedule_pass()
    attempt = Attempt.objects.get(job=job)
    assert result.placed == 1
    assert published == [[(f"node.{node.pk}", str(attempt.pk), attempt.fencing_token)]]


def test_node_labels_select_nodes(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("plain", gpus=1)
    make_node("fast", gpus=1, labels={"gpu": "h100"})
    job = submit(user, team, node_labels={"gpu": "h100"})
    other = submit(user, team, node_labels={"gpu": "a100"})
    run_pass()
    assert allocations(job)[0].device.node.name == "fast"
    # no registered node carries gpu=a100: the job waits unadmitted (one may register later)
    assert state(other) == JobState.PENDING
    assert "no registered node has the labels" in Job.objects.get(pk=other.pk).reason
    make_node("new", gpus=1, labels={"gpu": "a100"})
    run_pass()
    assert state(other) == JobState.SCHEDULED


# --- a shared job's first attempt borrows what jobs of the same kind and spec measured ------------------------

SPEC = {"workload": "mlp-digits", "epochs": 1}  # the spec every job of the ``submit`` fixture has


@pytest.fixture
def finished(make_team, make_user, submit):
    """A finished quarter-GPU job of another team whose shared attempt measured ``persistent + ephemeral``
    bytes; ``ended=False`` leaves the attempt running (its node still reports it)."""
    beta = make_team("beta")
    bob = make_user("bob", beta)

    def make(persistent: int | None, ephemeral: int | None, *, spec=SPEC, kind: str = "train", ended: bool = True,
             state=JobState.SUCCEEDED, name: str = "done"):
        job = submit(bob, beta, gpus=0.25, name=name)
        Job.objects.filter(pk=job.pk).update(state=state, kind=kind, spec=spec)
        Attempt.objects.create(job=job, number=1, fencing_token="t", ended_at=timezone.now() if ended else None,
                               outcome="succeeded" if ended else "",
                               measured_memory=None if persistent is None and ephemeral is None
                               else (persistent or 0) + (ephemeral or 0))
        return job

    return make


def with_spec(job, spec, kind: str = "train"):
    Job.objects.filter(pk=job.pk).update(spec=spec, kind=kind)
    return job


def test_a_first_attempt_reserves_what_a_job_of_the_same_spec_measured(alpha, submit, make_node, run_pass,
                                                                      finished):
    from strata.jobs.models import JobEvent

    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    finished(GiB, GiB // 2)  # another team's job of the same spec measured 1.5 GiB
    job = submit(user, team, gpus=0.25, name="sweep-2")
    assert not Attempt.objects.filter(job=job).exists()
    run_pass()
    assert state(job) == JobState.SCHEDULED
    (allocation,) = allocations(job)
    assert allocation.memory == int(1.5 * GiB * 1.1)  # not 0.25 x 8 GiB = 2 GiB
    assert allocation.share == pytest.approx(0.25)
    event = JobEvent.objects.filter(job=job, kind="state", data__state=JobState.SCHEDULED).get()
    assert event.message.endswith("; 1.65 GiB reserved: 1.1 x what jobs with the same spec measured")


def test_borrowed_measurements_let_two_jobs_share_a_device_their_shares_would_not(alpha, submit, make_node,
                                                                                  run_pass, finished):
    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    holder = with_spec(submit(user, team, gpus=0.25, memory=5 * GiB, name="holder"), {"other": True})
    run_pass()
    assert state(holder) == JobState.SCHEDULED  # n1's device: 0.75 GPU and 3 GiB left
    finished(GiB, GiB // 4)  # 1.25 GiB measured: 1.375 GiB reserved each, 2.75 GiB for both
    jobs = [submit(user, team, gpus=0.25, name=f"sweep-{i}") for i in range(2)]
    assert run_pass().placed == 2, "two proportional slices (2 x 2 GiB) would not fit the 3 GiB left"
    assert [a.memory for job in jobs for a in allocations(job)] == [int(1.25 * GiB * 1.1)] * 2
    assert {a.device.node.name for job in jobs for a in allocations(job)} == {"n1"}


def test_a_borrowed_measurement_places_a_first_attempt_elsewhere(alpha, submit, make_node, run_pass, finished):
    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    holder = with_spec(submit(user, team, gpus=0.5, memory=6 * GiB, name="holder"), {"other": True})
    run_pass()
    assert state(holder) == JobState.SCHEDULED  # n1's device: 0.5 GPU and 2 GiB left
    finished(2 * GiB, GiB)  # 3 GiB measured: 3.3 GiB reserved, which n1 no longer has
    job = submit(user, team, gpus=0.25, name="sweep")
    run_pass()
    assert state(job) == JobState.QUEUED
    assert Job.objects.get(pk=job.pk).reason == (
        "waiting: no node has free devices that fit (3.30 GiB reserved: 1.1 x what jobs with the same spec measured)")
    make_node("n2", gpus=1, memory=8 * GiB)
    # A job of another spec reserves its proportional 2 GiB, which n1 still has (best fit puts it there).
    control = with_spec(submit(user, team, gpus=0.25, name="control"), {"workload": "mlp-digits", "epochs": 2})
    assert run_pass().placed == 2
    (allocation,) = allocations(job)
    assert allocation.device.node.name == "n2" and allocation.memory == int(3 * GiB * 1.1)
    (allocation,) = allocations(control)
    assert allocation.device.node.name == "n1" and allocation.memory == 2 * GiB


def test_only_the_same_kind_and_spec_lend_a_measurement(alpha, submit, make_node, run_pass, finished):
    user, team = alpha
    make_node("n1", gpus=4, memory=8 * GiB)
    finished(GiB, GiB // 2, spec={"epochs": 1, "workload": "mlp-digits"})  # SPEC, keys in another order
    finished(3 * GiB, 0, kind="tune", name="other-kind")
    same = submit(user, team, gpus=0.25, name="same")
    other_spec = with_spec(submit(user, team, gpus=0.25, name="other-spec"), {"workload": "mlp-digits", "epochs": 2})
    other_kind = with_spec(submit(user, team, gpus=0.25, name="other-kind"), SPEC, kind="tune2")
    explicit = submit(user, team, gpus=0.25, memory=GiB, name="explicit")  # an explicit request is kept
    whole = submit(user, team, gpus=1, name="whole")  # whole devices are not shared
    assert run_pass().placed == 5
    assert [a.memory for a in allocations(same)] == [int(1.5 * GiB * 1.1)]
    assert [a.memory for a in allocations(other_spec)] == [2 * GiB]
    assert [a.memory for a in allocations(other_kind)] == [2 * GiB]
    assert [a.memory for a in allocations(explicit)] == [GiB]
    assert [a.memory for a in allocations(whole)] == [8 * GiB]
    assert Job.objects.get(pk=other_spec.pk).reason == "placed; waiting for the node to start it"


def test_a_jobs_own_measurement_wins_over_a_borrowed_one(alpha, submit, make_node, run_pass, finished):
    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    finished(3 * GiB, GiB)  # 4 GiB measured by another job of the same spec
    job = submit(user, team, gpus=0.25, name="rerun")
    Attempt.objects.create(job=job, number=1, fencing_token="t", ended_at=timezone.now(), outcome="node_lost",
                           measured_memory=GiB)
    run_pass()
    (allocation,) = allocations(job)
    assert allocation.memory == int(GiB * 1.1)


def test_the_most_recent_measurements_are_read_first(alpha, submit, make_node, run_pass, finished, monkeypatch):
    from strata.scheduling import services

    user, team = alpha
    make_node("n1", gpus=4, memory=8 * GiB)
    old = finished(4 * GiB, 0, name="old")
    Attempt.objects.filter(job=old).update(ended_at=timezone.now() - timedelta(days=1))
    finished(GiB, 0, name="newer")
    finished(None, None, name="unreported")  # the service reported no sizes (yet): skipped
    Attempt.objects.filter(job__name="unreported").update(measured_memory=0)
    monkeypatch.setattr(services, "PROFILE_WINDOW", 3)
    first = submit(user, team, gpus=0.25, name="first")
    run_pass()
    assert [a.memory for a in allocations(first)] == [int(4 * GiB * 1.1)]  # the largest of the window
    monkeypatch.setattr(services, "PROFILE_WINDOW", 2)
    second = submit(user, team, gpus=0.25, name="second")
    run_pass()
    assert [a.memory for a in allocations(second)] == [int(GiB * 1.1)]  # the day-old attempt is out of it
    finished(2 * GiB, 0, ended=False, state=JobState.RUNNING, name="running")  # a running attempt is newest
    monkeypatch.setattr(services, "PROFILE_WINDOW", 1)
    third = submit(user, team, gpus=0.25, name="third")
    run_pass()
    assert [a.memory for a in allocations(third)] == [int(2 * GiB * 1.1)]


def test_headroom_never_makes_a_measurement_that_fits_unplaceable(alpha, submit, make_node, run_pass, finished):
    user, team = alpha
    make_node("n1", gpus=1, memory=8 * GiB)
    finished(7 * GiB, GiB // 2)  # 7.5 GiB measured: x 1.1 would be 8.25 GiB, more than any device
    job = submit(user, team, gpus=0.25, name="big")
    run_pass()
    (allocation,) = allocations(job)
    assert allocation.memory == 8 * GiB  # capped at the largest device, still at least what was measured
