"""The search space: every bad field named at once, conditions, substitution into a trainable's spec, grids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.tuning.space import (
    active,
    grid_points,
    grid_problem,
    grid_size,
    normalize_space,
    placeholders,
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


def test_a_valid_space_has_no_problems_and_gets_defaults():
    assert space_problems(SPACE) == []
    normalized = normalize_space({"lr": SPACE["lr"], "width": SPACE["width"]})
    assert normalized["lr"]["grid"] == 3 and normalized["width"]["log"] is False


def test_every_bad_field_is_named_at_once():
    bad = {
        "lr": {"type": "loguniform", "low": 0, "high": 1e-1},
        "dropout": {"type": "uniform", "low": 0.5, "high": 0.5},
        "width": {"type": "int", "low": 1.5, "high": 8, "step": 0, "extra": 1},
        "opt": {"type": "choice", "values": []},
        "act": {"type": "choice", "values": ["relu", "relu", {"x": 1}]},
        "mom": {"type": "uniform", "low": 0.1, "high": 0.9, "when": {"param": "nope", "in": [1]}},
        "kind": {"type": "normal"},
        "9bad": {"type": "uniform", "low": 0, "high": 1},
        "nan": {"type": "uniform", "low": float("nan"), "high": 1},
        "flag": {"type": "uniform", "low": True, "high": 1},
    }
    fields = {field for field, _ in space_problems(bad)}
    assert fields == {"spec.space.lr.low", "spec.space.dropout.high", "spec.space.width.low",
                      "spec.space.width.step", "spec.space.width.extra", "spec.space.opt.values",
                      "spec.space.act.values.2", "spec.space.mom.when.param", "spec.space.kind.type",
                      "spec.space.9bad", "spec.space.nan.low", "spec.space.flag.low"}
    assert space_problems([]) == [("spec.space", "must be an object of parameter name: definition")]
    assert space_problems({}, "x") == [("x", "needs at least one parameter")]
    with pytest.raises(ValueError, match="spec.space.lr.low"):
        normalize_space(bad)


def test_conditions_must_not_form_a_cycle():
    cycle = {"a": {"type": "choice", "values": [1, 2], "when": {"param": "b", "in": [1]}},
             "b": {"type": "choice", "values": [1, 2], "when": {"param": "a", "in": [1]}}}
    assert any("cycle" in message for _, message in space_problems(cycle))
    itself = {"a": {"type": "choice", "values": [1], "when": {"param": "a", "in": [1]}}}
    assert space_problems(itself) == [("spec.space.a.when.param", "a parameter cannot depend on itself")]
    on_float = {"a": {"type": "uniform", "low": 0, "high": 1},
                "b": {"type": "uniform", "low": 0, "high": 1, "when": {"param": "a", "in": [0.5]}}}
    assert space_problems(on_float) == [("spec.space.b.when.param", "'a' must be a choice or int parameter")]


def test_active_parameters_follow_their_conditions_parents_first():
    assert active(SPACE, {"optimizer": "adam"}) == ["lr", "dropout", "width", "optimizer"]
    assert active(SPACE, {"optimizer": "sgd"}) == ["lr", "dropout", "width", "optimizer", "momentum", "nesterov"]
    assert "dampening" in active(SPACE, {"optimizer": "sgd", "nesterov": False})
    # A chained condition: nesterov is inactive under adam, so dampening is too, whatever nesterov says.
    assert "dampening" not in active(SPACE, {"optimizer": "adam", "nesterov": False})


def test_substitute_keeps_types_and_refuses_unknown_names():
    template = {"workload": "mlp-digits", "lr": "{{lr}}", "epochs": "{{ epochs }}", "name": "w{{width}}-x",
                "layers": ["{{width}}", 10], "keep": 3}
    params = {"lr": 0.01, "epochs": 4, "width": 64}
    assert substitute(template, params) == {"workload": "mlp-digits", "lr": 0.01, "epochs": 4, "name": "w64-x",
                                            "layers": [64, 10], "keep": 3}
    assert placeholders(template) == {"lr", "epochs", "width"}
    with pytest.raises(KeyError, match="momentum"):
        substitute({"m": "{{momentum}}"}, params)
    assert template["lr"] == "{{lr}}"  # the template is untouched


def test_grids_reach_both_ends():
    space = normalize_space({"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
                             "d": {"type": "uniform", "low": 0.0, "high": 0.5, "grid": 6},
                             "w": {"type": "int", "low": 1, "high": 4},
                             "big": {"type": "int", "low": 0, "high": 1000, "grid": 5},
                             "o": {"type": "choice", "values": ["a", "b"]}})
    points = grid_points(space)
    assert points["lr"] == pytest.approx([1e-4, 1e-3, 1e-2])
    assert points["d"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert points["w"] == [1, 2, 3, 4] and points["big"] == [0, 250, 500, 750, 1000]
    assert grid_size(space) == 3 * 6 * 4 * 5 * 2
    assert grid_problem(space) is None
    assert "give it a grid" in grid_problem(normalize_space({"w": {"type": "int", "low": 0, "high": 99}}))
    assert "conditional" in grid_problem(normalize_space(SPACE))


@given(st.floats(min_value=-1e6, max_value=1e6), st.floats(min_value=1e-6, max_value=1e6),
       st.integers(min_value=2, max_value=20))
def test_uniform_grids_are_sorted_inside_the_bounds(low, width, count):
    high = low + width
    assert space_problems({"x": {"type": "uniform", "low": low, "high": high, "grid": count}}) == []
    values = grid_points(normalize_space({"x": {"type": "uniform", "low": low, "high": high, "grid": count}}))["x"]
    assert len(values) == count and values[0] == low and values[-1] == high
    assert values == sorted(values)
