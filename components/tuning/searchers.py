"""Searchers: which configurations a sweep tries, through Optuna's samplers and its ask/tell API.

Optuna's samplers are used as they are (random, grid, TPE); this module only maps a sweep's search space
(:mod:`components.tuning.space`) onto ``trial.suggest_*`` calls, keeps a JSON log of what was asked and told so a
restarted tune attempt can rebuild the study, and stops at the trial budget. Imported where the tune job runs
(Optuna is a node-side dependency; the control plane never imports this module).

Determinism: a searcher is a function of its seed and the sequence of calls made on it (Optuna's samplers are
seeded, and its study lives in memory), so the same seed and the same tells give the same trials.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from typing import Any

from components.runtime.shared.units import finite_number
from components.tuning.space import (
    grid_combinations,
    grid_points,
    grid_problem,
    is_active,
    is_conditional,
    normalize_space,
    order,
    size_of_grid,
)

SEARCHERS = ("random", "grid", "tpe")
STATES = ("complete", "pruned", "failed")


@dataclass
class Record:
    """One trial the searcher proposed: its number, params and, once told, its value and state."""

    number: int
    params: dict[str, Any]
    value: float | None = None
    state: str = "running"  # running, complete, pruned, failed
    intermediate: dict[int, float] = field(default_factory=dict)


class Searcher:
    """Proposes trial configurations (``ask``) and learns from their results (``tell``).

    - ``random``: Optuna's RandomSampler (seeded).
    - ``grid``: Optuna's GridSampler over :func:`~components.tuning.space.grid_points` (seeded: it walks the grid in
      a shuffled order). A space with conditions is swept over its distinct *active* combinations
      (:func:`~components.tuning.space.grid_combinations`, shuffled with the seed), each handed to Optuna's trial
      queue (``enqueue_trial``), since Optuna's grid would repeat a configuration once per value of every absent
      parameter. Either way the grid ends (``ask`` gives None) after
      :func:`~components.tuning.space.size_of_grid` trials, or at the budget if that comes first.
    - ``tpe``: Optuna's TPESampler, multivariate (``group`` when the space has conditions), with
      ``min(10, max(2, budget // 4))`` random start-up trials.

    ``budget`` is how many trials ``ask`` hands out in all (restored ones included).
    """

    def __init__(self, name: str, space: dict[str, Any], *, mode: str = "max", seed: int = 0, budget: int = 16):
        import optuna

        if name not in SEARCHERS:
            raise ValueError(f"unknown searcher {name!r}; one of {', '.join(SEARCHERS)}")
        if mode not in {"min", "max"}:
            raise ValueError(f"mode must be min or max, got {mode!r}")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budget must be a positive integer, got {budget!r}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.name, self.mode, self.seed = name, mode, int(seed)
        self.space = normalize_space(space)
        self.budget = budget
        self.conditional = is_conditional(self.space)
        self._queue: list[dict[str, Any]] | None = None  # the conditional grid's combinations, in trial order
        if name == "grid":
            if problem := grid_problem(self.space):
                raise ValueError(problem)
            self.budget = min(self.budget, size_of_grid(self.space))
            if self.conditional:
                self._queue = grid_combinations(self.space)
                random.Random(self.seed).shuffle(self._queue)
        self.records: dict[int, Record] = {}
        self._trials: dict[int, Any] = {}
        self.study = self._new_study()

    @property
    def metric_mode(self) -> str:
        return self.mode

    def _sampler(self):
        import optuna

        if self.name == "random" or self._queue is not None:  # the queued grid fixes every param: never sampled
            return optuna.samplers.RandomSampler(seed=self.seed)
        if self.name == "grid":
            return _GridSampler(grid_points(self.space), seed=self.seed)
        return optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=self.conditional,
                                          n_startup_trials=min(10, max(2, self.budget // 4)))

    def _new_study(self):
        import optuna

        with warnings.catch_warnings():  # multivariate/group are "experimental" in Optuna: used as documented
            warnings.simplefilter("ignore")
            return optuna.create_study(direction="maximize" if self.mode == "max" else "minimize",
                                       sampler=self._sampler())

    def _suggest(self, trial) -> dict[str, Any]:
        """The trial's params through ``trial.suggest_*``: parents first, so a condition is decided before what
        depends on it, and only the active ones."""
        params: dict[str, Any] = {}
        for name in order(self.space):
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

    def _ask(self, fixed: dict[str, Any] | None = None):
        with warnings.catch_warnings():  # Optuna's "experimental" notes for multivariate TPE, once per trial
            warnings.simplefilter("ignore")
            if fixed is not None:
                self.study.enqueue_trial(fixed, skip_if_exists=False)
            trial = self.study.ask()
            return trial, self._suggest(trial)

    def ask(self) -> tuple[int, dict[str, Any]] | None:
        """A new trial's number and params; None once ``budget`` trials were asked (for the grid: once the grid
        is done)."""
        if len(self.records) >= self.budget:
            return None
        fixed = self._queue[len(self.records)] if self._queue is not None else None
        trial, params = self._ask(fixed)
        self._trials[trial.number] = trial
        self.records[trial.number] = Record(trial.number, params)
        return trial.number, dict(params)

    def report(self, number: int, step: int, value: float) -> None:
        """An intermediate result of a running trial (``trial.report``); non-finite values are dropped."""
        record = self.records[number]
        if record.state != "running" or not _finite(value):
            return
        record.intermediate[int(step)] = float(value)
        trial = self._trials.get(number)
        if trial is not None:
            trial.report(float(value), int(step))

    def tell(self, number: int, value: float | None, *, state: str = "complete") -> None:
        """A trial ended: ``complete`` with its final value (a missing or non-finite one makes it ``failed``),
        ``pruned`` (stopped early: Optuna takes its last intermediate value) or ``failed``. Telling a trial twice
        changes nothing."""
        from optuna.trial import TrialState

        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        record = self.records[number]
        if record.state != "running":
            return
        if not _finite(value):
            value = None
        if state == "complete" and value is None:
            state = "failed"
        record.state, record.value = state, (float(value) if value is not None else None)
        states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
        self.study.tell(number, record.value if state == "complete" else None, state=states[state])
        self._trials.pop(number, None)

    def best(self) -> tuple[int, dict[str, Any], float] | None:
        """(number, params, value) of the best completed trial so far (the earliest among equals)."""
        done = [record for record in self.records.values() if record.state == "complete" and record.value is not None]
        if not done:
            return None
        pick = max if self.mode == "max" else min
        record = pick(sorted(done, key=lambda record: record.number), key=lambda record: record.value)
        return record.number, dict(record.params), record.value

    def pending(self) -> list[tuple[int, dict[str, Any]]]:
        """Trials asked but not told (after :meth:`restore`: the ones to run again)."""
        return [(record.number, dict(record.params)) for record in self.records.values() if record.state == "running"]

    # -- resuming --------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """A JSON log of every trial, enough to rebuild the searcher (:meth:`restore`)."""
        return {"searcher": self.name, "mode": self.mode, "seed": self.seed, "budget": self.budget,
                "trials": [{"number": r.number, "params": dict(r.params), "value": r.value, "state": r.state,
                            "intermediate": {str(k): v for k, v in sorted(r.intermediate.items())}}
                           for r in sorted(self.records.values(), key=lambda r: r.number)]}

    def restore(self, state: dict[str, Any]) -> None:
        """Rebuild the study from :meth:`state` (of a searcher built with the same name, space and mode).

        Ended trials are added to a new study as they ended (``create_trial``; a pruned one with its last
        intermediate value, as Optuna's own ``tell`` records it); running ones are asked again through Optuna's
        queue with the same params, so :meth:`pending` lists them to run again. Trial numbers are kept, which is
        also what keeps the grid from repeating a point: Optuna's grid sampler gives trial *n* the *n*-th point of
        its (seeded) order, as the conditional grid does from its own list."""
        import optuna
        from optuna.trial import TrialState

        if state.get("searcher", self.name) != self.name or state.get("mode", self.mode) != self.mode:
            raise ValueError(f"cannot restore a {state.get('searcher')}/{state.get('mode')} searcher's log into "
                             f"a {self.name}/{self.mode} one")
        entries = sorted(state.get("trials", []), key=lambda entry: int(entry["number"]))
        if [int(entry["number"]) for entry in entries] != list(range(len(entries))):
            raise ValueError("the searcher's log must number its trials 0, 1, 2, ...")
        self.study = self._new_study()
        self.records, self._trials = {}, {}
        distributions = self._distributions()
        states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
        for entry in entries:
            params = dict(entry["params"])
            record = Record(int(entry["number"]), params, entry.get("value"), entry.get("state", "running"),
                            {int(k): float(v) for k, v in (entry.get("intermediate") or {}).items()})
            if record.state in states:
                value = record.value if record.state == "complete" else None
                if record.state == "pruned" and record.intermediate:
                    value = record.intermediate[max(record.intermediate)]
                self.study.add_trial(optuna.trial.create_trial(
                    params=params, distributions={name: distributions[name] for name in params},
                    state=states[record.state], value=value, intermediate_values=record.intermediate))
            else:  # asked again with the same params, through Optuna's queue
                record.state = "running"
                trial, _ = self._ask(params)
                for step, value in sorted(record.intermediate.items()):
                    trial.report(value, step)
                self._trials[trial.number] = trial
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


def _finite(value: Any) -> bool:
    return finite_number(value)


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


def make_searcher(name: str, space: dict[str, Any], *, metric_mode: str, seed: int, budget: int) -> Searcher:
    """A searcher ``name`` (random, grid or tpe) over ``space``, for a metric to ``metric_mode`` (min or max)."""
    return Searcher(name, space, mode=metric_mode, seed=seed, budget=budget)
