"""SAS in the scheduler: the placement hook, through the core's ``policies.best`` as the scheduler calls it."""

from __future__ import annotations

import math

from components.runtime.contract.policies import Candidate, PlacementScore, QueuedJob, best
from components.runtime.testing.conformance.policies import PlacementScoreConformance
from components.straggler.hooks import AvailabilityAwarePlacement

STEADY = {"predicted": {"cpu": 0.85, "memory": 0.8, "gpu": 0.9, "network": 0.95},
          "std": {"cpu": 0.02, "memory": 0.01, "gpu": 0.03, "network": 0.02}}
BURSTY = {"predicted": {"cpu": 0.9, "memory": 0.8, "gpu": 0.92, "network": 0.95},
          "std": {"cpu": 0.35, "memory": 0.01, "gpu": 0.4, "network": 0.3}}


def job(workers: int = 3, job_id: str = "job-1", **spec) -> QueuedJob:
    return QueuedJob(id=job_id, team_id=1, kind="train", priority=0, queued_at=1.0,
                     resources={"gpus": 1, "workers": workers}, spec=spec)


def candidate(node: int, report: dict | None, rank: int = 0) -> Candidate:
    return Candidate(rank=rank, node_id=f"node-{node}", node=f"n{node}", labels={}, devices=(0,), share=1.0,
                     memory=1, free_share=1.0, free_memory=1, memory_total=1,
                     reports={"straggler": report} if report is not None else {})


def cluster() -> list[Candidate]:
    """Best-fit order puts the bursty nodes first: the core alone would take them."""
    return [candidate(n, BURSTY) for n in range(3)] + [candidate(n, STEADY) for n in range(3, 6)]


def test_best_places_the_gang_on_the_steady_group():
    hook = AvailabilityAwarePlacement()
    candidates = cluster()
    scores = hook.scores(job(), candidates)
    assert max(scores[3:]) < 0 < min(scores[:3])
    assert best(job(), candidates, [hook]) in (3, 4, 5)
    assert best(job(), candidates, []) == 0  # without the hook, best fit takes a bursty node


def test_every_worker_of_a_gang_agrees():
    hook = AvailabilityAwarePlacement()
    candidates = cluster()
    chosen = []
    for rank in range(3):  # each worker sees the places still free: the chosen ones are taken
        left = [replace_rank(c, rank) for c in candidates if c.node_id not in chosen]
        chosen.append(left[best(job(), left, [hook])].node_id)
    assert sorted(chosen) == ["node-3", "node-4", "node-5"]
    assert len(hook._decisions) == 1  # one decision for the whole gang


def replace_rank(item: Candidate, rank: int) -> Candidate:
    from dataclasses import replace

    return replace(item, rank=rank)


def test_nodes_without_a_report_are_neutral():
    hook = AvailabilityAwarePlacement()
    candidates = [candidate(0, None), candidate(1, STEADY), candidate(2, {"predicted": "x"}),
                  candidate(3, {"predicted": {"cpu": math.nan}, "std": {}})]
    scores = hook.scores(job(workers=1), candidates)
    assert scores[0] == scores[2] == scores[3] == 0.0 and scores[1] < 0
    assert hook.scores(job(), [candidate(0, None), candidate(1, None)]) == [0.0, 0.0]
    assert hook.scores(job(), []) == []


def test_within_the_group_more_available_nodes_score_lower():
    better = {"predicted": {k: min(1.0, v + 0.05) for k, v in STEADY["predicted"].items()}, "std": STEADY["std"]}
    scores = AvailabilityAwarePlacement().scores(job(workers=1), [candidate(0, STEADY), candidate(1, better)])
    assert scores[1] < scores[0] < 0


def test_a_job_may_say_what_its_workers_need():
    from components.straggler.hooks import DEFAULT_DEMAND, _demand, _theta

    needy = job(workers=2, job_id="needy", straggler={"demand": {"gpu": 0.95, "cpu": "x", "disk": 1}, "theta": 0.5})
    assert _demand(needy) == {**DEFAULT_DEMAND, "gpu": 0.95} and _theta(needy) == 0.5
    assert _demand(job()) == DEFAULT_DEMAND and _theta(job(straggler={"theta": 7})) == 0.8
    # nobody keeps 0.95 of a GPU reliably: the hook still answers a finite score per place
    scores = AvailabilityAwarePlacement().scores(needy, cluster())
    assert len(scores) == 6 and all(math.isfinite(score) for score in scores)


def test_the_grouping_is_shared_by_many_jobs_and_new_reports_decide_again():
    hook = AvailabilityAwarePlacement()
    for index in range(50):
        hook.scores(job(job_id=f"j{index}"), cluster())
    assert len(hook._groupings) == 1 and len(hook._decisions) == 50
    changed = cluster()
    changed[4] = candidate(4, BURSTY)
    again = hook.scores(job(workers=2, job_id="j0"), changed)
    assert len(hook._groupings) == 2
    assert again[4] > 0 > max(again[3], again[5])  # node 4 turned bursty: the job's decision was made again
    # a gang of 3 no longer fits the two steady nodes: it goes to the (larger) bursty group rather than wait
    assert hook.scores(job(workers=3, job_id="j-new"), changed)[4] < 0


class Raises(PlacementScore):
    def scores(self, job, candidates):
        raise RuntimeError("boom")


def test_a_failing_hook_beside_it_costs_only_its_own_opinion():
    assert best(job(), cluster(), [Raises(), AvailabilityAwarePlacement()]) in (3, 4, 5)
    assert best(job(), cluster(), [AvailabilityAwarePlacement(), Raises()]) in (3, 4, 5)


def test_other_kinds_are_left_alone():
    other = QueuedJob(id="s", team_id=1, kind="serve", priority=0, queued_at=1.0, resources={"workers": 3})
    assert best(other, cluster(), [AvailabilityAwarePlacement()]) == 0


class TestAvailabilityAwarePlacement(PlacementScoreConformance):
    hook_path = "components.straggler.hooks:AvailabilityAwarePlacement"

    def job(self) -> QueuedJob:
        return job()

    def candidates(self) -> list[Candidate]:
        return cluster() + [candidate(9, None)]
