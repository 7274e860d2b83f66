"""Scheduler seams, through the registry with no edit to the scheduler: a plugin's queue-order hook reorders its
own kind's queued jobs within a priority level; resource estimates change what a job reserves; placement scores
choose among the places that fit; preemption costs spare or prefer victims; failure policies decide what a lost
node means. A hook that raises costs only its own opinion. Without hooks the core's behaviour stands."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import pytest
from django.utils import timezone

from components.runtime.contract.plugins import Plugin
from components.runtime.contract.policies import (
    Candidate,
    Demand,
    Estimate,
    FailurePolicy,
    LostAttempt,
    NodeLoss,
    PlacementScore,
    PreemptionCost,
    QueuedJob,
    QueueOrder,
    ResourceEstimate,
    Victim,
    reorder,
)
from strata.cluster.models import Node
from strata.jobs.models import Allocation, Attempt, Job, JobState
from strata.jobs.services import attempt_claim
from strata.scheduling.services import reap


class MostEpochsFirst(QueueOrder):
    kinds: ClassVar[tuple[str, ...]] = ("train",)

    def key(self, job: QueuedJob):
        return -int(job.spec.get("epochs") or 0), job.queued_at


HOOKED = Plugin(name="most-epochs-first", hooks=(f"{__name__}:MostEpochsFirst",))
NOT_A_POLICY = Plugin(name="not-a-policy", hooks=(f"{__name__}:QueuedJob",))


def test_reorder_permutes_only_the_hooks_kinds_within_a_priority_level():
    def job(name, kind, priority, when, epochs=0):
        return QueuedJob(id=name, team_id=1, kind=kind, priority=priority, queued_at=when, spec={"epochs": epochs})

    jobs = [job("a", "train", 5, 1, epochs=1), job("x", "other", 5, 2), job("b", "train", 5, 3, epochs=9),
            job("c", "train", 0, 4, epochs=50), job("d", "train", 0, 5, epochs=70)]
    assert [j.id for j in reorder(jobs, [MostEpochsFirst()])] == ["b", "x", "a", "d", "c"]
    assert [j.id for j in jobs] == ["a", "x", "b", "c", "d"]  # the input is untouched
    assert reorder(jobs, []) == jobs


def test_a_plugins_queue_order_hook_decides_which_job_is_placed(install_plugins, make_team, make_user, make_node,
                                                                  run_pass):
    from strata.jobs.services import job_submit

    install_plugins(f"{__name__}:HOOKED", f"{__name__}:NOT_A_POLICY")
    from components.runtime.contract import registry

    assert "is not a Policy subclass" in registry.problems()["not-a-policy"]
    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("n1", gpus=1)
    jobs = {}
    for epochs in (1, 7, 3):
        data = {"kind": "train", "name": f"e{epochs}", "spec": {"workload": "mlp-digits", "epochs": epochs},
                "resources": {"gpus": 1.0, "gpu_memory": None, "workers": 1}, "priority": 0, "max_attempts": 1,
                "time_limit": 3600}
        jobs[epochs], _ = job_submit(user=user, team=team, data=data)
    run_pass()
    states = {epochs: Job.objects.get(pk=job.pk).state for epochs, job in jobs.items()}
    assert states == {7: JobState.SCHEDULED, 1: JobState.QUEUED, 3: JobState.QUEUED}  # not FIFO: the hook's pick


@pytest.mark.django_db
def test_without_hooks_the_queue_stays_fifo(make_team, make_user, make_node, submit, run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("n1", gpus=1)
    first, second = submit(user, team, name="first"), submit(user, team, name="second")
    run_pass()
    assert Job.objects.get(pk=first.pk).state == JobState.SCHEDULED
    assert Job.objects.get(pk=second.pk).state == JobState.QUEUED

# -- the other seams: resource estimates, placement scores, preemption costs, failure policies ---------------
GiB = 2**30


class PreferLabelledNodes(PlacementScore):
    """Places train jobs on nodes labelled fast=yes first, whatever best fit says."""

    kinds: ClassVar[tuple[str, ...]] = ("train",)

    def score(self, job: QueuedJob, candidate: Candidate) -> float:
        return 0.0 if candidate.labels.get("fast") == "yes" else 1.0


class SpareTheNamed(PreemptionCost):
    """Never preempts a job named 'precious'; a job named 'cheap' costs little."""

    def cost(self, victim: Victim) -> float | None:
        name = VICTIM_NAMES.get(victim.job_id, "")  # a hook reads no database: it is given its data
        return None if name == "precious" else (0.1 if name == "cheap" else 1.0)


VICTIM_NAMES: dict[str, str] = {}


class DoubleMemory(ResourceEstimate):
    kinds: ClassVar[tuple[str, ...]] = ("train",)

    def estimate(self, demand: Demand) -> Estimate | None:
        memory = demand.resources.get("gpu_memory")
        return Estimate({**demand.resources, "gpu_memory": memory * 2}, "doubled") if memory else None


class Raises(PlacementScore, ResourceEstimate, PreemptionCost, FailurePolicy, QueueOrder):
    def score(self, job, candidate):
        raise RuntimeError("placement bug")

    def estimate(self, demand):
        raise RuntimeError("estimate bug")

    def cost(self, victim):
        raise RuntimeError("cost bug")

    def on_node_loss(self, lost):
        raise RuntimeError("failure bug")

    def key(self, job):
        raise RuntimeError("order bug")


LOSS: dict[str, NodeLoss] = {}
SEEN: list[LostAttempt] = []


class TableFailurePolicy(FailurePolicy):
    kinds: ClassVar[tuple[str, ...]] = ("train",)

    def on_node_loss(self, lost: LostAttempt) -> NodeLoss:
        SEEN.append(lost)
        return LOSS["answer"]


PLACING = Plugin(name="placing", hooks=(f"{__name__}:PreferLabelledNodes",))
SPARING = Plugin(name="sparing", hooks=(f"{__name__}:SpareTheNamed",))
DOUBLING = Plugin(name="doubling", hooks=(f"{__name__}:DoubleMemory",))
RAISING = Plugin(name="raising", hooks=(f"{__name__}:Raises",))
FAILING = Plugin(name="failing", hooks=(f"{__name__}:TableFailurePolicy",))


def _devices(job):
    return list(Allocation.objects.filter(attempt__job=job, active=True).select_related("device__node"))


def test_a_placement_hook_picks_among_the_places_that_fit(install_plugins, alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("slow", gpus=1)
    make_node("fast", gpus=2, labels={"fast": "yes"})
    # Best fit would take the slow node's single device for a whole-GPU job; the hook sends it to the fast one.
    install_plugins(f"{__name__}:PLACING")
    first = submit(user, team, name="first")
    run_pass()
    assert {a.device.node.name for a in _devices(first)} == {"fast"}
    # It only chooses among places that fit: with the fast node full, the job goes to the slow one.
    second = submit(user, team, name="second")
    third = submit(user, team, name="third")
    run_pass()
    assert sorted(a.device.node.name for job in (second, third) for a in _devices(job)) == ["fast", "slow"]


def test_without_a_placement_hook_best_fit_stands(alpha, submit, make_node, run_pass):
    user, team = alpha
    make_node("slow", gpus=1)
    make_node("fast", gpus=2, labels={"fast": "yes"})
    job = submit(user, team, name="first")
    run_pass()
    assert {a.device.node.name for a in _devices(job)} == {"slow"}  # the node with fewest whole devices free


def test_a_preemption_hook_spares_a_job_and_prefers_cheap_victims(install_plugins, alpha, submit, make_node,
                                                                   run_pass):
    user, team = alpha
    install_plugins(f"{__name__}:SPARING")
    make_node("n1", gpus=1)
    make_node("n2", gpus=1)
    precious = submit(user, team, priority=0, name="precious")
    run_pass()
    other = submit(user, team, priority=0, name="other")
    run_pass()
    VICTIM_NAMES.clear()
    VICTIM_NAMES.update({str(precious.pk): "precious", str(other.pk): "other"})
    high = submit(user, team, priority=10, name="high")
    assert run_pass().preempted == 1
    assert Job.objects.get(pk=precious.pk).state == JobState.SCHEDULED  # spared
    assert Job.objects.get(pk=other.pk).state == JobState.PREEMPTED
    assert Job.objects.get(pk=high.pk).state == JobState.QUEUED


def test_a_refused_victim_leaves_the_job_waiting(install_plugins, alpha, submit, make_node, run_pass):
    user, team = alpha
    install_plugins(f"{__name__}:SPARING")
    make_node("n1", gpus=1)
    precious = submit(user, team, priority=0, name="precious")
    run_pass()
    VICTIM_NAMES.clear()
    VICTIM_NAMES[str(precious.pk)] = "precious"
    high = submit(user, team, priority=10, name="high")
    assert run_pass().preempted == 0
    assert Job.objects.get(pk=precious.pk).state == JobState.SCHEDULED
    assert "no node has free devices" in Job.objects.get(pk=high.pk).reason


def test_a_resource_estimate_changes_what_a_job_reserves_and_says_why(install_plugins, alpha, submit, make_node,
                                                                       run_pass):
    user, team = alpha
    install_plugins(f"{__name__}:DOUBLING")
    make_node("n1", gpus=1, memory=8 * GiB)
    job = submit(user, team, gpus=0, memory=3 * GiB, name="doubled")
    waiting = submit(user, team, gpus=0, memory=3 * GiB, name="waits")
    run_pass()
    assert [a.memory for a in _devices(job)] == [6 * GiB]
    assert Job.objects.get(pk=waiting.pk).state == JobState.QUEUED  # 6 + 6 GiB do not fit in 8
    assert "(doubled)" in Job.objects.get(pk=waiting.pk).reason
    assert Job.objects.get(pk=job.pk).resources["gpu_memory"] == 3 * GiB  # the request itself is unchanged


def test_a_raising_hook_costs_only_its_own_opinion(install_plugins, alpha, submit, make_node, run_pass, caplog):
    user, team = alpha
    install_plugins(f"{__name__}:RAISING")
    node = make_node("n1", gpus=1)
    low = submit(user, team, priority=0, name="low")
    also = submit(user, team, priority=0, name="also")
    assert run_pass().placed == 1
    assert Job.objects.get(pk=low.pk).state == JobState.SCHEDULED  # FIFO kept when the order hook raises
    high = submit(user, team, priority=10, name="high")
    assert run_pass().preempted == 1  # a raising cost counts as the default
    attempt = Attempt.objects.get(job=low)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    reap()
    assert Job.objects.get(pk=low.pk).state == JobState.QUEUED  # a raising failure policy: requeue
    assert {Job.objects.get(pk=j.pk).state for j in (also, high)} == {JobState.QUEUED}
    assert "raised" in caplog.text


def _lose(node):
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return reap()


def test_a_failure_policy_can_fail_the_job_on_node_loss(install_plugins, alpha, submit, make_node, run_pass):
    user, team = alpha
    install_plugins(f"{__name__}:FAILING")
    LOSS["answer"], SEEN[:] = NodeLoss.FAIL, []
    node = make_node("n1", gpus=1)
    job = submit(user, team, max_attempts=5)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    _lose(node)
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.state == JobState.FAILED and attempt.outcome == "node_lost"
    assert "failure policy fails the job" in attempt.exit_reason
    assert SEEN == [LostAttempt(job_id=str(job.pk), attempt_id=str(attempt.pk), team_id=team.pk, kind="train",
                                number=1, node="n1", primary=True, nodes_left=0)]
    assert run_pass().placed == 0


def test_carry_on_drops_the_lost_node_and_keeps_the_attempt(install_plugins, alpha, submit, make_node, run_pass):
    user, team = alpha
    install_plugins(f"{__name__}:FAILING")
    LOSS["answer"], SEEN[:] = NodeLoss.CARRY_ON, []
    make_node("n1", gpus=1)
    make_node("n2", gpus=1)
    job = submit(user, team, workers=2)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    primary = attempt.node
    secondary = Node.objects.exclude(pk=primary.pk).get()
    attempt_claim(attempt.pk, attempt.fencing_token, primary)
    _lose(secondary)
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.state == JobState.RUNNING and attempt.ended_at is None
    assert [a.device.node.name for a in _devices(job)] == [primary.name]
    assert SEEN[-1].primary is False and SEEN[-1].nodes_left == 1
    assert job.events.filter(message__contains=f"carries on without node {secondary.name}").exists()
    # Losing the node that runs it leaves nothing to carry on with: the job ends, not requeued.
    _lose(primary)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "nothing left to carry on with" in job.reason


def test_requeue_is_the_default_failure_policy(install_plugins, alpha, submit, make_node, run_pass):
    user, team = alpha
    install_plugins(f"{__name__}:FAILING")
    LOSS["answer"] = NodeLoss.REQUEUE
    node = make_node("n1", gpus=1)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    assert _lose(node)["requeued"] == 1
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.failures == 0
