"""Trial schedulers: when a sweep's trial continues, pauses, stops, or (PBT) takes a better trial's weights.

Pure: standard library only, no clock; randomness only from a seeded ``random.Random`` (PBT). The tune engine
feeds each trial's results in (``result(trial, iteration, value)``, iterations counting from 1, e.g. epochs) and
acts on the :class:`Decision`. Semantics follow the papers and Ray Tune's schedulers of the same names; where
ours differ, the class says so.

- :class:`FIFO`: every trial runs to ``max_iterations`` (the baseline).
- :class:`ASHA` (Li et al., MLSys 2020; Ray's ``ASHAScheduler``): rungs at ``grace * eta**k <= max_iterations``;
  when a trial first reaches a rung, it is compared with the values recorded there so far: below the
  ``(1 - 1/eta)`` quantile (linear interpolation, as ``numpy.nanpercentile``) it stops; either way its value is
  recorded. Asynchronous: nobody waits. With several brackets, trials join them in turn (Ray draws a bracket at
  random; round robin keeps a sweep reproducible).
- :class:`SuccessiveHalving` (synchronous; BOHB-style when its trials come from a TPE searcher): ``num_trials``
  trials run to ``grace``, pause, and when all of the rung has reported the best ``floor(n / eta**k)`` (at
  least one) go on to ``grace * eta**k`` (capped at ``max_iterations``); the others stop.
- :class:`Hyperband` (Li et al., JMLR 2018, synchronous): brackets ``s = s_max .. 0`` with
  ``s_max = floor(log_eta(max_iterations / grace))``; bracket ``s`` takes ``n = ceil((s_max + 1) / (s + 1) *
  eta**s)`` trials starting at ``max_iterations * eta**-s`` iterations and is a successive halving of them.
  Trials fill the brackets in order; the brackets run side by side.
- :class:`MedianStopping` (Golovin et al., KDD 2017; Ray's ``MedianStoppingRule``): after ``grace`` iterations,
  a trial stops when its best value so far is worse than the median, over the other trials with at least
  ``min_samples`` of them, of their running means up to the same iteration.
- :class:`PBT` (Jaderberg et al., 2017): every ``interval`` iterations, a trial in the bottom ``quantile`` of the
  latest values takes the weights (checkpoint) of a trial from the top ``quantile`` and an explored copy of its
  config: each mutated parameter is resampled with probability ``resample_probability``, otherwise perturbed
  (numbers times 0.8 or 1.2, clipped to their range; a listed value moves to a neighbour).

Every scheduler has ``groups()`` (Fluid's TrialGroups: for the synchronous ones each bracket's current rung, for
the others every live trial), ``rungs()`` (for the dashboard) and a JSON ``state()``/``restore()``.
"""

from __future__ import annotations

import copy
import enum
import math
import random
from dataclasses import dataclass
from typing import Any


class Action(enum.StrEnum):
    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""
    exploit: str | None = None  # PBT: the trial whose checkpoint this one loads
    config: dict[str, Any] | None = None  # PBT: its explored config


CONTINUE = Decision(Action.CONTINUE)


def quantile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` with linear interpolation (numpy's default); NaN ignored."""
    data = sorted(value for value in values if not math.isnan(value))
    if not data:
        return math.nan
    position = (len(data) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def median(values: list[float]) -> float:
    return quantile(values, 0.5)


class TrialScheduler:
    """The common part: mode, bookkeeping of trials, JSON state."""

    name = "base"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10):
        if mode not in {"min", "max"}:
            raise ValueError(f"mode must be min or max, got {mode!r}")
        if int(max_iterations) < 1:
            raise ValueError("max_iterations must be at least 1")
        self.mode = mode
        self.max_iterations = int(max_iterations)
        self.trials: dict[str, dict[str, Any]] = {}  # id -> {"config", "status", "last", ...}

    # -- helpers ---------------------------------------------------------------------------------------------
    def score(self, value: float) -> float:
        """Higher is better, whatever the mode."""
        return value if self.mode == "max" else -value

    def add(self, trial_id: str, config: dict[str, Any]) -> None:
        self.trials[trial_id] = {"config": copy.deepcopy(config), "status": "running", "last": None,
                                 "iteration": 0}

    def result(self, trial_id: str, iteration: int, value: float) -> Decision:
        trial = self.trials[trial_id]
        trial["last"], trial["iteration"] = float(value), int(iteration)
        if trial["status"] != "running":
            return Decision(Action.STOP, f"trial is {trial['status']}")
        return self._on_result(trial_id, int(iteration), float(value))

    def _on_result(self, trial_id: str, iteration: int, value: float) -> Decision:
        return CONTINUE

    def complete(self, trial_id: str) -> None:
        self.trials[trial_id]["status"] = "completed"

    def fail(self, trial_id: str) -> None:
        self.trials[trial_id]["status"] = "failed"

    def stop(self, trial_id: str) -> None:
        self.trials[trial_id]["status"] = "stopped"

    def live(self) -> list[str]:
        return [trial for trial, entry in self.trials.items() if entry["status"] in {"running", "paused"}]

    def capacity(self) -> int | None:
        """How many more trials this scheduler takes (None: any number)."""
        return None

    def target(self, trial_id: str) -> int:
        """The iteration the trial runs to before it next needs a decision."""
        return self.max_iterations

    def resume(self) -> list[tuple[str, int]]:
        """Paused trials that may now run on, with the iteration to run to (synchronous schedulers)."""
        return []

    def groups(self) -> list[list[str]]:
        running = [trial for trial, entry in self.trials.items() if entry["status"] == "running"]
        return [running] if running else []

    def rungs(self) -> list[dict[str, Any]]:
        return []

    def state(self) -> dict[str, Any]:
        data = {key: copy.deepcopy(value) for key, value in vars(self).items() if not key.startswith("_")}
        return {"scheduler": self.name, "data": data}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("scheduler") != self.name:
            raise ValueError(f"state of a {state.get('scheduler')!r} scheduler, not {self.name!r}")
        for key, value in state["data"].items():
            setattr(self, key, copy.deepcopy(value))


class FIFO(TrialScheduler):
    name = "fifo"


class ASHA(TrialScheduler):
    name = "asha"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, grace_period: int = 1,
                 reduction_factor: float = 3, brackets: int = 1):
        super().__init__(mode=mode, max_iterations=max_iterations)
        if grace_period < 1 or grace_period > max_iterations:
            raise ValueError("grace_period must be between 1 and max_iterations")
        if reduction_factor <= 1:
            raise ValueError("reduction_factor must be more than 1")
        self.grace_period, self.eta, self.brackets = int(grace_period), float(reduction_factor), int(brackets)
        # Per bracket s, rungs from the highest milestone down: [milestone, {trial: score}].
        self.rung_data: list[list[list]] = []
        for s in range(self.brackets):
            count = int(math.log(max_iterations / grace_period) / math.log(self.eta) - s + 1 + 1e-9)
            milestones = [grace_period * self.eta ** (k + s) for k in reversed(range(max(count, 0)))]
            self.rung_data.append([[milestone, {}] for milestone in milestones])
        self.bracket_of: dict[str, int] = {}

    def add(self, trial_id: str, config: dict[str, Any]) -> None:
        super().add(trial_id, config)
        self.bracket_of[trial_id] = len(self.bracket_of) % self.brackets

    def _on_result(self, trial_id: str, iteration: int, value: float) -> Decision:
        score = self.score(value)
        for milestone, recorded in self.rung_data[self.bracket_of[trial_id]]:
            if iteration < milestone or trial_id in recorded:
                continue
            cutoff = quantile(list(recorded.values()), 1 - 1 / self.eta) if recorded else None
            recorded[trial_id] = score
            if cutoff is not None and score < cutoff:
                self.stop(trial_id)
                return Decision(Action.STOP, f"rung at iteration {milestone:g}: {value:g} is not in the top "
                                             f"1/{self.eta:g} (cutoff {self.score(cutoff):g})")
            break
        return CONTINUE

    def rungs(self) -> list[dict[str, Any]]:
        return [{"bracket": bracket, "milestone": milestone,
                 "values": {trial: self.score(score) for trial, score in recorded.items()},
                 "stopped": [trial for trial in recorded if self.trials[trial]["status"] == "stopped"]}
                for bracket, rungs in enumerate(self.rung_data) for milestone, recorded in reversed(rungs)]


class SuccessiveHalving(TrialScheduler):
    """Synchronous successive halving of ``num_trials`` trials (one bracket)."""

    name = "sh"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, grace_period: int = 1,
                 reduction_factor: float = 3, num_trials: int = 9):
        super().__init__(mode=mode, max_iterations=max_iterations)
        if grace_period < 1 or grace_period > max_iterations:
            raise ValueError("grace_period must be between 1 and max_iterations")
        if reduction_factor <= 1:
            raise ValueError("reduction_factor must be more than 1")
        if num_trials < 1:
            raise ValueError("num_trials must be at least 1")
        self.eta = float(reduction_factor)
        self.brackets_data = [self._bracket(int(num_trials), int(grace_period))]
        self.bracket_of: dict[str, int] = {}

    def _bracket(self, n: int, start: int) -> dict[str, Any]:
        """Rungs ``[{"milestone", "size", "members", "values", "promoted"}]`` of a bracket of ``n`` trials whose
        first rung is at ``start`` iterations."""
        rungs, k = [], 0
        while True:
            milestone = min(int(round(start * self.eta ** k)), self.max_iterations)
            size = max(1, int(n / self.eta ** k + 1e-9))
            rungs.append({"milestone": milestone, "size": size, "members": [], "values": {}, "promoted": []})
            if milestone >= self.max_iterations or size == 1:
                if milestone < self.max_iterations:  # one trial left: it runs to the end
                    rungs[-1]["milestone"] = self.max_iterations
                break
            k += 1
        return {"n": n, "rungs": rungs, "current": 0}

    def capacity(self) -> int | None:
        return sum(bracket["n"] for bracket in self.brackets_data) - len(self.bracket_of)

    def add(self, trial_id: str, config: dict[str, Any]) -> None:
        for index, bracket in enumerate(self.brackets_data):
            if len(bracket["rungs"][0]["members"]) < bracket["n"]:
                super().add(trial_id, config)
                bracket["rungs"][0]["members"].append(trial_id)
                self.bracket_of[trial_id] = index
                return
        raise ValueError("this scheduler takes no more trials (capacity() is 0)")

    def _rung_of(self, trial_id: str) -> tuple[dict, int]:
        bracket = self.brackets_data[self.bracket_of[trial_id]]
        for index in range(len(bracket["rungs"]) - 1, -1, -1):
            if trial_id in bracket["rungs"][index]["members"]:
                return bracket, index
        raise KeyError(trial_id)

    def target(self, trial_id: str) -> int:
        bracket, index = self._rung_of(trial_id)
        return bracket["rungs"][index]["milestone"]

    def _on_result(self, trial_id: str, iteration: int, value: float) -> Decision:
        bracket, index = self._rung_of(trial_id)
        rung = bracket["rungs"][index]
        if iteration < rung["milestone"] or trial_id in rung["values"]:
            return CONTINUE
        rung["values"][trial_id] = self.score(value)
        if rung["milestone"] >= self.max_iterations:
            return CONTINUE  # the last rung: it finishes
        self.trials[trial_id]["status"] = "paused"
        self._close(bracket, index)
        return Decision(Action.PAUSE, f"rung at iteration {rung['milestone']}: waiting for the rest of the rung")

    def fail(self, trial_id: str) -> None:
        super().fail(trial_id)
        bracket, index = self._rung_of(trial_id)
        self._close(bracket, index)

    def _close(self, bracket: dict, index: int) -> None:
        """When every member of the rung reported (or failed) and the rung is full, promote its best."""
        rung = bracket["rungs"][index]
        if rung["promoted"] or index + 1 >= len(bracket["rungs"]):
            return
        if index == 0 and len(rung["members"]) < bracket["n"]:
            return  # trials are still to come (see seal)
        waiting = [trial for trial in rung["members"] if trial not in rung["values"]
                   and self.trials[trial]["status"] not in {"failed", "stopped", "completed"}]
        if waiting:
            return
        nxt = bracket["rungs"][index + 1]
        ranked = sorted((trial for trial in rung["values"] if self.trials[trial]["status"] == "paused"),
                        key=lambda trial: (-rung["values"][trial], rung["members"].index(trial)))
        chosen = ranked[:nxt["size"]]
        rung["promoted"] = chosen or [None]
        for trial in ranked:
            if trial in chosen:
                nxt["members"].append(trial)
                self.trials[trial]["status"] = "promoted"
            else:
                self.trials[trial]["status"] = "stopped"
        bracket["current"] = index + 1

    def seal(self) -> None:
        """No more trials will come (the searcher ran out): brackets take the trials they have."""
        self.brackets_data = [bracket for bracket in self.brackets_data if bracket["rungs"][0]["members"]]
        self.bracket_of = {trial: index for index, bracket in enumerate(self.brackets_data)
                           for trial in bracket["rungs"][0]["members"]}
        for bracket in self.brackets_data:
            bracket["n"] = len(bracket["rungs"][0]["members"])
            for k, rung in enumerate(bracket["rungs"]):
                rung["size"] = min(rung["size"], max(1, int(bracket["n"] / self.eta ** k + 1e-9)))
                if rung["size"] == 1 and k + 1 < len(bracket["rungs"]) and not rung["members"]:
                    rung["milestone"] = self.max_iterations  # a lone trial runs to the end
                    del bracket["rungs"][k + 1:]
                    break
            self._close(bracket, bracket["current"])

    def resume(self) -> list[tuple[str, int]]:
        found = []
        for trial, entry in self.trials.items():
            if entry["status"] == "promoted":
                entry["status"] = "running"
                found.append((trial, self.target(trial)))
        return found

    def stopped_by_rungs(self) -> list[str]:
        return [trial for trial, entry in self.trials.items() if entry["status"] == "stopped"]

    def groups(self) -> list[list[str]]:
        groups = []
        for bracket in self.brackets_data:
            rung = bracket["rungs"][bracket["current"]]
            members = [trial for trial in rung["members"] if self.trials[trial]["status"] in {"running", "promoted"}]
            if members:
                groups.append(members)
        return groups

    def rungs(self) -> list[dict[str, Any]]:
        return [{"bracket": b, "milestone": rung["milestone"], "size": rung["size"], "members": list(rung["members"]),
                 "values": {trial: self.score(score) for trial, score in rung["values"].items()},
                 "promoted": [trial for trial in rung["promoted"] if trial]}
                for b, bracket in enumerate(self.brackets_data) for rung in bracket["rungs"]]


class Hyperband(SuccessiveHalving):
    name = "hyperband"

    def __init__(self, *, mode: str = "max", max_iterations: int = 27, grace_period: int = 1,
                 reduction_factor: float = 3):
        TrialScheduler.__init__(self, mode=mode, max_iterations=max_iterations)
        if grace_period < 1 or grace_period > max_iterations:
            raise ValueError("grace_period must be between 1 and max_iterations")
        if reduction_factor <= 1:
            raise ValueError("reduction_factor must be more than 1")
        self.eta = float(reduction_factor)
        s_max = int(math.log(max_iterations / grace_period) / math.log(self.eta) + 1e-9)
        self.brackets_data = []
        for s in range(s_max, -1, -1):
            n = int(math.ceil((s_max + 1) / (s + 1) * self.eta ** s - 1e-9))
            start = max(grace_period, int(round(max_iterations * self.eta ** -s)))
            self.brackets_data.append(self._bracket(n, start))
        self.bracket_of = {}


class MedianStopping(TrialScheduler):
    name = "median"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, grace_period: int = 1,
                 min_samples: int = 3):
        super().__init__(mode=mode, max_iterations=max_iterations)
        if grace_period < 1:
            raise ValueError("grace_period must be at least 1")
        if min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        self.grace_period, self.min_samples = int(grace_period), int(min_samples)
        self.history: dict[str, list[list[float]]] = {}  # trial -> [[iteration, score]]

    def _on_result(self, trial_id: str, iteration: int, value: float) -> Decision:
        self.history.setdefault(trial_id, []).append([iteration, self.score(value)])
        if iteration < self.grace_period:
            return CONTINUE
        means = []
        for other, points in self.history.items():
            if other == trial_id:
                continue
            upto = [score for at, score in points if at <= iteration]
            if upto:
                means.append(sum(upto) / len(upto))
        if len(means) < self.min_samples:
            return CONTINUE
        best = max(score for _, score in self.history[trial_id])
        middle = median(means)
        if best < middle:
            self.stop(trial_id)
            return Decision(Action.STOP, f"iteration {iteration}: best {self.score(best):g} is worse than the "
                                         f"median {self.score(middle):g} of {len(means)} other trials")
        return CONTINUE


class PBT(TrialScheduler):
    name = "pbt"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, interval: int = 2, quantile: float = 0.25,
                 mutations: dict[str, Any] | None = None, resample_probability: float = 0.25, seed: int = 0):
        super().__init__(mode=mode, max_iterations=max_iterations)
        if interval < 1:
            raise ValueError("interval must be at least 1")
        if not 0 < quantile <= 0.5:
            raise ValueError("quantile must be in (0, 0.5]")
        if not mutations:
            raise ValueError("mutations: name at least one parameter to explore")
        self.interval, self.fraction = int(interval), float(quantile)
        self.mutations = copy.deepcopy(mutations)
        self.resample_probability = float(resample_probability)
        self.rng_state = _rng_state(random.Random(seed))
        self.latest: dict[str, float] = {}  # trial -> latest score
        self.exploits: list[dict[str, Any]] = []

    def _on_result(self, trial_id: str, iteration: int, value: float) -> Decision:
        self.latest[trial_id] = self.score(value)
        if iteration % self.interval or iteration >= self.max_iterations:
            return CONTINUE
        ranked = sorted((trial for trial in self.latest if self.trials[trial]["status"] == "running"),
                        key=lambda trial: (self.latest[trial], trial))
        cut = max(1, int(len(ranked) * self.fraction))
        if len(ranked) < 2 or trial_id not in ranked[:cut]:
            return CONTINUE
        top = ranked[-cut:]
        if trial_id in top:
            return CONTINUE
        rng = random.Random()
        rng.setstate(_rng_from(self.rng_state))
        donor = rng.choice(top)
        config = self._explore(self.trials[donor]["config"], rng)
        self.rng_state = _rng_state(rng)
        self.trials[trial_id]["config"] = config
        self.exploits.append({"trial": trial_id, "from": donor, "iteration": iteration, "config": config})
        return Decision(Action.CONTINUE, f"iteration {iteration}: in the bottom {self.fraction:g}; takes the "
                                         f"weights of {donor}", exploit=donor, config=copy.deepcopy(config))

    def _explore(self, config: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        new = copy.deepcopy(config)
        for name, rule in self.mutations.items():
            current = new.get(name)
            if "values" in rule:
                values = list(rule["values"])
                if rng.random() < self.resample_probability or current not in values:
                    new[name] = rng.choice(values)
                else:
                    index = values.index(current) + rng.choice([-1, 1])
                    new[name] = values[min(max(index, 0), len(values) - 1)]
            else:
                low, high = rule["low"], rule["high"]
                if rng.random() < self.resample_probability or not isinstance(current, int | float):
                    value = rng.uniform(low, high)
                else:
                    value = current * rng.choice(rule.get("factor", [0.8, 1.2]))
                value = min(max(value, low), high)
                new[name] = int(round(value)) if isinstance(current, int) and not isinstance(current, bool) else value
        return new

    def rungs(self) -> list[dict[str, Any]]:
        return [dict(entry) for entry in self.exploits]


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(state: list) -> tuple:
    return state[0], tuple(state[1]), state[2]


SCHEDULERS: dict[str, type[TrialScheduler]] = {cls.name: cls for cls in (FIFO, ASHA, SuccessiveHalving, Hyperband,
                                                                         MedianStopping, PBT)}
# option -> (type, default, description); checked by the tune kind's spec
SCHEDULER_OPTIONS: dict[str, dict[str, tuple[type, Any, str]]] = {
    "fifo": {},
    "asha": {"grace_period": (int, 1, "iterations before the first rung"),
             "reduction_factor": (float, 3, "eta: a rung keeps the top 1/eta"),
             "brackets": (int, 1, "brackets, joined in turn")},
    "sh": {"grace_period": (int, 1, "iterations of the first rung"),
           "reduction_factor": (float, 3, "eta: each rung keeps the top 1/eta"),
           "num_trials": (int, None, "trials in the bracket (default: the trial budget)")},
    "hyperband": {"grace_period": (int, 1, "the fewest iterations a bracket starts with"),
                  "reduction_factor": (float, 3, "eta")},
    "median": {"grace_period": (int, 1, "iterations before a trial can be stopped"),
               "min_samples": (int, 3, "other trials needed to take a median")},
    "pbt": {"interval": (int, 2, "iterations between exploit/explore steps"),
            "quantile": (float, 0.25, "the bottom and top fractions"),
            "mutations": (dict, None, "name -> {values: [...]} or {low, high}"),
            "resample_probability": (float, 0.25, "chance to resample instead of perturb"),
            "seed": (int, 0, "seed of the exploration")},
}


def options_problems(name: Any, options: Any, field: str = "spec.scheduler") -> list[tuple[str, str]]:
    """Every problem of a scheduler name and its options, as ``(field, message)``."""
    if not isinstance(name, str) or name not in SCHEDULERS:
        return [(f"{field}.name", f"must be one of {', '.join(SCHEDULERS)}")]
    if not isinstance(options, dict):
        return [(f"{field}.options", "must be an object")]
    problems = []
    known = SCHEDULER_OPTIONS[name]
    for key, value in options.items():
        where = f"{field}.options.{key}"
        if key not in known:
            problems.append((where, f"unknown option of {name}; allowed: {', '.join(known) or 'none'}"))
            continue
        kind = known[key][0]
        if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append((where, "must be an integer of at least 1"))
        elif kind is float and (not isinstance(value, int | float) or isinstance(value, bool)
                                or not math.isfinite(value) or value <= 0):
            problems.append((where, "must be a positive number"))
        elif kind is dict and (not isinstance(value, dict) or not value):
            problems.append((where, "must be a non-empty object"))
    if name in {"asha", "sh"} and isinstance(options.get("reduction_factor"), int | float) \
            and not isinstance(options.get("reduction_factor"), bool) and options["reduction_factor"] <= 1:
        problems.append((f"{field}.options.reduction_factor", "must be more than 1"))
    if name == "hyperband" and isinstance(options.get("reduction_factor"), int | float) \
            and not isinstance(options.get("reduction_factor"), bool) and options["reduction_factor"] <= 1:
        problems.append((f"{field}.options.reduction_factor", "must be more than 1"))
    if name == "pbt":
        if "mutations" not in options:
            problems.append((f"{field}.options.mutations", "required: the parameters PBT explores"))
        q = options.get("quantile")
        if isinstance(q, int | float) and not isinstance(q, bool) and not 0 < q <= 0.5:
            problems.append((f"{field}.options.quantile", "must be in (0, 0.5]"))
    return problems


def make_scheduler(name: str, *, mode: str, max_iterations: int, **options: Any) -> TrialScheduler:
    """A scheduler by name with its options (checked: raises ValueError naming every bad one)."""
    problems = options_problems(name, options)
    if problems:
        raise ValueError("; ".join(f"{field}: {message}" for field, message in problems))
    options = {key: value for key, value in options.items() if value is not None}
    return SCHEDULERS[name](mode=mode, max_iterations=max_iterations, **options)
