"""Trial schedulers against plain reference implementations (written out below, from the papers and Ray Tune's
code) on recorded learning curves (data/curves.json, made by :func:`make_curves`), in both modes; and their
properties: ASHA never stops a trial that is best at its rung, the synchronous rung sizes, reproducible PBT, a
state that round-trips mid-sweep, every bad option named at once."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.tuning.schedulers import (
    ASHA,
    FIFO,
    PBT,
    SCHEDULER_OPTIONS,
    Action,
    Hyperband,
    MedianStopping,
    SuccessiveHalving,
    asha_milestones,
    explore,
    hyperband_brackets,
    make_scheduler,
    options_problems,
)

CURVES_FILE = Path(__file__).parent / "data" / "curves.json"


def make_curves(seed: int = 20261124, count: int = 27, iterations: int = 27) -> dict[str, list[float]]:
    """How data/curves.json was made: validation-accuracy-like curves ``top - (top - start) * exp(-rate * k)``
    for k = 1 .. iterations, plus gaussian noise, rounded to 5 digits; per curve top, rate, start and the noise's
    deviation are drawn in that order, then the noise. Rewrite the file with
    ``json.dumps({"how": ..., "curves": make_curves()}, indent=1)``."""
    rng = random.Random(seed)
    curves = {}
    for index in range(count):
        top, rate = rng.uniform(0.55, 0.98), rng.uniform(0.08, 0.6)
        start, noise = rng.uniform(0.1, 0.3), rng.uniform(0.002, 0.02)
        curves[f"t{index:02d}"] = [round(top - (top - start) * math.exp(-rate * k) + rng.gauss(0, noise), 5)
                                   for k in range(1, iterations + 1)]
    return curves


CURVES = json.loads(CURVES_FILE.read_text())["curves"]
NAMES = sorted(CURVES)
MAX_T = 27
# For mode "min": the curves as losses (-log accuracy, like a cross-entropy), a non-linear mirror of the accuracies.
LOSSES = {trial: [round(-math.log(value), 5) for value in curve] for trial, curve in CURVES.items()}


def curves_for(mode):
    return CURVES if mode == "max" else LOSSES

MUTATIONS = {"lr": {"low": 1e-4, "high": 1e-1, "log": True}, "batch": {"values": [16, 32, 64, 128]},
             "layers": {"low": 1, "high": 8}, "momentum": {"factor": [0.9, 1.1]}}


def test_the_recorded_curves_are_reproducible():
    assert make_curves() == CURVES
    assert len(CURVES) == 27 and all(len(curve) == MAX_T for curve in CURVES.values())


# -- driving a scheduler as the tune engine does ---------------------------------------------------------------
def drive(scheduler, curves=CURVES, order=NAMES, max_t=MAX_T, fail_at=None):
    """Add every trial (then seal()), then rounds: each running trial, in ``order``, runs one iteration and
    reports it; after each round, the trials resume() hands out run on. A trial never runs past its target().
    ``fail_at``: trial -> the iteration at which it fails instead of reporting. Returns {trial: (how it ended,
    iterations run)}."""
    fail_at = fail_at or {}
    for trial in order:
        scheduler.add(trial, {"id": trial})
    scheduler.seal()
    ran, view, out = dict.fromkeys(order, 0), dict.fromkeys(order, "running"), {}
    while True:
        moved = False
        for trial in order:
            if view[trial] != "running":
                continue
            assert ran[trial] < scheduler.target(trial) <= max_t
            ran[trial] += 1
            moved = True
            if fail_at.get(trial) == ran[trial]:
                scheduler.fail(trial)
                view[trial], out[trial] = "failed", ("failed", ran[trial])
                continue
            decision = scheduler.result(trial, ran[trial], curves[trial][ran[trial] - 1])
            if decision.action is Action.STOP:
                view[trial], out[trial] = "stopped", ("stopped", ran[trial])
            elif decision.action is Action.PAUSE:
                assert ran[trial] == scheduler.target(trial)
                view[trial] = "paused"
            elif ran[trial] >= max_t:
                scheduler.complete(trial)
                view[trial], out[trial] = "completed", ("completed", ran[trial])
        for trial, target in scheduler.resume():
            assert view[trial] == "paused" and target > ran[trial]
            view[trial] = "running"
        for trial in order:  # paused trials their rung did not promote
            if view[trial] == "paused" and scheduler.status(trial) == "stopped":
                view[trial], out[trial] = "stopped", ("stopped", ran[trial])
        if not moved:
            break
    assert set(out) == set(order), "a trial was left paused"
    return out


def _percentile(values, fraction):
    """numpy.percentile's default (linear) written out."""
    data = sorted(values)
    position = (len(data) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


# -- references ------------------------------------------------------------------------------------------------
def ref_asha(grace, eta, mode, max_t=MAX_T, curves=CURVES, order=NAMES, bracket_of=None):
    """Ray's AsyncHyperBandScheduler: bracket s has rungs at grace * eta**(k + s) (floats, compared with the
    iteration); a result at max_t ends the trial; otherwise the highest rung reached where the trial has no
    value judges it against the (1 - 1/eta) percentile of the values recorded there, then records it. Trials
    report round robin, one iteration each per round."""
    sign = 1 if mode == "max" else -1
    recorded: dict[tuple[int, float], dict[str, float]] = {}
    alive, out = list(order), {}
    for iteration in range(1, max_t + 1):
        for trial in list(alive):
            if iteration >= max_t:
                alive.remove(trial)
                out[trial] = ("completed", iteration)
                continue
            s = bracket_of[trial] if bracket_of else 0
            milestones = [grace * eta ** (k + s) for k in range(200) if grace * eta ** (k + s) <= max_t]
            value = sign * curves[trial][iteration - 1]
            for milestone in reversed(milestones):
                rung = recorded.setdefault((s, milestone), {})
                if iteration < milestone or trial in rung:
                    continue
                cutoff = _percentile(list(rung.values()), 1 - 1 / eta) if rung else None
                rung[trial] = value
                if cutoff is not None and value < cutoff:
                    alive.remove(trial)
                    out[trial] = ("stopped", iteration)
                break
    return out


def ref_successive_halving(trials, milestones, eta, mode, max_t, curves=CURVES):
    """Li et al.'s SuccessiveHalving for one bracket: all ``trials`` run to milestone 0; the best
    floor(n_i / eta) (at least one; ties: the earlier trial) go on to the next milestone, the rest stop there;
    the last milestone, or a single trial left, runs to max_t. Returns (outcome, promoted per rung)."""
    sign = 1 if mode == "max" else -1
    members, out, promoted = list(trials), {}, []
    for k, milestone in enumerate(milestones):
        if k == len(milestones) - 1 or len(members) == 1:
            out.update({trial: ("completed", max_t) for trial in members})
            break
        keep = max(1, math.floor(len(members) / eta))
        ranked = sorted(members, key=lambda trial: -sign * curves[trial][milestone - 1])  # stable
        out.update({trial: ("stopped", milestone) for trial in ranked[keep:]})
        members = [trial for trial in members if trial in ranked[:keep]]
        promoted.append(members)
    return out, promoted


def ref_hyperband_brackets(grace, eta, max_t):
    """Li et al.'s brackets for whole eta and max_t = grace * eta**s_max: (n, milestones r_i = R * eta**(i - s))."""
    s_max = max(s for s in range(40) if grace * eta**s <= max_t)
    return [(math.ceil((s_max + 1) * eta**s / (s + 1)), [max_t // eta ** (s - i) for i in range(s + 1)])
            for s in range(s_max, -1, -1)]


def ref_median(grace, min_samples, mode, max_t=MAX_T, curves=CURVES, order=NAMES):
    """Ray's MedianStoppingRule (hard stop): after grace, stop a trial whose best value is strictly worse than
    the median, over the other trials that reached this iteration (at least min_samples of them), of their mean
    value over iterations grace .. this one. Round robin, one iteration each per round."""
    sign = 1 if mode == "max" else -1
    results: dict[str, list[tuple[int, float]]] = {}
    alive, out = list(order), {}
    for iteration in range(1, max_t + 1):
        for trial in list(alive):
            results.setdefault(trial, []).append((iteration, sign * curves[trial][iteration - 1]))
            if iteration < grace:
                continue
            others = [other for other in results if other != trial and results[other][-1][0] >= iteration]
            if len(others) < min_samples:
                continue
            means = [statistics.fmean([v for at, v in results[other] if grace <= at <= iteration])
                     for other in others]
            if max(v for _, v in results[trial]) < statistics.median(means):
                alive.remove(trial)
                out[trial] = ("stopped", iteration)
    out.update({trial: ("completed", max_t) for trial in alive})
    return out


def ref_explore(config, mutations, p, rng):
    """Ray's _explore, written out for our mutation forms (ranges clipped)."""
    new = dict(config)
    for name, rule in mutations.items():
        old = config[name]
        if "values" in rule:
            if rng.random() < p or old not in rule["values"]:
                new[name] = rng.choice(rule["values"])
            else:
                index = rule["values"].index(old) + rng.choice([-1, 1])
                new[name] = rule["values"][min(max(index, 0), len(rule["values"]) - 1)]
        elif "low" in rule:
            if rng.random() < p:
                new[name] = (math.exp(rng.uniform(math.log(rule["low"]), math.log(rule["high"])))
                             if rule.get("log") else rng.uniform(rule["low"], rule["high"]))
            else:
                new[name] = old * rng.choice(rule.get("factor", [1.2, 0.8]))
            new[name] = min(max(new[name], rule["low"]), rule["high"])
            if isinstance(old, int):
                new[name] = min(max(int(new[name]), math.ceil(rule["low"])), math.floor(rule["high"]))
        else:
            new[name] = old * rng.choice(rule["factor"])
            if isinstance(old, int):
                new[name] = int(new[name])
    return new


def ref_pbt(interval, fraction, p, seed, mode, configs, max_t=MAX_T, curves=CURVES, order=NAMES):
    """Ray's asynchronous PopulationBasedTraining: at each of a trial's perturbation steps its last score is
    updated; the scored trials sorted by score; quantiles of ceil(n * fraction) (at most floor(n / 2)); a trial
    in the bottom one clones random.choice(top) and explores its config. No exploit at max_t."""
    sign = 1 if mode == "max" else -1
    rng = random.Random(seed)
    last, score, config, events = dict.fromkeys(order, 0), {}, dict(configs), []
    for iteration in range(1, max_t + 1):
        for trial in order:
            if iteration - last[trial] < interval:
                continue
            last[trial], score[trial] = iteration, sign * curves[trial][iteration - 1]
            ranked = sorted((t for t in order if t in score), key=lambda t: score[t])
            count = math.ceil(len(ranked) * fraction)
            if count > len(ranked) / 2:
                count = len(ranked) // 2
            if len(ranked) <= 1 or count == 0 or trial not in ranked[:count] or iteration >= max_t:
                continue
            donor = rng.choice(ranked[-count:])
            config[trial] = ref_explore(config[donor], MUTATIONS, p, rng)
            events.append((iteration, trial, donor, config[trial]))
    return events


# -- against the references ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("grace", "eta"), [(1, 3), (2, 2), (3, 3), (1, 4), (1, 1.5)])
def test_asha_matches_the_reference(mode, grace, eta):
    curves = curves_for(mode)
    got = drive(ASHA(mode=mode, max_iterations=MAX_T, grace_period=grace, reduction_factor=eta), curves=curves)
    assert got == ref_asha(grace, eta, mode, curves=curves)
    assert any(how == "stopped" for how, _ in got.values()) and any(how == "completed" for how, _ in got.values())


@pytest.mark.parametrize("mode", ["max", "min"])
def test_asha_with_brackets_matches_the_reference_bracket_by_bracket(mode):
    scheduler = ASHA(mode=mode, max_iterations=MAX_T, grace_period=1, reduction_factor=3, brackets=3, seed=4)
    got = drive(scheduler, curves=curves_for(mode))
    assert len(set(scheduler.bracket_of.values())) == 3
    assert got == ref_asha(1, 3, mode, curves=curves_for(mode), bracket_of=scheduler.bracket_of)


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("grace", "eta", "max_t"), [(1, 3, 27), (3, 3, 27), (1, 2, 27), (1, 2, 16), (2, 4, 27)])
def test_successive_halving_matches_the_reference(mode, grace, eta, max_t):
    scheduler = SuccessiveHalving(mode=mode, max_iterations=max_t, grace_period=grace, reduction_factor=eta,
                                  num_trials=len(NAMES))
    got = drive(scheduler, curves=curves_for(mode), max_t=max_t)
    milestones = [grace * eta**k for k in range(40) if grace * eta**k < max_t] + [max_t]
    expected, promoted = ref_successive_halving(NAMES, milestones, eta, mode, max_t, curves_for(mode))
    assert got == expected
    assert [rung["promoted"] for rung in scheduler.rungs()][:len(promoted)] == promoted


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("grace", "eta", "max_t"), [(1, 3, 27), (1, 3, 9), (3, 3, 27), (1, 2, 16)])
def test_hyperband_matches_the_reference_bracket_by_bracket(mode, grace, eta, max_t):
    scheduler = Hyperband(mode=mode, max_iterations=max_t, grace_period=grace, reduction_factor=eta)
    brackets = ref_hyperband_brackets(grace, eta, max_t)
    assert [(n, milestones) for _, n, milestones in hyperband_brackets(grace, eta, max_t)] == brackets
    # More trials than curves: the i-th trial follows curve i mod 27, so later brackets see curves again.
    trials = [f"{NAMES[i % len(NAMES)]}#{i}" for i in range(sum(n for n, _ in brackets))]
    curves = {trial: curves_for(mode)[trial.split("#")[0]] for trial in trials}
    assert scheduler.capacity() == len(trials)
    got = drive(scheduler, curves=curves, order=trials, max_t=max_t)
    expected, at = {}, 0
    for b, (n, milestones) in enumerate(brackets):
        outcome, promoted = ref_successive_halving(trials[at:at + n], milestones, eta, mode, max_t, curves)
        expected.update(outcome)
        assert [rung["promoted"] for rung in scheduler.rungs() if rung["bracket"] == b][:len(promoted)] == promoted
        at += n
    assert got == expected


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("grace", "samples"), [(1, 3), (4, 5), (1, 1), (9, 3)])
def test_median_stopping_matches_the_reference(mode, grace, samples):
    got = drive(MedianStopping(mode=mode, max_iterations=MAX_T, grace_period=grace, min_samples_required=samples),
                curves=curves_for(mode))
    assert got == ref_median(grace, samples, mode, curves=curves_for(mode))
    assert any(how == "stopped" for how, _ in got.values())


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize(("interval", "fraction", "p"), [(3, 0.25, 0.25), (4, 0.5, 0.0), (2, 0.1, 1.0)])
def test_pbt_matches_the_reference(mode, interval, fraction, p):
    configs = {trial: {"lr": 0.01 * (1 + i % 5), "batch": [16, 32, 64, 128][i % 4], "layers": 1 + i % 8,
                       "momentum": 0.9, "seed": i} for i, trial in enumerate(NAMES)}
    scheduler = PBT(mode=mode, max_iterations=MAX_T, perturbation_interval=interval, quantile_fraction=fraction,
                    hyperparam_mutations=MUTATIONS, resample_probability=p, seed=11)
    for trial in NAMES:
        scheduler.add(trial, configs[trial])
    events = []
    for iteration in range(1, MAX_T + 1):
        for trial in NAMES:
            decision = scheduler.result(trial, iteration, curves_for(mode)[trial][iteration - 1])
            assert decision.action is Action.CONTINUE
            if decision.exploit:
                events.append((iteration, trial, decision.exploit, decision.config))
                assert scheduler.trials[trial]["config"] == decision.config
    assert events and events == ref_pbt(interval, fraction, p, 11, mode, configs, curves=curves_for(mode))
    for iteration, trial, donor, config in events:
        assert iteration % interval == 0 and iteration < MAX_T and donor != trial
        assert 1e-4 <= config["lr"] <= 1e-1 and config["batch"] in {16, 32, 64, 128}
        assert isinstance(config["layers"], int) and 1 <= config["layers"] <= 8 and config["seed"] in range(27)
    assert scheduler.rungs()[0].keys() == {"iteration", "trial", "from", "config"}


def test_fifo_never_stops():
    assert drive(FIFO(max_iterations=MAX_T)) == {trial: ("completed", MAX_T) for trial in NAMES}


# -- behaviour in detail ---------------------------------------------------------------------------------------
def test_asha_rungs_cutoffs_and_reasons_as_ray():
    assert asha_milestones(1, 2, 10) == [1, 2, 4, 8] and asha_milestones(1, 3, 27) == [1, 3, 9]
    assert asha_milestones(1, 3, 27, s=1) == [3, 9] and asha_milestones(5, 3, 5) == []
    # Ray's _Bracket docstring: values 2 and 4 at the first rung give a cutoff of 3, so 1 stops.
    scheduler = ASHA(max_iterations=10, grace_period=1, reduction_factor=2)
    for trial in "abc":
        scheduler.add(trial, {})
    assert scheduler.result("a", 1, 2).action is Action.CONTINUE
    assert scheduler.result("b", 1, 4).action is Action.CONTINUE
    decision = scheduler.result("c", 1, 1)
    assert decision.action is Action.STOP and decision.reason == "rung 0 (iteration 1): 1 not in the top 1/2 (cutoff 3)"
    assert scheduler.result("c", 2, 9).action is Action.STOP  # it ended
    scheduler.add("d", {})
    assert scheduler.result("d", 1, 2).action is Action.CONTINUE  # the cutoff of 2, 4, 1 is 2: equal goes on
    scheduler.stop("d")
    assert scheduler.result("a", 2, 3).action is Action.CONTINUE
    decision = scheduler.result("b", 2, 2.5)
    assert decision.reason == "rung 1 (iteration 2): 2.5 not in the top 1/2 (cutoff 3)"
    for iteration in range(3, 11):  # a trial at max_iterations is not judged; its value goes in the final row
        assert scheduler.result("a", iteration, 0.1).action is Action.CONTINUE
    rows = scheduler.rungs()
    assert [row["milestone"] for row in rows] == [1, 2, 4, 8, 10] and rows[-1]["final"]
    assert rows[0]["values"] == {"a": 2, "b": 4, "c": 1, "d": 2} and rows[0]["promoted"] == ["a", "b", "d"]
    assert rows[0]["stopped"] == ["c"] and rows[1]["stopped"] == ["b"] and rows[-1]["values"] == {"a": 0.1}
    assert scheduler.groups() == [["a"]] and scheduler.target("a") == 10


def test_asha_in_min_mode_and_invalid_values():
    scheduler = ASHA(mode="min", max_iterations=9, grace_period=1, reduction_factor=3)
    for trial in "abcde":
        scheduler.add(trial, {})
    assert scheduler.result("a", 1, math.nan).action is Action.CONTINUE  # first at its rung: nothing to compare
    assert scheduler.result("b", 1, 0.5).action is Action.CONTINUE  # the NaN is left out of the cutoff
    assert scheduler.result("c", 1, 0.4).action is Action.CONTINUE  # lower loss
    decision = scheduler.result("d", 1, math.inf)
    assert decision.action is Action.STOP and "invalid" in decision.reason
    assert scheduler.result("e", 1, 0.6).action is Action.STOP
    row = scheduler.rungs()[0]
    assert row["values"] == {"b": 0.5, "c": 0.4, "e": 0.6} and row["invalid"] == ["a", "d"]
    json.dumps(scheduler.state(), allow_nan=False)
    json.dumps(scheduler.rungs(), allow_nan=False)


def test_asha_brackets_are_drawn_as_rays_softmax_from_the_seed():
    def draw(seed):
        scheduler = ASHA(max_iterations=27, grace_period=1, reduction_factor=3, brackets=3, seed=seed)
        for index in range(3000):
            scheduler.add(str(index), {})
        return [scheduler.bracket_of[str(index)] for index in range(3000)]

    first = draw(1)
    assert first == draw(1) and first != draw(2)
    weights = [1, math.exp(-1), math.exp(-2)]  # the brackets have 3, 2 and 1 rungs
    for bracket, weight in enumerate(weights):
        assert abs(first.count(bracket) / 3000 - weight / sum(weights)) < 0.03


def test_sync_rungs_pause_promote_and_form_the_groups():
    scheduler = SuccessiveHalving(max_iterations=9, grace_period=1, reduction_factor=3, num_trials=9)
    trials = NAMES[:9]
    for trial in trials[:5]:
        scheduler.add(trial, {})
    assert scheduler.capacity() == 4 and scheduler.groups() == [trials[:5]]
    assert all(scheduler.target(trial) == 1 for trial in trials[:5])
    decision = scheduler.result(trials[0], 1, 0.5)
    assert decision.action is Action.PAUSE and decision.reason.endswith("waiting for 4 more trial(s)")
    assert scheduler.result(trials[0], 2, 0.9).action is Action.PAUSE  # a late result while held: not recorded
    for trial in trials[5:]:
        scheduler.add(trial, {})
    values = dict(zip(trials, [0.5, 0.9, 0.1, 0.8, 0.7, 0.2, 0.3, 0.6, 0.4], strict=True))
    decisions = {trial: scheduler.result(trial, 1, values[trial]) for trial in trials[1:]}
    assert all(decisions[trial].action is Action.PAUSE for trial in trials[1:-1])
    # The last report closes the rung: the best 9 / 3 = 3 (0.9, 0.8, 0.7) go on, the rest stop.
    assert decisions[trials[-1]].action is Action.STOP and "cutoff 0.7" in decisions[trials[-1]].reason
    scheduler.complete(trials[-1])  # the first end stands
    assert scheduler.status(trials[-1]) == "stopped"
    assert scheduler.resume() == [(trials[1], 3), (trials[3], 3), (trials[4], 3)] and scheduler.resume() == []
    assert scheduler.groups() == [[trials[1], trials[3], trials[4]]]
    assert {trial for trial in trials if scheduler.status(trial) == "stopped"} == set(trials) - {
        trials[1], trials[3], trials[4]}
    scheduler.fail(trials[4])  # a failed trial does not hold its rung up
    assert scheduler.result(trials[1], 3, 0.95).action is Action.PAUSE
    decision = scheduler.result(trials[3], 3, 0.85)
    assert decision.action is Action.STOP  # one goes on to 9: trials[1]
    assert scheduler.resume() == [(trials[1], 9)]
    assert scheduler.result(trials[1], 9, 0.97).action is Action.CONTINUE
    rows = scheduler.rungs()
    assert [(row["milestone"], row["size"], len(row["members"])) for row in rows] == [(1, 9, 9), (3, 3, 3), (9, 1, 1)]


def test_sh_without_num_trials_waits_for_seal_and_seal_shrinks_the_bracket():
    scheduler = SuccessiveHalving(max_iterations=9, grace_period=1, reduction_factor=3)
    assert scheduler.capacity() is None
    for trial in NAMES[:5]:
        scheduler.add(trial, {})
        assert scheduler.result(trial, 1, CURVES[trial][0]).action is Action.PAUSE
    assert scheduler.resume() == []
    scheduler.seal()
    assert scheduler.capacity() == 0
    best = max(NAMES[:5], key=lambda trial: CURVES[trial][0])
    assert scheduler.resume() == [(best, 9)]  # floor(5 / 3) = 1: it runs to the end
    with pytest.raises(ValueError, match="sealed"):
        scheduler.add("late", {})
    lone = SuccessiveHalving(max_iterations=9, num_trials=9)
    lone.add("only", {})
    assert lone.result("only", 1, 0.3).action is Action.PAUSE
    lone.seal()  # a bracket of one: it runs on to the end
    assert lone.resume() == [("only", 9)] and lone.target("only") == 9


def test_hyperband_brackets_follow_li_et_al_and_run_side_by_side():
    assert [(s, n, milestones[0]) for s, n, milestones in hyperband_brackets(1, 3, 81)] == [
        (4, 81, 1), (3, 34, 3), (2, 15, 9), (1, 8, 27), (0, 5, 81)]  # the paper's table for R = 81
    scheduler = Hyperband(max_iterations=27)
    assert [[(row["milestone"], row["size"]) for row in scheduler.rungs() if row["bracket"] == b] for b in range(4)] \
        == [[(1, 27), (3, 9), (9, 3), (27, 1)], [(3, 12), (9, 4), (27, 1)], [(9, 6), (27, 2)], [(27, 4)]]
    for index in range(30):
        scheduler.add(str(index), {})
    assert scheduler.groups() == [[str(i) for i in range(27)], ["27", "28", "29"]]
    assert scheduler.target("0") == 1 and scheduler.target("29") == 3
    scheduler.seal()  # 3 of 12 in the second bracket: 3 -> 1 at iteration 3, the rest dropped
    assert scheduler.capacity() == 0 and len(scheduler.brackets_data) == 2
    assert [(row["milestone"], row["size"]) for row in scheduler.rungs() if row["bracket"] == 1] == [(3, 3), (27, 1)]


def test_median_stopping_needs_samples_and_treats_invalid_values_as_worst():
    scheduler = MedianStopping(max_iterations=9, grace_period=2, min_samples_required=2)
    for trial in "abcd":
        scheduler.add(trial, {})
    for trial, value in zip("abcd", [0.5, 0.6, 0.7, math.nan], strict=True):
        assert scheduler.result(trial, 1, value).action is Action.CONTINUE  # within grace
    assert scheduler.result("a", 2, 0.5).action is Action.CONTINUE  # nobody else reached iteration 2 yet
    assert scheduler.result("b", 2, 0.6).action is Action.CONTINUE  # one other: fewer than 2
    assert scheduler.result("c", 2, 0.4).action is Action.CONTINUE  # best 0.7 >= median(0.5, 0.6)
    decision = scheduler.result("d", 2, math.nan)
    assert decision.action is Action.STOP and decision.reason.startswith("iteration 2: best invalid")
    tie = MedianStopping(max_iterations=9, grace_period=1, min_samples_required=2)
    for trial, value in zip("xyz", [0.4, 0.6, 0.5], strict=True):
        tie.add(trial, {})
        assert tie.result(trial, 1, value).action is Action.CONTINUE  # z: 0.5 equals the median: it goes on


def test_pbt_quantiles_exploration_and_the_last_iteration():
    scheduler = PBT(max_iterations=4, perturbation_interval=2, quantile_fraction=0.25,
                    hyperparam_mutations={"lr": {"values": [1, 2, 3]}}, seed=0)
    for index in range(7):
        scheduler.add(str(index), {"lr": 2})
    for index in range(7):
        scheduler.result(str(index), 1, index)
    for index in range(6):
        scheduler.result(str(index), 2, index)
    scheduler.result("6", 2, math.nan)  # invalid: the bottom
    lower, upper = scheduler.quantiles()
    assert lower == ["6", "0"] and upper == ["4", "5"]  # ceil(7 / 4) = 2
    # Only the trial reporting is exploited: "0" was alone when it reported; "6" came last, in the bottom.
    assert [(e["iteration"], e["trial"]) for e in scheduler.exploits] == [(2, "6")]
    assert scheduler.exploits[0]["from"] in upper and scheduler.exploits[0]["config"]["lr"] in {1, 2, 3}
    for index in range(7):
        scheduler.result(str(index), 3, index)
    assert all(not scheduler.result(str(index), 4, -index).exploit for index in range(7))  # max_iterations
    rng = random.Random(3)
    stepping = PBT(max_iterations=20, perturbation_interval=4, hyperparam_mutations={"a": {"factor": [2]}})
    for trial, iterations in (("a", [3, 5, 8, 9]), ("b", [4, 8])):
        stepping.add(trial, {"a": 1})
        for iteration in iterations:
            stepping.result(trial, iteration, 0.5)
    assert stepping.last_perturbation == {"a": 9, "b": 8}  # as Ray: interval since the trial's last step
    assert explore({"x": 10, "y": "b", "z": 0.5}, {"x": {"low": 1, "high": 11}, "y": {"values": ["a", "b"]},
                                                    "z": {"factor": [2.0]}}, 0.0, rng)["z"] == 1.0
    capped = PBT(max_iterations=9, quantile_fraction=0.5, hyperparam_mutations={"a": {"factor": [2]}})
    for index in range(3):
        capped.add(str(index), {"a": 1})
        capped.last_score[str(index)] = float(index)
    assert capped.quantiles() == (["0"], ["2"])  # ceil(1.5) = 2 > 3 / 2: floor(3 / 2) = 1


# -- properties ------------------------------------------------------------------------------------------------
values = st.one_of(st.floats(0, 1, allow_nan=False), st.sampled_from([0.0, 0.5, 1.0, math.nan, math.inf]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(values, min_size=12, max_size=12), min_size=2, max_size=10),
       st.lists(st.integers(0, 100), max_size=120), st.sampled_from([2, 3, 4, 1.5]), st.sampled_from([1, 2]),
       st.sampled_from(["min", "max"]))
def test_asha_never_stops_a_trial_that_is_best_at_its_rung(curves, picks, eta, grace, mode):
    scheduler = ASHA(mode=mode, max_iterations=12, grace_period=grace, reduction_factor=eta)
    ran = {}
    for index in range(len(curves)):
        scheduler.add(str(index), {})
        ran[str(index)] = 0
    for pick in picks:
        running = [trial for trial in ran if scheduler.status(trial) == "running" and ran[trial] < 12]
        if not running:
            break
        trial = running[pick % len(running)]
        ran[trial] += 1
        value = curves[int(trial)][ran[trial] - 1]
        rows = {row["milestone"]: row for row in scheduler.rungs() if not row.get("final")}
        before = rows.get(ran[trial])
        decision = scheduler.result(trial, ran[trial], value)
        if before is None or not math.isfinite(value):
            continue
        sign = 1 if mode == "max" else -1
        if all(sign * value > sign * other for other in before["values"].values()):
            assert decision.action is Action.CONTINUE


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.sampled_from([2, 3, 4]), st.sampled_from([1, 2, 3]), st.integers(3, 30),
       st.lists(st.sampled_from([0.1, 0.2, 0.3, 0.4, 0.5]), min_size=30, max_size=30),
       st.dictionaries(st.integers(0, 39), st.integers(1, 30), max_size=6))
def test_sync_rung_sizes_are_floor_of_size_over_eta(n, eta, grace, max_t, levels, failures):
    """Rung 0 holds n trials, rung k + 1 the best max(1, floor(size_k / eta)) of rung k, fewer only when fewer are
    left; milestones grace * eta**k below max_t then max_t, the rung of size 1 being the last."""
    grace = min(grace, max_t)
    trials = [f"t{i}" for i in range(n)]
    curves = {trial: [levels[(i + k) % 30] + k / 100 for k in range(max_t)] for i, trial in enumerate(trials)}
    fail_at = {f"t{i}": at for i, at in failures.items() if i < n and at <= max_t}
    scheduler = SuccessiveHalving(max_iterations=max_t, grace_period=grace, reduction_factor=eta, num_trials=n)
    out = drive(scheduler, curves=curves, order=trials, max_t=max_t, fail_at=fail_at)
    plan, size = [], n
    milestones = [grace * eta**k for k in range(40) if grace * eta**k < max_t] + [max_t]
    for k, milestone in enumerate(milestones):
        last = k == len(milestones) - 1 or size == 1
        plan.append((max_t if last else milestone, size))
        if last:
            break
        size = max(1, size // eta)
    rows = scheduler.rungs()
    assert [(row["milestone"], row["size"]) for row in rows] == plan
    for row, nxt in zip(rows, rows[1:], strict=False):
        reported = [trial for trial in row["members"] if fail_at.get(trial, max_t + 1) > row["milestone"]]
        assert len(nxt["members"]) == min(nxt["size"], len(reported))
        ranked = sorted(reported, key=lambda trial: (-curves[trial][row["milestone"] - 1], trials.index(trial)))
        assert nxt["members"] == sorted(ranked[:len(nxt["members"])], key=trials.index)  # ties: the earlier
        assert set(nxt["members"]) == set(row["promoted"]) and len(row["stopped"]) == len(reported) - len(nxt["members"])
    finishers = [trial for trial, (how, _) in out.items() if how == "completed"]
    assert sorted(finishers) == sorted(trial for trial in rows[-1]["members"] if trial not in fail_at)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.lists(values, min_size=8, max_size=8), min_size=2, max_size=9),
       st.integers(1, 3), st.sampled_from([0.25, 0.5, 0.1]))
def test_pbt_is_deterministic_for_a_seed(seed, curves, interval, fraction):
    def run():
        scheduler = PBT(max_iterations=8, perturbation_interval=interval, quantile_fraction=fraction,
                        hyperparam_mutations=MUTATIONS, seed=seed)
        for index in range(len(curves)):
            scheduler.add(str(index), {"lr": 0.01, "batch": 32, "layers": 2, "momentum": 0.9})
        return [scheduler.result(str(index), iteration, curves[index][iteration - 1])
                for iteration in range(1, 9) for index in range(len(curves))], scheduler.state()

    assert run() == run()


def _fresh(name):
    options = {"asha": {"brackets": 2}, "sh": {"num_trials": 12},
               "pbt": {"hyperparam_mutations": MUTATIONS, "perturbation_interval": 2}}.get(name, {})
    return make_scheduler(name, mode="max", max_iterations=9, seed=5, **options)


class _Sim:
    """A sweep of 12 trials on the recorded curves; step(pick) runs one running trial one iteration."""

    def __init__(self, scheduler):
        self.scheduler, self.ran, self.log = scheduler, {}, []
        for trial in NAMES[:scheduler.capacity() or 12]:
            scheduler.add(trial, {"lr": 0.01, "batch": 32, "layers": 2, "momentum": 0.9})
            self.ran[trial] = 0
        scheduler.seal()

    def step(self, pick):
        running = [t for t in self.ran if self.scheduler.status(t) == "running" and self.ran[t] < 9]
        if not running:
            return
        trial = running[pick % len(running)]
        self.ran[trial] += 1
        value = CURVES[trial][self.ran[trial] - 1] if pick % 17 else math.nan
        decision = self.scheduler.result(trial, self.ran[trial], value)
        if decision.action is Action.CONTINUE and self.ran[trial] == 9:
            self.scheduler.complete(trial)
        if pick % 23 == 0:
            self.scheduler.fail(trial)
        self.log.append((trial, decision, self.scheduler.resume(), self.scheduler.groups()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(SCHEDULER_OPTIONS)), st.lists(st.integers(0, 1000), max_size=100),
       st.lists(st.integers(0, 1000), max_size=100))
def test_state_round_trips_mid_sweep(name, before, after):
    one = _Sim(_fresh(name))
    for pick in before:
        one.step(pick)
    saved = json.loads(json.dumps(one.scheduler.state(), allow_nan=False))
    two = _Sim.__new__(_Sim)
    two.scheduler, two.ran, two.log = _fresh(name), dict(one.ran), []
    two.scheduler.restore(saved)
    assert two.scheduler.state() == one.scheduler.state()
    one.log.clear()
    for pick in after:
        one.step(pick)
        two.step(pick)
    assert one.log == two.log and one.scheduler.rungs() == two.scheduler.rungs()
    assert one.scheduler.state() == two.scheduler.state()


def test_restore_refuses_another_schedulers_state():
    with pytest.raises(ValueError, match="state of a 'asha' scheduler, not 'fifo'"):
        make_scheduler("fifo", mode="max", max_iterations=3).restore(_fresh("asha").state())
    state = _fresh("median").state()
    with pytest.raises(ValueError, match="format"):
        _fresh("median").restore({**state, "format": 1})


GOOD = {"grace_period": 1, "reduction_factor": 3, "brackets": 2, "seed": 0, "num_trials": 9,
        "min_samples_required": 2, "perturbation_interval": 2, "quantile_fraction": 0.25,
        "resample_probability": 0.5, "hyperparam_mutations": {"lr": {"low": 0.001, "high": 0.1, "log": True}}}
BAD = {"grace_period": [0, -1, "3", 2.5, True, 28], "reduction_factor": [1, 0.5, "x", math.inf, False],
       "brackets": [0, 1.5], "seed": [-1, "s", 2**33], "num_trials": [0, "9"], "min_samples_required": [0, "2"],
       "perturbation_interval": [0, 1.5, 27], "quantile_fraction": [0.6, -0.1, "q"], "resample_probability": [1.5, -1],
       "hyperparam_mutations": [{}, [], {"lr": {"low": 1, "high": 0}}, {"lr": {"values": []}},
                                {"lr": {"factor": [0]}}, {"lr": {"low": 0, "high": 1, "log": True}}, {"lr": 3}]}


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(SCHEDULER_OPTIONS)), st.data())
def test_options_problems_names_every_bad_option_at_once(name, data):
    known = sorted(SCHEDULER_OPTIONS[name])
    bad = data.draw(st.sets(st.sampled_from(known))) if known else set()
    options, expected = {}, set()
    for option in known:
        if option in bad:
            value = data.draw(st.sampled_from([v for v in BAD[option] if v is not None]))
            options[option] = value
            where = f"spec.scheduler.options.{option}"
            expected.add(f"{where}.lr" if isinstance(value, dict) and value else where)
        elif option == "hyperparam_mutations" or data.draw(st.booleans()):
            options[option] = GOOD[option]
    for extra in data.draw(st.sets(st.sampled_from(["speed", "eta", "grace"]), max_size=2)):
        options[extra] = 1
        expected.add(f"spec.scheduler.options.{extra}")
    problems = options_problems(name, options, max_iterations=27)
    assert {field for field, _ in problems} == expected
    assert len(problems) == len(expected)
    if expected:
        with pytest.raises(ValueError) as raised:
            make_scheduler(name, mode="max", max_iterations=27, **options)
        assert all(field in str(raised.value) for field in expected)
    else:
        make_scheduler(name, mode="max", max_iterations=27, **options)


def test_options_names_defaults_and_old_names():
    assert options_problems("nope", {}) == [("spec.scheduler.name",
                                             "must be one of fifo, asha, hyperband, sh, median, pbt")]
    assert options_problems(3, {}, field="x")[0][0] == "x.name"
    assert options_problems("asha", [1]) == [("spec.scheduler.options", "must be an object")]
    assert options_problems("pbt", {}) == [("spec.scheduler.options.hyperparam_mutations",
                                            "required: parameter -> {values: [...]}, {low, high, log?, factor?} or "
                                            "{factor: [...]}")]
    assert options_problems("sh", {"num_trials": None, "grace_period": 2}) == []  # null: the default
    # Older names are still read, but not both at once.
    pbt = make_scheduler("pbt", mode="min", max_iterations=9, seed=7, interval=3, mutations={"a": {"factor": [2]}})
    assert pbt.perturbation_interval == 3 and pbt.hyperparam_mutations == {"a": {"factor": [2]}}
    assert options_problems("median", {"min_samples": 2, "min_samples_required": 2}) == [
        ("spec.scheduler.options.min_samples", "the old name of min_samples_required, which is given too: give one")]
    assert make_scheduler("median", mode="max", max_iterations=9, min_samples=4).min_samples_required == 4
    for options in SCHEDULER_OPTIONS.values():
        for kind, default, description in options.values():
            assert kind in {int, float, dict} and description
            if default is not None:
                assert isinstance(default, kind)
    with pytest.raises(ValueError, match="mode"):
        make_scheduler("fifo", mode="best", max_iterations=9)
    with pytest.raises(ValueError, match="grace_period"):
        ASHA(max_iterations=3, grace_period=4)
