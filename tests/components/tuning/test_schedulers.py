"""Trial schedulers against plain reference implementations on recorded learning curves
(tests/components/tuning/data/curves.json), plus their properties: reproducible PBT, a state that round-trips
mid-sweep, and every bad option named at once."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.tuning.schedulers import (
    ASHA,
    PBT,
    Action,
    Hyperband,
    MedianStopping,
    SuccessiveHalving,
    make_scheduler,
    options_problems,
)

CURVES = json.loads((Path(__file__).parent / "data" / "curves.json").read_text())["curves"]
ORDER = sorted(CURVES)
MAX_T = 27


def drive(scheduler, curves=CURVES, order=ORDER, max_t=MAX_T):
    """Feed results round robin (each running trial one iteration per round, in ``order``), as the tune engine
    does; run promoted trials on. Returns {trial: (final status, iterations run)}."""
    for trial in order:
        scheduler.add(trial, {"id": trial})
    if hasattr(scheduler, "seal"):
        scheduler.seal()
    ran = dict.fromkeys(order, 0)
    while True:
        moved = False
        for trial in order:
            if scheduler.trials[trial]["status"] != "running":
                continue
            ran[trial] += 1
            moved = True
            decision = scheduler.result(trial, ran[trial], curves[trial][ran[trial] - 1])
            if decision.action is Action.CONTINUE and ran[trial] >= max_t:
                scheduler.complete(trial)
        resumed = scheduler.resume()
        if not moved and not resumed:
            break
    return {trial: (scheduler.trials[trial]["status"], ran[trial]) for trial in order}


def _interp(values, fraction):
    """The fraction quantile with linear interpolation, written out (numpy.percentile's default)."""
    data = sorted(values)
    pos = (len(data) - 1) * fraction
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def ref_asha(grace, eta, mode):
    """ASHA as the paper's pseudo-code reads, one bracket, trials reporting every iteration round robin."""
    sign = 1 if mode == "max" else -1
    milestones = {grace * eta**k for k in range(40) if grace * eta**k <= MAX_T}
    recorded = {m: [] for m in milestones}
    alive = list(ORDER)
    out = {}
    for iteration in range(1, MAX_T + 1):
        for trial in list(alive):
            value = sign * CURVES[trial][iteration - 1]
            if iteration in milestones:
                seen = recorded[iteration]
                cutoff = _interp(seen, 1 - 1 / eta) if seen else None
                seen.append(value)
                if cutoff is not None and value < cutoff:
                    alive.remove(trial)
                    out[trial] = ("stopped", iteration)
    out.update({trial: ("completed", MAX_T) for trial in alive})
    return out


def ref_successive_halving(trials, start, eta, max_t, mode):
    """Synchronous successive halving: all run to the rung, the best floor(n / eta**k) go on."""
    sign = 1 if mode == "max" else -1
    n, out, k, members = len(trials), {}, 0, list(trials)
    while True:
        milestone = min(int(round(start * eta**k)), max_t)
        keep = max(1, int(n / eta ** (k + 1) + 1e-9))
        if milestone >= max_t or len(members) == 1 or max(1, int(n / eta**k + 1e-9)) == 1:
            out.update({trial: ("completed", max_t) for trial in members})
            return out
        ranked = sorted(members, key=lambda t: (-sign * CURVES[t][milestone - 1], members.index(t)))
        for trial in ranked[keep:]:
            out[trial] = ("stopped", milestone)
        members = [trial for trial in members if trial in ranked[:keep]]
        k += 1


def ref_median(grace, min_samples, mode):
    sign = 1 if mode == "max" else -1
    history = {trial: [] for trial in ORDER}
    alive, out = list(ORDER), {}
    for iteration in range(1, MAX_T + 1):
        for trial in list(alive):
            history[trial].append(sign * CURVES[trial][iteration - 1])
            if iteration < grace:
                continue
            means = [statistics.fmean(points[:iteration]) for other, points in history.items()
                     if other != trial and points]
            if len(means) >= min_samples and max(history[trial]) < statistics.median(means):
                alive.remove(trial)
                out[trial] = ("stopped", iteration)
    out.update({trial: ("completed", MAX_T) for trial in alive})
    return out


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("grace", "eta"), [(1, 3), (2, 2), (3, 3)])
def test_asha_matches_the_reference(mode, grace, eta):
    assert drive(ASHA(mode=mode, max_iterations=MAX_T, grace_period=grace, reduction_factor=eta)) == \
        ref_asha(grace, eta, mode)


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("grace", "eta"), [(1, 3), (3, 3), (1, 2)])
def test_successive_halving_matches_the_reference(mode, grace, eta):
    got = drive(SuccessiveHalving(mode=mode, max_iterations=MAX_T, grace_period=grace, reduction_factor=eta,
                                  num_trials=len(ORDER)))
    assert got == ref_successive_halving(ORDER, grace, eta, MAX_T, mode)


@pytest.mark.parametrize("mode", ["max", "min"])
def test_hyperband_matches_the_reference_bracket_by_bracket(mode):
    scheduler = Hyperband(mode=mode, max_iterations=MAX_T, grace_period=1, reduction_factor=3)
    sizes = [bracket["n"] for bracket in scheduler.brackets_data]
    assert sizes == [27, 12, 6, 4]  # Li et al.'s table for R = 27, eta = 3
    trials = [f"{name}-{index}" for index in range(4) for name in ORDER][:sum(sizes)]
    curves = {trial: CURVES[trial.split("-")[0]] for trial in trials}
    got = drive(scheduler, curves=curves, order=trials)
    expected, at = {}, 0
    for size, start in zip(sizes, (1, 3, 9, 27), strict=True):
        group = trials[at:at + size]
        at += size
        expected.update(_with_curves(curves, lambda group=group, start=start: ref_successive_halving(
            group, start, 3, MAX_T, mode)))
    assert got == expected


def _with_curves(curves, fn):
    global CURVES
    saved = CURVES
    CURVES = curves
    try:
        return fn()
    finally:
        CURVES = saved


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("grace", "samples"), [(1, 3), (4, 5)])
def test_median_stopping_matches_the_reference(mode, grace, samples):
    assert drive(MedianStopping(mode=mode, max_iterations=MAX_T, grace_period=grace, min_samples=samples)) == \
        ref_median(grace, samples, mode)


def test_sync_rungs_form_the_trial_groups_and_seal_takes_fewer_trials():
    scheduler = SuccessiveHalving(max_iterations=9, grace_period=1, reduction_factor=3, num_trials=9)
    for trial in ORDER[:5]:
        scheduler.add(trial, {})
    assert scheduler.capacity() == 4
    assert scheduler.groups() == [ORDER[:5]]
    for trial in ORDER[:5]:
        assert scheduler.result(trial, 1, CURVES[trial][0]).action is Action.PAUSE
    assert scheduler.resume() == []  # four trials are still to come
    scheduler.seal()
    promoted = scheduler.resume()
    assert len(promoted) == 1 and promoted[0][1] == 9  # floor(5 / 3) = 1 goes on, to the end
    assert scheduler.groups() == [[promoted[0][0]]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), min_size=2, max_size=30),
       st.sampled_from([2, 3, 4]))
def test_asha_never_stops_the_best_trial_at_a_rung(values, eta):
    scheduler = ASHA(max_iterations=1, grace_period=1, reduction_factor=eta)
    decisions = {}
    for index, value in enumerate(values):
        scheduler.add(f"t{index}", {})
        decisions[index] = scheduler.result(f"t{index}", 1, value).action
    best_so_far = -1.0
    for index, value in enumerate(values):
        if value > best_so_far:
            assert decisions[index] is Action.CONTINUE
        best_so_far = max(best_so_far, value)


def test_pbt_is_reproducible_and_exploits_the_top():
    def run(seed):
        scheduler = PBT(max_iterations=MAX_T, interval=3, quantile=0.25, seed=seed,
                        mutations={"lr": {"low": 1e-4, "high": 1e-1}, "batch": {"values": [16, 32, 64]}})
        for trial in ORDER:
            scheduler.add(trial, {"lr": 0.01, "batch": 32})
        decisions = []
        for iteration in range(1, 10):
            for trial in ORDER:
                decision = scheduler.result(trial, iteration, CURVES[trial][iteration - 1])
                if decision.exploit:
                    decisions.append((iteration, trial, decision.exploit, decision.config))
        return decisions

    first = run(1)
    assert first and first == run(1) and first != run(2)
    for iteration, trial, donor, config in first:
        assert iteration % 3 == 0 and donor != trial
        assert 1e-4 <= config["lr"] <= 1e-1 and config["batch"] in {16, 32, 64}


@pytest.mark.parametrize("name", ["asha", "sh", "hyperband", "median", "pbt"])
def test_state_round_trips_mid_sweep(name):
    options = {"pbt": {"mutations": {"lr": {"low": 0.001, "high": 0.1}}, "seed": 3},
               "sh": {"num_trials": len(ORDER)}}.get(name, {})

    def fresh():
        return make_scheduler(name, mode="max", max_iterations=MAX_T, **options)

    one = fresh()
    for trial in ORDER[:one.capacity() or len(ORDER)] if one.capacity() is not None else ORDER:
        one.add(trial, {"lr": 0.01})
    trials = list(one.trials)
    for iteration in range(1, 4):
        for trial in trials:
            if one.trials[trial]["status"] == "running":
                one.result(trial, iteration, CURVES[trial][iteration - 1])
    two = fresh()
    two.restore(json.loads(json.dumps(one.state())))
    for iteration in range(4, 8):
        for trial in trials:
            if one.trials[trial]["status"] == "running":
                assert one.result(trial, iteration, CURVES[trial][iteration - 1]) == \
                    two.result(trial, iteration, CURVES[trial][iteration - 1])
    assert one.rungs() == two.rungs() and one.groups() == two.groups()
    with pytest.raises(ValueError, match="state of a"):
        make_scheduler("fifo", mode="max", max_iterations=3).restore(one.state())


def test_every_bad_option_is_named_at_once():
    problems = options_problems("asha", {"grace_period": 0, "reduction_factor": "x", "speed": 1})
    assert {field for field, _ in problems} == {"spec.scheduler.options.grace_period",
                                                "spec.scheduler.options.reduction_factor",
                                                "spec.scheduler.options.speed"}
    assert options_problems("pbt", {"quantile": 0.9}) == [
        ("spec.scheduler.options.mutations", "required: the parameters PBT explores"),
        ("spec.scheduler.options.quantile", "must be in (0, 0.5]")]
    assert options_problems("nope", {}) == [("spec.scheduler.name",
                                             "must be one of fifo, asha, sh, hyperband, median, pbt")]
    with pytest.raises(ValueError, match="grace_period"):
        make_scheduler("asha", mode="max", max_iterations=9, grace_period=0)
    assert math.isclose(_interp([1.0, 2.0, 3.0, 4.0], 2 / 3), 3.0)
    assert statistics.median([3.0, 1.0, 2.0]) == _interp([3.0, 1.0, 2.0], 0.5)
