"""Conformance suite for scheduler hooks (:mod:`components.runtime.policies`).

Subclass :class:`QueueOrderConformance` and point it at a hook; give :meth:`jobs` a queue it has something to
say about (the default builds one from :attr:`specs`)::

    class TestSmallestLimitFirst(QueueOrderConformance):
        hook_path = "strata_primes.hooks:SmallestLimitFirst"
        specs = ({"limit": 500}, {"limit": 20}, {"limit": 100})

It checks that the hook is a light, pure policy: the same queue gives the same order, the input is not
mutated, an empty queue and a queue of other kinds are fine, the result is a permutation that leaves other
kinds' jobs and the priority levels where they were, and the module imports nothing heavy.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from components.runtime.conformance.kinds import light_import_problem
from components.runtime.policies import Policy, QueuedJob, QueueOrder, reorder
from components.runtime.registry import import_path


class QueueOrderConformance:
    hook_path: ClassVar[str] = ""
    specs: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def hook(self) -> QueueOrder:
        value = import_path(self.hook_path)
        hook = value() if isinstance(value, type) else value
        assert isinstance(hook, QueueOrder) and isinstance(hook, Policy), f"{self.hook_path} is no QueueOrder"
        return hook

    def kind(self) -> str:
        kinds = self.hook().kinds
        return kinds[0] if kinds else "any-kind"

    def jobs(self) -> list[QueuedJob]:
        """A queue mixing the hook's kind with another kind, over two priority levels."""
        jobs = []
        for index, spec in enumerate(self.specs * 2):
            jobs.append(QueuedJob(id=f"own-{index}", team_id=1, kind=self.kind(), priority=1 if index < len(self.specs) else 0,
                                  queued_at=1000.0 + index, resources={"gpus": 0.5}, spec=dict(spec)))
            jobs.append(QueuedJob(id=f"other-{index}", team_id=1, kind="zz-other-kind", priority=jobs[-1].priority,
                                  queued_at=1000.5 + index, resources={"gpus": 1.0}, spec={}))
        return jobs

    def test_the_same_queue_gives_the_same_order_and_is_not_mutated(self):
        jobs = self.jobs()
        before = copy.deepcopy(jobs)
        first = [job.id for job in reorder(jobs, [self.hook()])]
        assert jobs == before, "the hook mutated its input"
        assert first == [job.id for job in reorder(self.jobs(), [self.hook()])]

    def test_keys_are_comparable(self):
        keys = [self.hook().key(job) for job in self.jobs() if self.hook().applies(job.kind)]
        sorted(keys)  # raises TypeError when keys of one kind cannot be compared

    def test_it_only_permutes_its_own_kinds_within_a_priority_level(self):
        hook = self.hook()
        jobs = self.jobs()
        result = reorder(jobs, [hook])
        assert sorted(job.id for job in result) == sorted(job.id for job in jobs)
        assert [job.priority for job in result] == [job.priority for job in jobs]
        for before, after in zip(jobs, result, strict=True):
            if not hook.applies(before.kind):
                assert after is before or after == before, "a job of another kind moved"

    def test_empty_and_foreign_queues(self):
        assert reorder([], [self.hook()]) == []
        others = [job for job in self.jobs() if not self.hook().applies(job.kind)]
        assert reorder(others, [self.hook()]) == others

    def test_the_hook_module_is_light(self):
        problem = light_import_problem(self.hook_path.partition(":")[0])
        assert problem is None, problem
