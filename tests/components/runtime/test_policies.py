"""The placement seam as plain data: ``best`` asks each hook for all the candidates at once (``scores``), whose
default maps ``score``; a hook that raises or answers the wrong number of scores costs only its own opinion."""

from __future__ import annotations

import logging
from typing import ClassVar

from components.runtime.contract.policies import Candidate, PlacementScore, QueuedJob, best
from components.runtime.testing.conformance.policies import PlacementScoreConformance

JOB = QueuedJob(id="j", team_id=1, kind="k", priority=0, queued_at=1.0, resources={"workers": 2})


def candidates(count: int = 4) -> list[Candidate]:
    return [Candidate(rank=0, node_id=f"id-{n}", node=f"n{n}", labels={"zone": str(n % 2)}, devices=(0,),
                      share=1.0, memory=1, free_share=1.0, free_memory=1, memory_total=1) for n in range(count)]


class PreferZoneOne(PlacementScore):
    """Scores one place at a time: the default ``scores`` maps it."""

    def score(self, job, candidate):
        return -1.0 if candidate.labels.get("zone") == "1" else 0.0


class LastOfAll(PlacementScore):
    """Needs every candidate at once: the last one wins."""

    calls: ClassVar[list[int]] = []

    def scores(self, job, candidates):
        LastOfAll.calls.append(len(candidates))
        return [float(len(candidates) - index) for index in range(len(candidates))]


class Raises(PlacementScore):
    def scores(self, job, candidates):
        raise RuntimeError("boom")


class TooFew(PlacementScore):
    def scores(self, job, candidates):
        return [-100.0]


class NotNumbers(PlacementScore):
    def scores(self, job, candidates):
        return ["low"] * len(candidates)


class NaNs(PlacementScore):
    def scores(self, job, candidates):
        return [float("nan")] * len(candidates)


class OtherKind(PlacementScore):
    kinds = ("zz-other",)

    def scores(self, job, candidates):
        raise AssertionError("asked about a kind it does not apply to")


def test_the_default_scores_maps_score():
    assert PreferZoneOne().scores(JOB, candidates()) == [0.0, -1.0, 0.0, -1.0]
    assert PlacementScore().scores(JOB, candidates(3)) == [0.0, 0.0, 0.0]
    assert PlacementScore().scores(JOB, []) == []
    assert best(JOB, candidates(), [PreferZoneOne()]) == 1  # the earliest among equals


def test_a_hook_sees_every_candidate_at_once_and_scores_add_up():
    LastOfAll.calls.clear()
    assert best(JOB, candidates(), [LastOfAll()]) == 3
    assert LastOfAll.calls == [4]  # one call for all the candidates, not one per candidate
    # 4,3,2,1 plus 0,-1,0,-1 (zone one): 4, 2, 2, 0 -> the last wins
    assert best(JOB, candidates(), [LastOfAll(), PreferZoneOne()]) == 3
    # 3,2,1 plus 0,-1,0: 3, 1, 1 -> a tie, and the earliest of equals wins
    assert best(JOB, candidates(3), [LastOfAll(), PreferZoneOne()]) == 1


def test_without_candidates_or_hooks_the_core_choice_stands():
    assert best(JOB, [], [LastOfAll()]) is None
    assert best(JOB, candidates(), []) == 0
    assert best(JOB, candidates(), [OtherKind()]) == 0


def test_a_raising_or_malformed_hook_costs_only_its_own_opinion(caplog):
    with caplog.at_level(logging.WARNING):
        for broken in (Raises(), TooFew(), NotNumbers(), NaNs()):
            assert best(JOB, candidates(), [broken]) == 0, type(broken).__name__
            assert best(JOB, candidates(), [broken, PreferZoneOne()]) == 1, type(broken).__name__
    assert "Raises" in caplog.text and "TooFew" in caplog.text


def test_the_candidates_list_given_to_a_hook_is_a_copy():
    class Mutates(PlacementScore):
        def scores(self, job, candidates):
            candidates.clear()
            return []

    listed = candidates()
    assert best(JOB, listed, [Mutates(), PreferZoneOne()]) == 1
    assert len(listed) == 4


class TestPreferZoneOneConforms(PlacementScoreConformance):
    hook_path = f"{__name__}:PreferZoneOne"


class TestLastOfAllConforms(PlacementScoreConformance):
    hook_path = f"{__name__}:LastOfAll"
