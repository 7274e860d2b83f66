"""Searchers: which configurations a sweep tries, through Optuna's samplers and its ask/tell API.

Optuna's samplers are used as they are (random, grid, TPE); this module only maps a sweep's search space
(:mod:`components.tuning.space`) onto ``trial.suggest_*`` calls, keeps a JSON log of what was asked and told so a
restarted tune attempt can rebuild the study, and stops at the trial budget. Imported where the tune job runs
(Optuna is a node-side dependency; the control plane never imports it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from components.tuning.space import grid_points, grid_problem, grid_size, is_active, normalize_space, order

SEARCHERS = ("random", "grid", "tpe")


@dataclass
class Record:
    """One trial the searcher proposed: its number, params and, once told, its value and state."""

    number: int
    params: dict[str, Any]
    value: float | None = None
    state: str = "running"  # running, complete, pruned, failed
    intermediate: dict[int, float] = field(default_factory=dict)


class Searcher:
    """Proposes trial configurations (``ask``) and learns from their results (``tell``)."""

    def __init__(self, name: str, space: dict[str, Any], *, mode: str = "max", seed: int = 0, budget: int = 16):
        import optuna

        if name not in SEARCHERS:
            raise ValueError(f"unknown searcher {name!r}; one of {', '.join(SEARCHERS)}")
        if mode not in {"min", "max"}:
            raise ValueError(f"mode must be min or max, got {mode!r}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.name, self.mode, self.seed = name, mode, int(seed)
        self.space = normalize_space(space)
        self.budget = int(budget)
        if name == "grid":
            if problem := grid_problem(self.space):
                raise ValueError(problem)
            self.budget = min(self.budget, grid_size(self.space))
        self.records: dict[int, Record] = {}
        self._trials: dict[int, Any] = {}
        self.study = self._new_study()

    def _sampler(self):
        import optuna

        if self.name == "random":
            return optuna.samplers.RandomSampler(seed=self.seed)
        if self.name == "grid":
            return _GridSampler(grid_points(self.space), seed=self.seed)
        conditional = any("when" in definition for definition in self.space.values())
        return optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=conditional,
                                          n_startup_trials=min(10, max(2, self.budget // 4)))

    def _new_study(self):
        import warnings

        import optuna

        with warnings.catch_warnings():  # multivariate/group are "experimental" in Optuna: used as documented
            warnings.simplefilter("ignore")
            return optuna.create_study(direction="maximize" if self.mode == "max" else "minimize",
                                       sampler=self._sampler())

    def _suggest(self, trial) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for name in order(self.space):  # parents first: a condition is decided before what depends on it
            if not is_active(self.space, name, params):
                continue
            definition = self.space[name]
            kind = definition["type"]
            if kind == "choice":
                params[name] = trial.suggest_categorical(name, definition["values"])
            elif kind == "int":
                params[name] = trial.suggest_int(name, definition["low"], definition["high"],
                                                 step=definition.get("step", 1), log=definition.get("log", False))
            else:
                params[name] = trial.suggest_float(name, definition["low"], definition["high"],
                                                   log=kind == "loguniform")
        return params

    def ask(self) -> tuple[int, dict[str, Any]] | None:
        """A new trial's number and params; None once ``budget`` trials were asked."""
        if len(self.records) >= self.budget:
            return None
        trial = self.study.ask()
        params = self._suggest(trial)
        self._trials[trial.number] = trial
        self.records[trial.number] = Record(trial.number, params)
        return trial.number, dict(params)

    def report(self, number: int, step: int, value: float) -> None:
        """An intermediate result of a running trial."""
        record = self.records[number]
        record.intermediate[int(step)] = float(value)
        trial = self._trials.get(number)
        if trial is not None:
            trial.report(float(value), int(step))

    def tell(self, number: int, value: float | None, *, state: str = "complete") -> None:
        """A trial ended: ``complete`` with its final value, ``pruned`` (stopped early; its best value counts for
        TPE through the last intermediate value) or ``failed``."""
        from optuna.trial import TrialState

        record = self.records[number]
        if record.state != "running":
            return
        states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
        if state not in states:
            raise ValueError(f"state must be one of {', '.join(states)}")
        if state == "complete" and value is None:
            state = "failed"
        record.state, record.value = state, (float(value) if value is not None else None)
        self.study.tell(number, record.value if state == "complete" else None, state=states[state])

    def best(self) -> tuple[int, dict[str, Any], float] | None:
        """(number, params, value) of the best completed trial so far."""
        done = [record for record in self.records.values() if record.state == "complete" and record.value is not None]
        if not done:
            return None
        pick = max if self.mode == "max" else min
        record = pick(done, key=lambda record: record.value)
        return record.number, dict(record.params), record.value

    def pending(self) -> list[tuple[int, dict[str, Any]]]:
        """Trials asked but not told (to run again after a restart)."""
        return [(record.number, dict(record.params)) for record in self.records.values() if record.state == "running"]

    # -- resuming --------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """A JSON log of every trial, enough to rebuild the searcher (:meth:`restore`)."""
        return {"searcher": self.name, "mode": self.mode, "seed": self.seed, "budget": self.budget,
                "trials": [{"number": r.number, "params": r.params, "value": r.value, "state": r.state,
                            "intermediate": {str(k): v for k, v in r.intermediate.items()}}
                           for r in sorted(self.records.values(), key=lambda r: r.number)]}

    def restore(self, state: dict[str, Any]) -> None:
        """Rebuild the study from :meth:`state`: ended trials are added to it as they ended; running ones are
        asked again (same params, same numbers in order) so :meth:`pending` lists them."""
        import optuna
        from optuna.trial import TrialState

        self.study = self._new_study()
        self.records, self._trials = {}, {}
        distributions = self._distributions()
        states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
        for entry in sorted(state.get("trials", []), key=lambda entry: entry["number"]):
            params = dict(entry["params"])
            record = Record(int(entry["number"]), params, entry.get("value"), entry.get("state", "running"),
                            {int(k): float(v) for k, v in (entry.get("intermediate") or {}).items()})
            used = {name: distributions[name] for name in params}
            if record.state in states:
                self.study.add_trial(optuna.trial.create_trial(
                    params=params, distributions=used, state=states[record.state],
                    value=record.value if record.state == "complete" else None,
                    intermediate_values=record.intermediate))
            else:  # asked again with the same params, through Optuna's queue
                self.study.enqueue_trial(params, skip_if_exists=False)
                trial = self.study.ask()
                self._suggest(trial)
                self._trials[trial.number] = trial
                record.number = trial.number
            self.records[record.number] = record

    def _distributions(self) -> dict[str, Any]:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        found = {}
        for name, definition in self.space.items():
            kind = definition["type"]
            if kind == "choice":
                found[name] = CategoricalDistribution(definition["values"])
            elif kind == "int":
                found[name] = IntDistribution(definition["low"], definition["high"], step=definition.get("step", 1),
                                              log=definition.get("log", False))
            else:
                found[name] = FloatDistribution(definition["low"], definition["high"], log=kind == "loguniform")
        return found


def _grid_sampler_class():
    import optuna

    class GridSampler(optuna.samplers.GridSampler):
        """Optuna's grid sampler, less its ``study.stop()`` once the grid is done: that call is only allowed inside
        ``study.optimize``, and an ask/tell sweep stops at the grid's size itself (:attr:`Searcher.budget`)."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return GridSampler


def _GridSampler(*args, **kwargs):  # noqa: N802 - a class, built on first use so importing this module stays cheap
    return _grid_sampler_class()(*args, **kwargs)


def make_searcher(name: str, space: dict[str, Any], *, mode: str = "max", seed: int = 0,
                  budget: int = 16) -> Searcher:
    return Searcher(name, space, mode=mode, seed=seed, budget=budget)


logging.getLogger("optuna").setLevel(logging.WARNING)
