"""Conformance suites for scheduler hooks (:mod:`components.runtime.contract.policies`), one per seam.

Subclass the one for your hook's seam and point it at the hook; give it inputs it has something to say about::

    class TestSmallestLimitFirst(QueueOrderConformance):
        hook_path = "strata_primes.hooks:SmallestLimitFirst"
        specs = ({"limit": 500}, {"limit": 20}, {"limit": 100})

    class TestMyEstimate(ResourceEstimateConformance):
        hook_path = "my_plugin.hooks:MyEstimate"

Every suite checks that the hook is a light, pure policy: the same input gives the same answer, the input is
not mutated, answers have the seam's type, and the module imports nothing heavy. :class:`QueueOrderConformance`
also checks that the result is a permutation that leaves other kinds' jobs and the priority levels where they
were; :class:`PlacementScoreConformance` checks ``wants`` (a stable bool, true for the suite's job) and ``score``
and ``scores`` (one finite number per candidate, also for no candidate, odd candidates and jobs it knows nothing
about).
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import Any, ClassVar

from components.runtime.contract.policies import (
    Candidate,
    Demand,
    Estimate,
    FailurePolicy,
    LostAttempt,
    NodeLoss,
    PlacementScore,
    Policy,
    PreemptionCost,
    QueuedJob,
    QueueOrder,
    ResourceEstimate,
    Victim,
    best,
    reorder,
)
from components.runtime.contract.registry import import_path
from components.runtime.testing.conformance.kinds import light_import_problem


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


GiB = 2**30


class _SeamConformance:
    """What every hook must be: an instance of its seam (a Policy), built with no arguments, light to import."""

    hook_path: ClassVar[str] = ""
    seam: ClassVar[type] = Policy

    def hook(self):
        value = import_path(self.hook_path)
        hook = value() if isinstance(value, type) else value
        assert isinstance(hook, self.seam) and isinstance(hook, Policy), \
            f"{self.hook_path} is no {self.seam.__name__}"
        return hook

    def kind(self) -> str:
        kinds = self.hook().kinds
        return kinds[0] if kinds else "any-kind"

    def test_the_hook_module_is_light(self):
        problem = light_import_problem(self.hook_path.partition(":")[0])
        assert problem is None, problem

    def test_kinds_is_none_or_a_tuple_of_names(self):
        kinds = self.hook().kinds
        assert kinds is None or (isinstance(kinds, tuple) and all(isinstance(k, str) and k for k in kinds))


class ResourceEstimateConformance(_SeamConformance):
    """Override :meth:`demands` with demands the hook changes; the default mixes shares, memory and measurements."""

    seam = ResourceEstimate

    def demands(self) -> list[Demand]:
        found = []
        for gpus in (0.25, 0.5, 1.0, 2.0):
            for memory in (None, 2 * GiB):
                for measured, profile in ((0, 0), (3 * GiB, 0), (0, 5 * GiB), (3 * GiB, 5 * GiB), (30 * GiB, 0)):
                    found.append(Demand(kind=self.kind(),
                                        resources={"gpus": gpus, "gpu_memory": memory, "workers": 1},
                                        measured_memory=measured, profile_memory=profile,
                                        largest_device_memory=16 * GiB))
        return found

    def test_answers_are_estimates_of_valid_resources_and_stable(self):
        hook = self.hook()
        for demand in self.demands():
            before = copy.deepcopy(demand.resources)
            answer = hook.estimate(demand)
            assert demand.resources == before, "the hook mutated the job's resources"
            assert answer is None or isinstance(answer, Estimate), f"{answer!r} is neither None nor an Estimate"
            assert answer == hook.estimate(demand), "the same demand gave another answer"
            if answer is not None:
                resources = answer.resources
                assert isinstance(resources, dict) and isinstance(answer.note, str)
                assert float(resources.get("gpus", 0)) >= 0 and int(resources.get("workers", 1)) >= 1
                memory = resources.get("gpu_memory")
                assert memory is None or (isinstance(memory, int) and memory > 0), f"gpu_memory {memory!r}"

    def test_other_kinds_are_left_alone_by_the_scheduler(self):
        hook = self.hook()
        if hook.kinds is not None:
            assert not hook.applies("zz-other-kind")


class PlacementScoreConformance(_SeamConformance):
    """Override :meth:`candidates` with places the hook has an opinion about."""

    seam = PlacementScore

    def job(self) -> QueuedJob:
        return QueuedJob(id="job", team_id=1, kind=self.kind(), priority=0, queued_at=1000.0,
                         resources={"gpus": 0.5, "gpu_memory": None, "workers": 1}, spec={})

    def candidates(self) -> list[Candidate]:
        return [Candidate(rank=0, node_id=f"node-{index}", node=f"n{index}", labels={"zone": str(index % 2)},
                          devices=(index % 4,), share=0.5, memory=4 * GiB, free_share=free, free_memory=8 * GiB,
                          memory_total=16 * GiB)
                for index, free in enumerate((1.0, 0.5, 0.75, 1.0))]

    def test_scores_are_finite_numbers_and_stable(self):
        hook, job = self.hook(), self.job()
        for candidate in self.candidates():
            before = copy.deepcopy(candidate)
            score = hook.score(job, candidate)
            assert isinstance(score, int | float) and math.isfinite(score), f"score {score!r}"
            assert candidate == before and hook.score(job, candidate) == score

    def test_scores_answer_one_finite_number_per_candidate_and_are_stable(self):
        hook, job = self.hook(), self.job()
        candidates = self.candidates()
        before = copy.deepcopy(candidates)
        scores = hook.scores(job, candidates)
        assert candidates == before, "the hook mutated the candidates"
        assert isinstance(scores, list) and len(scores) == len(candidates), f"scores {scores!r}"
        assert all(isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score)
                   for score in scores), f"scores {scores!r}"
        assert hook.scores(job, copy.deepcopy(before)) == scores, "the same candidates gave other scores"
        assert best(job, candidates, [hook]) in range(len(candidates))

    def test_reads_names_a_plugin_or_nothing(self):
        reads = self.hook().reads
        assert reads is None or (isinstance(reads, str) and reads), f"reads = {reads!r}"

    def test_wants_answers_a_bool_and_is_stable(self):
        hook, job = self.hook(), self.job()
        for case in (job, replace(job, id="zz-other-job", spec={"zz": [1, 2]}, resources={"workers": 8})):
            before = copy.deepcopy(case)
            answer = hook.wants(case)
            assert isinstance(answer, bool), f"wants answered {answer!r}"
            assert case == before and hook.wants(case) == answer
        assert hook.wants(job), "the suite's own job (self.job()) should be one the hook has an opinion about"

    def test_scores_take_odd_input_without_raising(self):
        hook, job = self.hook(), self.job()
        assert hook.scores(job, []) == []
        candidates = self.candidates()
        odd = [replace(candidates[0], reports={"zz-unknown": {"x": 1}}),
               replace(candidates[-1], node_id="zz-unseen", node="zz-unseen", reports={}),
               replace(candidates[0], rank=3, labels={}, devices=())]
        for case in ([candidates[0]], odd, candidates[::-1], candidates + candidates):
            scores = hook.scores(job, case)
            assert len(scores) == len(case) and all(math.isfinite(float(score)) for score in scores), scores
        other = replace(job, id="zz-other-job", spec={"zz": [1, 2]}, resources={"workers": 8})
        assert len(hook.scores(other, candidates)) == len(candidates)


class PreemptionCostConformance(_SeamConformance):
    """Override :meth:`victims` with running attempts the hook has an opinion about."""

    seam = PreemptionCost

    def victims(self) -> list[Victim]:
        return [Victim(job_id=f"job-{index}", attempt_id=f"attempt-{index}", team_id=1, kind=self.kind(),
                       priority=priority, started_at=started, share=share)
                for index, (priority, started, share) in enumerate(((0, 0.0, 1.0), (5, 1000.0, 0.5),
                                                                    (-3, 2000.0, 0.25)))]

    def test_costs_are_none_or_non_negative_and_stable(self):
        hook = self.hook()
        for victim in self.victims():
            cost = hook.cost(victim)
            assert cost is None or (isinstance(cost, int | float) and math.isfinite(cost) and cost >= 0), cost
            assert hook.cost(victim) == cost


class FailurePolicyConformance(_SeamConformance):
    """Override :meth:`losses` with lost attempts the hook has an opinion about."""

    seam = FailurePolicy

    def losses(self) -> list[LostAttempt]:
        return [LostAttempt(job_id="job", attempt_id="attempt", team_id=1, kind=self.kind(), number=number,
                            node="n1", primary=primary, nodes_left=left)
                for number, primary, left in ((1, True, 0), (2, False, 1), (3, False, 0), (1, True, 3))]

    def test_every_answer_is_a_node_loss_and_stable(self):
        hook = self.hook()
        for lost in self.losses():
            answer = hook.on_node_loss(lost)
            assert isinstance(answer, NodeLoss) or answer in {loss.value for loss in NodeLoss}, answer
            assert hook.on_node_loss(lost) == answer
