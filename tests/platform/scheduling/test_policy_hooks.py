"""Scheduler seams: a plugin's queue-order hook reorders its own kind's queued jobs within a priority level,
through the registry, with no edit to the scheduler; everything else keeps the core's order."""

from __future__ import annotations

from typing import ClassVar

import pytest

from components.runtime.plugins import Plugin
from components.runtime.policies import QueuedJob, QueueOrder, reorder
from strata.jobs.models import Job, JobState


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
    from components.runtime import registry

    assert "is not a components.runtime.policies.Policy" in registry.problems()["not-a-policy"]
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
