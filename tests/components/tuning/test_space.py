"""The search space: every bad field named at once, conditions (chained, never cyclic), substitution into a
trainable's spec, and grids (their ends, their size with conditions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.tuning.space import (
    active,
    grid_combinations,
    grid_points,
    grid_problem,
    grid_size,
    is_active,
    normalize_space,
    order,
    placeholders,
    size_of_grid,
    space_problems,
    substitute,
)

SPACE = {
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "dropout": {"type": "uniform", "low": 0.0, "high": 0.5},
    "width": {"type": "int", "low": 32, "high": 256, "step": 32},
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "momentum": {"type": "uniform", "low": 0.5, "high": 0.99, "when": {"param": "optimizer", "in": ["sgd"]}},
    "nesterov": {"type": "choice", "values": [True, False], "when": {"param": "optimizer", "in": ["sgd"]}},
    "dampening": {"type": "uniform", "low": 0.0, "high": 0.2, "when": {"param": "nesterov", "in": [False]}},
}

CHOICES = ["a", "b", 2, 2.5, True, None]  # no two equal in Python (True == 1, so no 1 here)


@st.composite
def spaces(draw, max_parameters: int = 4, max_ints: int = 5, max_choices: int = 3):
    """Valid spaces: every type, some parameters conditional on an earlier choice or int (chains included),
    declared in either order."""
    space: dict = {}
    for index in range(draw(st.integers(1, max_parameters))):
        kind = draw(st.sampled_from(["uniform", "loguniform", "int", "choice"]))
        if kind == "uniform":
            low = draw(st.floats(-10, 10))
            definition = {"type": kind, "low": low, "high": low + draw(st.floats(1e-3, 10)),
                          "grid": draw(st.integers(2, 4))}
        elif kind == "loguniform":
            low = draw(st.floats(1e-5, 1))
            definition = {"type": kind, "low": low, "high": low * draw(st.floats(1.01, 1e3))}
        elif kind == "int":
            log = draw(st.booleans())
            low = draw(st.integers(1, 5)) if log else draw(st.integers(-5, 5))
            step = 1 if log else draw(st.integers(1, 3))
            definition = {"type": kind, "low": low, "high": low + step * draw(st.integers(0, max_ints - 1)),
                          "step": step, "log": log}
        else:
            definition = {"type": kind, "values": draw(st.lists(st.sampled_from(CHOICES), min_size=1,
                                                               max_size=max_choices, unique=True))}
        parents = [name for name, other in space.items() if other["type"] in {"choice", "int"}]
        if parents and draw(st.booleans()):
            parent = draw(st.sampled_from(parents))
            taken = grid_points(normalize_space({parent: {k: v for k, v in space[parent].items() if k != "when"}}))
            values = draw(st.lists(st.sampled_from(taken[parent]), min_size=1, unique=True))
            definition["when"] = {"param": parent, "in": values}
        space[f"p{index}"] = definition
    return dict(reversed(space.items())) if draw(st.booleans()) else space


def test_a_valid_space_has_no_problems_and_gets_defaults():
    assert space_problems(SPACE) == []
    normalized = normalize_space({"lr": SPACE["lr"], "width": SPACE["width"], "d": {"type": "uniform", "low": 0,
                                                                                     "high": 1}})
    assert normalized["lr"]["grid"] == 3 and normalized["width"]["log"] is False
    assert normalize_space({"n": {"type": "int", "low": 0, "high": 3}})["n"] == {
        "type": "int", "low": 0, "high": 3, "step": 1, "log": False}
    assert normalized["d"]["low"] == 0.0 and isinstance(normalized["d"]["low"], float)


def test_every_bad_field_is_named_at_once():
    bad = {
        "lr": {"type": "loguniform", "low": 0, "high": 1e-1},
        "dropout": {"type": "uniform", "low": 0.5, "high": 0.5},
        "width": {"type": "int", "low": 1.5, "high": 8, "step": 0, "extra": 1},
        "depth": {"type": "int", "low": 1, "high": 8, "log": True, "step": 2, "grid": 1},
        "hidden": {"type": "uniform", "high": 1.0},
        "opt": {"type": "choice", "values": []},
        "act": {"type": "choice", "values": ["relu", "relu", {"x": 1}]},
        "flags": {"type": "choice", "values": [1, True, 1.0]},
        "mom": {"type": "uniform", "low": 0.1, "high": 0.9, "when": {"param": "nope", "in": [1]}},
        "beta": {"type": "uniform", "low": 0.1, "high": 0.9, "when": {"param": "lr", "in": [1]}},
        "gamma": {"type": "uniform", "low": 0.1, "high": 0.9, "when": {"param": "width2", "in": [3, 4, True]}},
        "width2": {"type": "int", "low": 0, "high": 8, "step": 2},
        "delta": {"type": "uniform", "low": 0, "high": 1, "when": {"param": "act2", "in": []}},
        "act2": {"type": "choice", "values": ["x"], "when": {"param": "act2", "in": ["x"]}},
        "eps": {"type": "uniform", "low": 0, "high": 1, "when": {"param": "width2"}},
        "kind": {"type": "normal"},
        "9bad": {"type": "uniform", "low": 0, "high": 1},
        "nan": {"type": "uniform", "low": float("nan"), "high": float("inf")},
        "flag": {"type": "uniform", "low": True, "high": 1},
        "notdict": 3,
        "c1": {"type": "choice", "values": [1, 2], "when": {"param": "c2", "in": [1]}},
        "c2": {"type": "choice", "values": [1, 2], "when": {"param": "c1", "in": [3]}},
    }
    problems = space_problems(bad)
    assert sorted(field for field, _ in problems) == sorted([
        "spec.space.lr.low", "spec.space.dropout.high",
        "spec.space.width.low", "spec.space.width.step", "spec.space.width.extra",
        "spec.space.depth.step", "spec.space.depth.grid", "spec.space.hidden.low",
        "spec.space.opt.values", "spec.space.act.values.1", "spec.space.act.values.2",
        "spec.space.flags.values.1", "spec.space.flags.values.2",
        "spec.space.mom.when.param", "spec.space.beta.when.param",
        "spec.space.gamma.when.in.0", "spec.space.gamma.when.in.2",
        "spec.space.delta.when.in", "spec.space.act2.when.param", "spec.space.eps.when",
        "spec.space.kind.type", "spec.space.9bad", "spec.space.nan.low", "spec.space.nan.high",
        "spec.space.flag.low", "spec.space.notdict",
        "spec.space.c1.when.param", "spec.space.c2.when.in.0", "spec.space.c2.when.param",
    ])
    messages = dict(problems)
    assert messages["spec.space.gamma.when.in.0"] == "'width2' never takes 3"
    assert messages["spec.space.act2.when.param"] == "a parameter cannot depend on itself"
    assert messages["spec.space.c1.when.param"] == "conditions form a cycle (c1 -> c2 -> c1)"
    assert space_problems([]) == [("spec.space", "must be an object of parameter name: definition")]
    assert space_problems({}, "x") == [("x", "needs at least one parameter")]
    with pytest.raises(ValueError, match="spec.space.lr.low"):
        normalize_space(bad)


def test_at_most_64_parameters():
    space = {f"p{index}": {"type": "uniform", "low": 0, "high": 1} for index in range(65)}
    assert space_problems(space) == [("spec.space", "at most 64 parameters (got 65)")]
    assert space_problems(dict(list(space.items())[:64])) == []
    assert space_problems({"a" * 64: {"type": "uniform", "low": 0, "high": 1}}) == []
    assert [field for field, _ in space_problems({"a" * 65: {"type": "uniform", "low": 0, "high": 1}})] == [
        "spec.space." + "a" * 65]


def test_conditions_must_not_form_a_cycle():
    cycle = {"a": {"type": "choice", "values": [1, 2], "when": {"param": "c", "in": [1]}},
             "b": {"type": "choice", "values": [1, 2], "when": {"param": "a", "in": [1]}},
             "c": {"type": "choice", "values": [1, 2], "when": {"param": "b", "in": [1]}},
             "d": {"type": "choice", "values": [1, 2], "when": {"param": "a", "in": [1]}}}  # hangs off the cycle
    assert space_problems(cycle) == [
        ("spec.space.a.when.param", "conditions form a cycle (a -> c -> b -> a)"),
        ("spec.space.b.when.param", "conditions form a cycle (b -> a -> c -> b)"),
        ("spec.space.c.when.param", "conditions form a cycle (c -> b -> a -> c)")]
    itself = {"a": {"type": "choice", "values": [1], "when": {"param": "a", "in": [1]}}}
    assert space_problems(itself) == [("spec.space.a.when.param", "a parameter cannot depend on itself")]
    on_float = {"a": {"type": "uniform", "low": 0, "high": 1},
                "b": {"type": "uniform", "low": 0, "high": 1, "when": {"param": "a", "in": [0.5]}}}
    assert space_problems(on_float) == [("spec.space.b.when.param", "'a' must be a choice or int parameter")]


def test_active_parameters_follow_their_conditions_parents_first():
    assert active(SPACE, {}) == ["lr", "dropout", "width", "optimizer"]
    assert active(SPACE, {"optimizer": "adam"}) == ["lr", "dropout", "width", "optimizer"]
    assert active(SPACE, {"optimizer": "sgd"}) == ["lr", "dropout", "width", "optimizer", "momentum", "nesterov"]
    assert active(SPACE, {"optimizer": "sgd", "nesterov": False})[-1] == "dampening"
    # A chained condition: nesterov is inactive under adam, so dampening is too, whatever nesterov says.
    assert "dampening" not in active(SPACE, {"optimizer": "adam", "nesterov": False})
    # Children declared before their parents still come after them.
    backwards = dict(reversed(SPACE.items()))
    assert order(backwards) == ["optimizer", "nesterov", "dampening", "momentum", "width", "dropout", "lr"]
    assert active(backwards, {"optimizer": "sgd", "nesterov": False}) == order(backwards)


def test_conditions_match_json_values_not_python_equality():
    space = {"flag": {"type": "choice", "values": [True, False]},
             "n": {"type": "int", "low": 0, "high": 3},
             "x": {"type": "uniform", "low": 0, "high": 1, "when": {"param": "flag", "in": [True]}},
             "y": {"type": "uniform", "low": 0, "high": 1, "when": {"param": "n", "in": [0, 2]}}}
    assert space_problems(space) == []
    assert is_active(space, "x", {"flag": True}) and not is_active(space, "x", {"flag": 1})
    assert is_active(space, "y", {"n": 0}) and not is_active(space, "y", {"n": False})
    assert not is_active(space, "y", {"n": 1})
    with_one = {**space, "z": {"type": "uniform", "low": 0, "high": 1, "when": {"param": "flag", "in": [1]}}}
    assert space_problems(with_one) == [("spec.space.z.when.in.0", "'flag' never takes 1")]


def test_substitute_keeps_types_and_refuses_unknown_names():
    template = {"workload": "mlp-digits", "lr": "{{lr}}", "epochs": "{{ epochs }}", "name": "w{{width}}-{{opt}}",
                "layers": ["{{width}}", 10, {"act": "{{act}}"}], "keep": 3, "none": None, "nested": "{{sizes}}",
                "flag": "{{flag}}", "nothing": "{{nothing}}"}
    params = {"lr": 0.01, "epochs": 4, "width": 64, "opt": "sgd", "act": "relu", "sizes": [1, 2], "flag": False,
              "nothing": None}
    result = substitute(template, params)
    assert result == {"workload": "mlp-digits", "lr": 0.01, "epochs": 4, "name": "w64-sgd",
                      "layers": [64, 10, {"act": "relu"}], "keep": 3, "none": None, "nested": [1, 2],
                      "flag": False, "nothing": None}
    assert type(result["lr"]) is float and type(result["epochs"]) is int and result["flag"] is False
    assert result["nested"] is not params["sizes"]  # a copy: editing the spec leaves the trial's params alone
    assert placeholders(template) == {"lr", "epochs", "width", "opt", "act", "sizes", "flag", "nothing"}
    with pytest.raises(KeyError, match="momentum"):
        substitute({"m": "{{momentum}}"}, params)
    with pytest.raises(KeyError, match="momentum"):
        substitute({"m": ["x-{{momentum}}"]}, params)
    assert template["lr"] == "{{lr}}" and template["layers"][0] == "{{width}}"  # the template is untouched
    assert substitute("{{width}}{{width}}", params) == "6464"


def test_grids_reach_both_ends():
    space = normalize_space({"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
                             "d": {"type": "uniform", "low": 0.0, "high": 0.5, "grid": 6},
                             "w": {"type": "int", "low": 1, "high": 4},
                             "big": {"type": "int", "low": 0, "high": 1000, "grid": 5},
                             "stepped": {"type": "int", "low": 0, "high": 10, "step": 3, "grid": 3},
                             "logint": {"type": "int", "low": 1, "high": 1000, "log": True, "grid": 4},
                             "o": {"type": "choice", "values": ["a", "b"]}})
    points = grid_points(space)
    assert points["lr"] == pytest.approx([1e-4, 1e-3, 1e-2]) and points["lr"][-1] == 1e-2
    assert points["d"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert points["w"] == [1, 2, 3, 4] and points["big"] == [0, 250, 500, 750, 1000]
    assert points["stepped"] == [0, 6, 9]  # on the step: 0 3 6 9, low and the highest on the step kept
    assert points["logint"] == [1, 10, 100, 1000]
    assert size_of_grid(space) == grid_size(space) == 3 * 6 * 4 * 5 * 3 * 4 * 2
    assert grid_problem(space) is None
    assert "give it a grid" in grid_problem(normalize_space({"w": {"type": "int", "low": 0, "high": 99}}))
    assert grid_points(normalize_space({"w": {"type": "int", "low": 0, "high": 2, "grid": 5}}))["w"] == [0, 1, 2]
    huge = {f"p{index}": {"type": "uniform", "low": 0, "high": 1, "grid": 10} for index in range(6)}
    assert "1000000 combinations" in grid_problem(normalize_space(huge))


def test_a_conditional_grid_counts_only_active_combinations():
    space = normalize_space(SPACE)
    # adam: 3 lr * 3 dropout * 8 width; sgd adds momentum (3) and nesterov, which under false adds dampening (3).
    base = 3 * 3 * 8
    assert size_of_grid(space) == base * (1 + 3 * (1 + 3))
    combinations = grid_combinations(space)
    assert len(combinations) == size_of_grid(space)
    assert all(list(combination) == active(space, combination) for combination in combinations)
    assert grid_problem(space) is None
    unreachable = normalize_space({"n": {"type": "int", "low": 0, "high": 100, "grid": 3},
                                   "x": {"type": "choice", "values": [1, 2], "when": {"param": "n", "in": [7]}}})
    assert grid_points(unreachable)["n"] == [0, 50, 100] and size_of_grid(unreachable) == 3


@given(spaces())
@settings(max_examples=60, deadline=None, derandomize=True)
def test_generated_spaces_are_valid_and_their_grids_are_exact(space):
    assert space_problems(space) == []
    space = normalize_space(space)
    combinations = grid_combinations(space)
    assert len(combinations) == size_of_grid(space)
    assert len({repr(sorted(combination.items())) for combination in combinations}) == len(combinations)
    points = grid_points(space)
    for combination in combinations:
        assert list(combination) == active(space, combination)  # exactly the active ones, parents first
        assert all(any(value is point or value == point for point in points[name])
                   for name, value in combination.items())


@settings(derandomize=True)
@given(st.sampled_from(["uniform", "loguniform"]), st.floats(min_value=1e-6, max_value=1e6),
       st.floats(min_value=1.000001, max_value=1e6), st.integers(min_value=2, max_value=20))
def test_float_grids_are_sorted_inside_the_bounds(kind, low, ratio, count):
    high = low * ratio
    definition = {"x": {"type": kind, "low": low, "high": high, "grid": count}}
    assert space_problems(definition) == []
    values = grid_points(normalize_space(definition))["x"]
    assert len(values) == count and values[0] == low and values[-1] == high
    assert values == sorted(values)


@settings(derandomize=True)
@given(st.integers(-100, 100), st.integers(0, 200), st.integers(1, 7), st.integers(2, 40))
def test_int_grids_are_on_the_step_and_reach_both_ends(low, span, step, count):
    space = normalize_space({"n": {"type": "int", "low": low, "high": low + span, "step": step, "grid": count}})
    values = grid_points(space)["n"]
    every = list(range(low, low + span + 1, step))
    assert values == sorted(set(values)) and set(values) <= set(every)
    assert values[0] == every[0] and values[-1] == every[-1] and len(values) == min(count, len(every))


def test_bad_numbers_are_refused():
    for value in (float("nan"), float("inf"), -float("inf"), True, "1", None):
        fields = [field for field, _ in space_problems({"x": {"type": "uniform", "low": value, "high": 2}})]
        assert fields == ["spec.space.x.low"], value
    assert space_problems({"x": {"type": "choice", "values": [float("nan")]}}) == [
        ("spec.space.x.values.0", "must be a string, a finite number, true, false or null")]


def test_the_space_module_does_not_import_optuna():
    root = Path(__file__).resolve().parents[3]
    code = "import sys, components.tuning.space; assert 'optuna' not in sys.modules, 'optuna imported'"
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env)


def test_a_hostile_choice_list_is_refused_in_linear_time():
    """50,000 choice values (300 KB of JSON, under the body limit) were compared pairwise, 1.25e9 comparisons that
    held a server thread for minutes (tests/platform/api/test_hostile_input.py found it): now one problem, at once,
    and duplicates are found with a set (1, 1.0 and true still collide)."""
    import time

    started = time.monotonic()
    problems = space_problems({"lr": {"type": "choice", "values": list(range(50_000))}})
    assert problems == [("spec.space.lr.values", "at most 256 values (got 50000)")]
    assert time.monotonic() - started < 5
    repeats = space_problems({"x": {"type": "choice", "values": [1, 1.0, True, "1", None, None, [1]]}})
    assert [field for field, _ in repeats] == ["spec.space.x.values.1", "spec.space.x.values.2",
                                               "spec.space.x.values.5", "spec.space.x.values.6"]
