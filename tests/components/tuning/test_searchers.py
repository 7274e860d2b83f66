"""Searchers through Optuna's samplers: parameters inside their bounds and of the right types, conditional ones
only when active, the same seed the same trials, a grid that ends at its size, TPE learning, and a restored
searcher that carries on."""

from __future__ import annotations

import math

import pytest

from components.tuning.searchers import Searcher
from components.tuning.space import is_active

SPACE = {
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
    "width": {"type": "int", "low": 16, "high": 128, "step": 16},
    "optimizer": {"type": "choice", "values": ["sgd", "adam"]},
    "momentum": {"type": "uniform", "low": 0.5, "high": 0.99, "when": {"param": "optimizer", "in": ["sgd"]}},
}


def objective(params: dict) -> float:
    """Best at lr = 1e-2 (a bowl in log space); a space without lr scores by width."""
    if "lr" not in params:
        return float(params.get("w", 0))
    return -((math.log10(params["lr"]) + 2) ** 2)


def run(searcher: Searcher, tell_until: int | None = None) -> list[dict]:
    asked = []
    while (proposal := searcher.ask()) is not None:
        number, params = proposal
        asked.append(params)
        if tell_until is None or len(asked) <= tell_until:
            searcher.tell(number, objective(params))
    return asked


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_parameters_are_inside_bounds_of_the_right_types_and_conditional(name):
    for params in run(Searcher(name, SPACE, seed=3, budget=24)):
        assert 1e-4 <= params["lr"] <= 1e-1 and isinstance(params["lr"], float)
        assert params["width"] in range(16, 129, 16) and isinstance(params["width"], int)
        assert params["optimizer"] in {"sgd", "adam"}
        assert ("momentum" in params) == (params["optimizer"] == "sgd")
        assert all(is_active(SPACE, key, params) for key in params)
        if "momentum" in params:
            assert 0.5 <= params["momentum"] <= 0.99


@pytest.mark.parametrize("name", ["random", "grid", "tpe"])
def test_the_same_seed_gives_the_same_trials(name):
    space = SPACE if name != "grid" else {"lr": SPACE["lr"], "optimizer": SPACE["optimizer"]}
    first = run(Searcher(name, space, seed=7, budget=12))
    assert first == run(Searcher(name, space, seed=7, budget=12))
    assert first != run(Searcher(name, space, seed=8, budget=12)) or name == "grid"


def test_the_grid_tries_every_point_once_then_stops():
    space = {"lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1}, "optimizer": SPACE["optimizer"]}
    searcher = Searcher("grid", space, seed=0, budget=100)
    assert searcher.budget == 6
    asked = run(searcher)
    assert len(asked) == 6 and len({tuple(sorted(p.items())) for p in asked}) == 6
    with pytest.raises(ValueError, match="conditional"):
        Searcher("grid", SPACE)


def test_tpe_finds_a_better_region_than_random_on_average():
    def best(name: str, seed: int) -> float:
        searcher = Searcher(name, {"lr": SPACE["lr"]}, seed=seed, budget=40)
        run(searcher)
        return searcher.best()[2]

    tpe = [best("tpe", seed) for seed in range(3)]
    assert all(value > -0.05 for value in tpe), tpe  # within ~0.2 decades of the optimum on every seed
    assert sum(tpe) >= sum(best("random", seed) for seed in range(3)) - 1e-3


def test_a_restored_searcher_carries_on_and_reruns_what_was_running():
    searcher = Searcher("tpe", SPACE, seed=1, budget=20)
    asked = run(searcher, tell_until=15)
    assert len(asked) == 20
    restored = Searcher("tpe", SPACE, seed=1, budget=24)
    restored.restore(searcher.state())
    pending = restored.pending()
    assert [params for _, params in pending] == asked[15:]
    assert restored.best() == searcher.best()
    for number, params in pending:
        restored.tell(number, objective(params))
    more = run(restored)
    assert len(more) == 4 and restored.ask() is None
    grid = Searcher("grid", {"optimizer": SPACE["optimizer"], "w": {"type": "int", "low": 1, "high": 3}}, budget=6)
    first = run(grid, tell_until=3)[:3]
    again = Searcher("grid", {"optimizer": SPACE["optimizer"], "w": {"type": "int", "low": 1, "high": 3}}, budget=6)
    again.restore({**grid.state(), "trials": grid.state()["trials"][:3]})
    rest = run(again)
    assert sorted(map(str, first + rest)) == sorted(map(str, [{"optimizer": o, "w": w} for o in ("sgd", "adam")
                                                              for w in (1, 2, 3)]))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown searcher"):
        Searcher("bayes", SPACE)
    with pytest.raises(ValueError, match="mode"):
        Searcher("random", SPACE, mode="up")
    with pytest.raises(ValueError, match="spec.space"):
        Searcher("random", {"lr": {"type": "uniform", "low": 1, "high": 0}})
