"""Fluid's allocation rule (components/tuning/waterfill.py): the properties the docs promise, checked with
hypothesis over random groups, budgets and bounds, and a few hand-worked cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.tuning.waterfill import Bounds, admitted, allocate, quantize, waterfill

TOL = 1e-6

works = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3),
                        st.one_of(st.none(), st.floats(min_value=0.01, max_value=1e4)), min_size=1, max_size=24)
budgets = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0])
bounds = st.builds(Bounds, low=st.sampled_from([0.125, 0.25, 0.5, 1.0]), high=st.sampled_from([1.0, 2.0, 4.0]))


def _known(work):
    known = [v for v in work.values() if v is not None]
    mean = sum(known) / len(known) if known else 1.0
    return {k: (v if v is not None else mean) for k, v in work.items()}


@settings(max_examples=300, deadline=None)
@given(works, budgets, bounds)
def test_shares_sum_to_the_budget_and_stay_within_bounds(work, budget, limits):
    shares = waterfill(work, budget, limits)
    running = admitted(work, budget, limits)
    high = min(limits.high, budget)
    assert set(shares) == set(work)
    assert all(shares[trial] == 0 for trial in work if trial not in running)
    for trial in running:
        assert limits.low - TOL <= shares[trial] <= high + TOL, (trial, shares[trial])
    expected = min(budget, len(running) * high)
    assert sum(shares.values()) == pytest.approx(expected, abs=1e-6)
    assert len(running) == min(len(work), int(budget / limits.low + 1e-9))


@settings(max_examples=300, deadline=None)
@given(works, budgets, bounds)
def test_a_slower_trial_never_gets_less_than_a_faster_one(work, budget, limits):
    known = _known(work)
    for shares in (waterfill(work, budget, limits), allocate(work, budget, limits)):
        running = [trial for trial in work if shares[trial] > 0]
        for a in running:
            for b in running:
                if known[a] > known[b]:
                    assert shares[a] >= shares[b] - TOL, (a, b, known[a], known[b], shares)
        # Waiting trials are those with the least work.
        waiting = [trial for trial in work if shares[trial] == 0]
        if waiting and running:
            assert max(known[t] for t in waiting) <= min(known[t] for t in running) + TOL


@settings(max_examples=300, deadline=None)
@given(works, budgets, bounds)
def test_quantized_shares_are_placeable_within_bounds_and_budget(work, budget, limits):
    shares = allocate(work, budget, limits)
    high = min(limits.high, budget)
    assert sum(shares.values()) <= budget + TOL
    for share in shares.values():
        if share == 0:
            continue
        assert limits.low - TOL <= share <= high + TOL
        if share < 1:
            assert abs(share / limits.low - round(share / limits.low)) < 1e-6, share
        else:
            assert share == int(share)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=16), st.floats(min_value=0.1, max_value=100), budgets, bounds)
def test_equal_work_gets_equal_continuous_shares(n, height, budget, limits):
    shares = waterfill({f"t{i}": height for i in range(n)}, budget, limits)
    running = [share for share in shares.values() if share > 0]
    assert len(running) == min(n, int(budget / limits.low + 1e-9))
    if running:
        assert max(running) == pytest.approx(min(running))


def test_shares_follow_work_between_the_bounds():
    # Work 1:2:3 on 3 GPUs with room: shares 0.5, 1, 1.5.
    shares = waterfill({"a": 10, "b": 20, "c": 30}, 3.0, Bounds(low=0.25, high=4))
    assert shares == pytest.approx({"a": 0.5, "b": 1.0, "c": 1.5})
    # Quantized: 1.5 is not placeable and becomes 1; the freed half cannot make c a second whole GPU, so it goes
    # back a slot at a time to a (the most work per GPU held among those that can grow): 1, 1, 1.
    assert allocate({"a": 10, "b": 20, "c": 30}, 3.0, Bounds(low=0.25, high=4)) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert allocate({"a": 10, "b": 20, "c": 30, "d": 5}, 2.0) == {"a": 0.5, "b": 0.5, "c": 0.75, "d": 0.25}


def test_clamped_trials_leave_the_rest_to_the_others():
    # One huge trial is capped at high = 2; the other two share what is left in proportion to their work.
    shares = waterfill({"big": 1000, "x": 1, "y": 3}, 4.0, Bounds(low=0.25, high=2))
    assert shares["big"] == pytest.approx(2.0)
    assert shares["x"] == pytest.approx(0.5) and shares["y"] == pytest.approx(1.5)


def test_more_trials_than_slots_run_the_longest_first():
    work = {f"t{i}": float(i) for i in range(10)}
    shares = waterfill(work, 1.0, Bounds(low=0.25, high=1))
    assert sorted(trial for trial, share in shares.items() if share > 0) == ["t6", "t7", "t8", "t9"]
    assert sum(shares.values()) == pytest.approx(1.0)


def test_unmeasured_trials_get_the_mean():
    shares = waterfill({"a": 1.0, "b": 3.0, "new": None}, 3.0, Bounds(low=0.25, high=4))
    assert shares["new"] == pytest.approx(1.0) and shares["a"] == pytest.approx(0.5)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="low"):
        Bounds(low=0)
    with pytest.raises(ValueError, match="high"):
        Bounds(low=0.5, high=0.25)
    with pytest.raises(ValueError, match="budget"):
        waterfill({"a": 1}, float("nan"))
    assert waterfill({"a": 1}, 0.1, Bounds(low=0.25)) == {"a": 0.0}
    assert quantize({}, {}, 1.0) == {}


@settings(max_examples=200, deadline=None)
@given(works, budgets, bounds, st.randoms(use_true_random=False))
def test_grow_never_shrinks_and_never_overspends(work, budget, limits, rnd):
    from components.tuning.waterfill import grow

    running = admitted(work, budget, limits)
    target = allocate(work, budget, limits)
    # Some current placeable shares within the budget (a sweep in progress).
    current, left = {}, budget
    for trial in running:
        share = min(target[trial], rnd.choice([limits.low, 0.5, 1.0]), left)
        if share >= limits.low:
            current[trial], left = share, left - share
    grown = grow(current, {t: work[t] for t in current}, budget, limits)
    after = {**current, **grown}
    assert all(after[t] >= current[t] for t in current)  # nobody shrinks
    assert sum(after.values()) <= budget + TOL
    expected = allocate({t: work[t] for t in current}, budget, limits)
    assert all(after[t] == current[t] or after[t] == expected[t] for t in current)


def test_start_share_splits_free_gpus_into_placeable_shares():
    from components.tuning.waterfill import start_share

    assert start_share(1.0, 4) == 0.25 and start_share(1.0, 3) == 0.25 and start_share(2.0, 2) == 1.0
    assert start_share(0.1, 2) == 0.25  # at least one slot: it waits in the queue until there is room
    assert start_share(8.0, 2, Bounds(low=0.25, high=4)) == 1.0 and start_share(1.0, 0) == 0.0
