"""Trial schedulers: when a sweep's trial continues, pauses, stops, or (PBT) takes a better trial's weights.

Pure: standard library only, no clock; randomness only from a ``random.Random`` seeded at construction (ASHA's
bracket draw, PBT). The tune engine (:mod:`components.tuning.component`) feeds each trial's results in, one per
iteration (``result(trial, iteration, value)``, iterations counting from 1, e.g. epochs: the resource spent),
acts on the returned :class:`Decision` and polls :meth:`TrialScheduler.resume` for paused trials that may go on.
The same events in the same order with the same seed give the same decisions.

Vocabulary shared by every scheduler:

- ``mode`` is ``"min"`` or ``"max"``. Internally values become *scores* (higher is better: the value, or minus
  it). A NaN or infinite value is *invalid* and counts as the worst possible score (it never wins a rung, it is
  the first exploited in PBT); it is kept as ``None`` so that every state is strict JSON.
- A trial's status is ``running``, ``paused`` (at a synchronous rung), ``promoted`` (paused, then chosen to go
  on: :meth:`~TrialScheduler.resume` hands it out and makes it ``running``), ``stopped`` (by the scheduler, or
  :meth:`~TrialScheduler.stop`), ``completed`` or ``failed``.
- :meth:`~TrialScheduler.target` is the iteration a trial runs to before it next needs a decision: the
  milestone of its rung for the synchronous schedulers, else ``max_iterations``.
- :meth:`~TrialScheduler.groups` are Fluid's TrialGroups, the trials scheduled (water-filled) together: for the
  synchronous schedulers the runnable trials of each bracket's current rung, for the others every running trial.
- :meth:`~TrialScheduler.rungs` describes the rungs for the dashboard (JSON; invalid values left out of
  ``values`` and listed under ``invalid``); :meth:`~TrialScheduler.state` / :meth:`~TrialScheduler.restore`
  carry everything (the random generator included) across a restart of the engine.

The schedulers (semantics of the papers and of Ray Tune's schedulers of the same name; each class says where
ours differ):

- :class:`FIFO`: every trial runs to ``max_iterations`` (the baseline).
- :class:`ASHA`: asynchronous successive halving (Li et al., MLSys 2020; Ray's ``ASHAScheduler``).
- :class:`SuccessiveHalving`: synchronous successive halving of one bracket (BOHB-style with the TPE searcher).
- :class:`Hyperband`: synchronous Hyperband (Li et al., JMLR 2018), the textbook brackets side by side.
- :class:`MedianStopping`: the median stopping rule (Golovin et al., KDD 2017; Ray's ``MedianStoppingRule``).
- :class:`PBT`: population based training (Jaderberg et al., 2017; Ray's ``PopulationBasedTraining``).

:func:`make_scheduler` builds one by name; :data:`SCHEDULER_OPTIONS` lists each one's options and
:func:`options_problems` names every bad option of a spec at once.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

STATE_FORMAT = 2
LIVE = ("running", "paused", "promoted")
ENDED = ("stopped", "completed", "failed")


class Action(StrEnum):
    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""  # shown to users, e.g. "rung 1 (iteration 3): 0.81 not in the top 1/3 (cutoff 0.85)"
    exploit: str | None = None  # PBT: the trial whose checkpoint this one loads
    config: dict[str, Any] | None = None  # PBT: this trial's new (explored) config


CONTINUE = Decision(Action.CONTINUE)


# -- small helpers ---------------------------------------------------------------------------------------------
def valid(value: Any) -> float | None:
    """The value as a float, or None when it is not a finite number (NaN, infinite, missing)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def quantile(values: Iterable[float | None], fraction: float) -> float | None:
    """The ``fraction`` quantile of the valid values with linear interpolation between the closest ranks (numpy's
    default ``percentile``; ``nanpercentile`` since invalid values are left out); None when none is valid."""
    data = sorted(value for value in values if value is not None)
    if not data:
        return None
    position = (len(data) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def median(values: Iterable[float | None]) -> float | None:
    return quantile(values, 0.5)


def best_first(score: float | None) -> tuple[int, float]:
    """Sort key: the best score first, invalid (None) scores last."""
    return (0, -score) if score is not None else (1, 0.0)


def _show(value: float | None) -> str:
    return "invalid (NaN or infinite)" if value is None else f"{value:.4g}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def _check_eta(value: Any) -> float:
    if not _is_number(value) or not math.isfinite(value) or value <= 1:
        raise ValueError(f"reduction_factor must be a number more than 1, got {value!r}")
    return float(value)


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # 3.0000000000000004 is 3


def _floor(x: float) -> int:
    return math.floor(x + 1e-9)  # 2.9999999999999996 is 3


# -- the base --------------------------------------------------------------------------------------------------
class TrialScheduler:
    """The common part: mode, the trials and their status, JSON state. Subclasses decide in ``_on_result``."""

    name = "base"
    title = "the scheduler"  # shown to users: "stopped early by ASHA at iteration 3"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10):
        if mode not in {"min", "max"}:
            raise ValueError(f"mode must be min or max, got {mode!r}")
        self.mode = mode
        self.max_iterations = _check_int("max_iterations", max_iterations, 1)
        # id -> {"config", "status", "iteration" (last reported), "value" (last reported, None if invalid)}
        self.trials: dict[str, dict[str, Any]] = {}
        self._rng: random.Random | None = None

    # -- scores ----------------------------------------------------------------------------------------------
    def score(self, value: Any) -> float | None:
        """Higher is better, whatever the mode; None for an invalid value."""
        number = valid(value)
        if number is None:
            return None
        return number if self.mode == "max" else -number

    def unscore(self, score: float | None) -> float | None:
        """A score back in the metric's own sign."""
        if score is None:
            return None
        return score if self.mode == "max" else -score

    # -- events ----------------------------------------------------------------------------------------------
    def add(self, trial_id: str, config: dict[str, Any]) -> None:
        """A new trial (it starts running)."""
        if trial_id in self.trials:
            raise ValueError(f"trial {trial_id!r} was added already")
        self.trials[trial_id] = {"config": copy.deepcopy(config), "status": "running", "iteration": 0,
                                 "value": None}

    def result(self, trial_id: str, iteration: int, value: float) -> Decision:
        """The trial's metric after ``iteration`` iterations. A trial that ended gets STOP and a paused one PAUSE
        again, and neither result is recorded; a promoted trial not yet resumed is treated as running."""
        if trial_id not in self.trials:
            raise KeyError(f"unknown trial {trial_id!r}")
        iteration = _check_int("iteration", iteration, 1)
        trial = self.trials[trial_id]
        if trial["status"] in ENDED:
            return Decision(Action.STOP, f"trial {trial_id} is {trial['status']}")
        if trial["status"] == "paused":
            return Decision(Action.PAUSE, "paused: waiting for the rest of its rung")
        trial["iteration"], trial["value"] = iteration, valid(value)
        return self._on_result(trial_id, iteration, self.score(value))

    def _on_result(self, trial_id: str, iteration: int, score: float | None) -> Decision:
        return CONTINUE

    def complete(self, trial_id: str) -> None:
        """The trial reached ``max_iterations`` (or otherwise finished)."""
        self._end(trial_id, "completed")

    def fail(self, trial_id: str) -> None:
        self._end(trial_id, "failed")

    def stop(self, trial_id: str) -> None:
        """The trial was stopped from outside (cancelled, or ended by the engine)."""
        self._end(trial_id, "stopped")

    def _end(self, trial_id: str, status: str) -> None:
        if self.trials[trial_id]["status"] in ENDED:
            return  # the first end stands
        self.trials[trial_id]["status"] = status
        self._ended(trial_id)

    def _ended(self, trial_id: str) -> None:
        """Hook: a trial ended (the synchronous schedulers may close its rung)."""

    # -- queries ---------------------------------------------------------------------------------------------
    def status(self, trial_id: str) -> str:
        return self.trials[trial_id]["status"]

    def live(self) -> list[str]:
        return [trial for trial, entry in self.trials.items() if entry["status"] in LIVE]

    def capacity(self) -> int | None:
        """How many more trials this scheduler takes (None: any number)."""
        return None

    def seal(self) -> None:
        """No more trials will be added (the searcher ran out). Only the synchronous schedulers care."""

    def target(self, trial_id: str) -> int:
        """The iteration up to which the trial runs before it next needs a decision."""
        return self.max_iterations

    def resume(self) -> list[tuple[str, int]]:
        """Paused trials that may now run on, with the iteration to run to; each is handed out once."""
        return []

    def groups(self) -> list[list[str]]:
        running = [trial for trial, entry in self.trials.items() if entry["status"] == "running"]
        return [running] if running else []

    def rungs(self) -> list[dict[str, Any]]:
        return []

    # -- state -----------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything needed to carry on after a restart, as strict JSON (no NaN)."""
        data = {key: copy.deepcopy(value) for key, value in vars(self).items() if not key.startswith("_")}
        out: dict[str, Any] = {"scheduler": self.name, "format": STATE_FORMAT, "data": data}
        if self._rng is not None:
            version, internal, gauss = self._rng.getstate()
            out["rng"] = [version, list(internal), gauss]
        return out

    def restore(self, state: dict[str, Any]) -> None:
        """Take over a :meth:`state` (the scheduler's options included: the saved ones win)."""
        if state.get("scheduler") != self.name:
            raise ValueError(f"state of a {state.get('scheduler')!r} scheduler, not {self.name!r}")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"state format {state.get('format')!r}, this version reads {STATE_FORMAT}")
        data = state["data"]
        expected = [key for key in vars(self) if not key.startswith("_")]
        missing = [key for key in expected if key not in data]
        if missing:
            raise ValueError(f"state lacks {', '.join(missing)}")
        for key in expected:
            setattr(self, key, copy.deepcopy(data[key]))
        if self._rng is not None:
            version, internal, gauss = state["rng"]
            self._rng.setstate((version, tuple(internal), gauss))


class FIFO(TrialScheduler):
    """Every trial runs to ``max_iterations``: the baseline."""

    name = "fifo"
    title = "FIFO"


# -- ASHA ------------------------------------------------------------------------------------------------------
def asha_milestones(grace_period: int, reduction_factor: float, max_iterations: int, s: int = 0) -> list[int]:
    """The decision rungs of ASHA's bracket ``s``: ``grace * eta**(k + s)`` for k = 0, 1, ... below
    ``max_iterations``, as the first whole iteration that reaches each (its ceiling), without repeats."""
    out: list[int] = []
    k = 0
    while (milestone := _ceil(grace_period * reduction_factor ** (k + s))) < max_iterations:
        if not out or milestone > out[-1]:
            out.append(milestone)
        k += 1
    return out


class ASHA(TrialScheduler):
    """Asynchronous successive halving (Li et al., MLSys 2020), as Ray's ``ASHAScheduler``.

    Bracket ``s`` (``s = 0 .. brackets - 1``) has rungs at ``grace_period * eta**(k + s)`` iterations below
    ``max_iterations`` (:func:`asha_milestones`). When a trial first reports at or beyond a rung's milestone (the
    highest such rung it has no value at), the *cutoff* is the ``(1 - 1/eta)`` quantile of the valid scores
    recorded at that rung before it (linear interpolation, as ``numpy.nanpercentile`` in Ray); its score is then
    recorded, and it STOPs iff there is a cutoff and its score is below it (or invalid). Equal to the cutoff goes
    on; the first trial at a rung always goes on. Nobody waits: ``groups()`` is every running trial.

    Where it differs from Ray:

    - a trial that reaches ``max_iterations`` is not judged (Ray's default ``stop_last_trials`` stops it there,
      which is the same end): it gets CONTINUE and completes; its value is kept in a *final* row of ``rungs()``
      for the dashboard only;
    - milestones are whole iterations (Ray compares with the float ``grace * eta**k``, the same thing for whole
      iterations), and two milestones that round to the same iteration are one rung;
    - an invalid value is the worst (Ray's ``nan < cutoff`` is false, so a NaN trial would go on);
    - with several brackets a trial joins bracket ``s`` with Ray's softmax probability ``e**(rungs_s - max_s
      rungs_s)``, drawn from the scheduler's seeded generator.
    """

    name = "asha"
    title = "ASHA"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, grace_period: int = 1,
                 reduction_factor: float = 3, brackets: int = 1, seed: int = 0):
        super().__init__(mode=mode, max_iterations=max_iterations)
        self.grace_period = _check_int("grace_period", grace_period, 1, self.max_iterations)
        self.reduction_factor = _check_eta(reduction_factor)
        self.brackets = _check_int("brackets", brackets, 1)
        self.milestones = [asha_milestones(self.grace_period, self.reduction_factor, self.max_iterations, s)
                           for s in range(self.brackets)]
        # Per bracket, per rung: {trial: score} in the order recorded, and the trials stopped there.
        self.recorded: list[list[dict[str, float | None]]] = [[{} for _ in ms] for ms in self.milestones]
        self.stopped_at: list[list[list[str]]] = [[[] for _ in ms] for ms in self.milestones]
        self.final: list[dict[str, float | None]] = [{} for _ in self.milestones]  # for the dashboard only
        self.bracket_of: dict[str, int] = {}
        self._rng = random.Random(seed)

    def add(self, trial_id: str, config: dict[str, Any]) -> None:
        super().add(trial_id, config)
        bracket = 0
        if self.brackets > 1:
            sizes = [len(milestones) for milestones in self.milestones]
            weights = [math.exp(size - max(sizes)) for size in sizes]
            bracket = self._rng.choices(range(self.brackets), weights=weights)[0]
        self.bracket_of[trial_id] = bracket

    def _on_result(self, trial_id: str, iteration: int, score: float | None) -> Decision:
        b = self.bracket_of[trial_id]
        if iteration >= self.max_iterations:
            self.final[b].setdefault(trial_id, score)
            return CONTINUE
        milestones, recorded = self.milestones[b], self.recorded[b]
        for k in reversed(range(len(milestones))):
            if iteration < milestones[k] or trial_id in recorded[k]:
                continue
            cutoff = quantile(recorded[k].values(), 1 - 1 / self.reduction_factor)
            recorded[k][trial_id] = score
            where = f"rung {k} (iteration {milestones[k]}): {_show(self.unscore(score))}"
            if cutoff is None:
                return Decision(Action.CONTINUE, f"{where}: the first valid value there")
            if score is None or score < cutoff:
                self.trials[trial_id]["status"] = "stopped"
                self.stopped_at[b][k].append(trial_id)
                return Decision(Action.STOP, f"{where} not in the top 1/{self.reduction_factor:g} "
                                             f"(cutoff {_show(self.unscore(cutoff))})")
            return Decision(Action.CONTINUE, f"{where} in the top 1/{self.reduction_factor:g} "
                                             f"(cutoff {_show(self.unscore(cutoff))})")
        return CONTINUE

    def rungs(self) -> list[dict[str, Any]]:
        rows = []
        for b, milestones in enumerate(self.milestones):
            for k, milestone in enumerate(milestones):
                recorded, stopped = self.recorded[b][k], self.stopped_at[b][k]
                rows.append(self._row(b, k, milestone, recorded, [t for t in recorded if t not in stopped],
                                      list(stopped)))
            rows.append({**self._row(b, len(milestones), self.max_iterations, self.final[b], [], []), "final": True})
        return rows

    def _row(self, b: int, k: int, milestone: int, scores: dict[str, float | None], promoted: list[str],
             stopped: list[str]) -> dict[str, Any]:
        return {"bracket": b, "rung": k, "milestone": milestone,
                "values": {t: self.unscore(s) for t, s in scores.items() if s is not None},
                "invalid": [t for t, s in scores.items() if s is None], "promoted": promoted, "stopped": stopped}


# -- synchronous successive halving and Hyperband --------------------------------------------------------------
class SuccessiveHalving(TrialScheduler):
    """Synchronous successive halving of one bracket of ``num_trials`` trials (with the TPE searcher: BOHB-style).

    Milestones: ``ceil(grace_period * eta**k)`` below ``max_iterations`` (repeats dropped), then
    ``max_iterations``. Rung sizes: rung 0 takes ``n = num_trials`` trials; rung ``k + 1`` takes the best
    ``floor(size_k / eta)`` of rung ``k``, at least 1 (Li et al.'s ``top_k(T, floor(n_i / eta))``; with a whole
    eta it is ``floor(n / eta**(k + 1))``). A rung whose size is 1 is the last one: its trial runs to
    ``max_iterations`` (nobody to compare with). A trial runs to its rung's milestone (``target``) and PAUSEs
    there; when every trial of the rung has reported or ended (and, for rung 0, all ``n`` were added), the best
    scores go on (ties: the earlier added; invalid values last) and the rest STOP. The trial whose report closes
    the rung gets CONTINUE or STOP at once; the paused ones are handed out by ``resume()`` or become ``stopped``.
    Fewer than the planned number go on only when fewer are left (trials failed or were stopped).

    Without ``num_trials`` the bracket takes trials until :meth:`seal`; :meth:`seal` also shrinks a bracket that
    got fewer trials than planned (its sizes are planned again from the trials it has, before anything was
    promoted, since rung 0 cannot close before it is full).
    """

    name = "sh"
    title = "successive halving"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, grace_period: int = 1,
                 reduction_factor: float = 3, num_trials: int | None = None):
        super().__init__(mode=mode, max_iterations=max_iterations)
        self.grace_period = _check_int("grace_period", grace_period, 1, self.max_iterations)
        self.reduction_factor = _check_eta(reduction_factor)
        if num_trials is not None:
            _check_int("num_trials", num_trials, 1)
        milestones = asha_milestones(self.grace_period, self.reduction_factor, self.max_iterations)
        self.sealed = False
        self.brackets_data = [self._bracket(num_trials, milestones + [self.max_iterations], 0)]
        self.bracket_of: dict[str, int] = {}

    # -- plan ------------------------------------------------------------------------------------------------
    def _bracket(self, n: int | None, plan: list[int], s: int) -> dict[str, Any]:
        return {"s": s, "n": n, "plan": plan, "rungs": self._rungs(n, plan), "current": 0}

    def _rungs(self, n: int | None, plan: list[int]) -> list[dict[str, Any]]:
        rungs, size = [], n
        for k, milestone in enumerate(plan):
            last = k == len(plan) - 1 or (size is not None and size <= 1)
            rungs.append({"milestone": self.max_iterations if last else milestone, "size": size, "members": [],
                          "values": {}, "promoted": [], "stopped": [], "closed": False})
            if last:
                break
            size = None if size is None else max(1, _floor(size / self.reduction_factor))
        return rungs

    # -- trials ----------------------------------------------------------------------------------------------
    def capacity(self) -> int | None:
        if self.sealed:
            return 0
        if any(bracket["n"] is None for bracket in self.brackets_data):
            return None
        return sum(bracket["n"] for bracket in self.brackets_data) - len(self.bracket_of)

    def add(self, trial_id: str, config: dict[str, Any]) -> None:
        if self.sealed:
            raise ValueError("this scheduler was sealed: it takes no more trials")
        for index, bracket in enumerate(self.brackets_data):
            members = bracket["rungs"][0]["members"]
            if bracket["n"] is None or len(members) < bracket["n"]:
                super().add(trial_id, config)
                self.trials[trial_id]["rung"] = 0
                members.append(trial_id)
                self.bracket_of[trial_id] = index
                return
        raise ValueError("this scheduler takes no more trials (capacity() is 0)")

    def seal(self) -> None:
        if self.sealed:
            return
        self.sealed = True
        kept = []
        for bracket in self.brackets_data:
            first = bracket["rungs"][0]
            if not first["members"]:
                continue
            if bracket["n"] is None or len(first["members"]) < bracket["n"]:
                bracket["n"] = len(first["members"])
                rungs = self._rungs(bracket["n"], bracket["plan"])
                rungs[0]["members"], rungs[0]["values"] = first["members"], first["values"]
                bracket["rungs"] = rungs
                if len(rungs) == 1:  # rung 0 is now the last: those paused at the old milestone run on
                    for trial in first["members"]:
                        if self.trials[trial]["status"] == "paused":
                            self.trials[trial]["status"] = "promoted"
                            del first["values"][trial]
            kept.append(bracket)
        self.brackets_data = kept
        self.bracket_of = {trial: index for index, bracket in enumerate(kept)
                           for trial in bracket["rungs"][0]["members"]}
        for bracket in kept:
            self._close(bracket)

    def _where(self, trial_id: str) -> tuple[dict[str, Any], int]:
        return self.brackets_data[self.bracket_of[trial_id]], self.trials[trial_id]["rung"]

    def target(self, trial_id: str) -> int:
        bracket, k = self._where(trial_id)
        return bracket["rungs"][k]["milestone"]

    def _on_result(self, trial_id: str, iteration: int, score: float | None) -> Decision:
        bracket, k = self._where(trial_id)
        rungs = bracket["rungs"]
        rung = rungs[k]
        if iteration < rung["milestone"] or trial_id in rung["values"]:
            return CONTINUE
        rung["values"][trial_id] = score
        if k == len(rungs) - 1:
            return CONTINUE  # the last rung: it runs to the end
        self.trials[trial_id]["status"] = "paused"
        self._close(bracket)
        where = f"rung {k} (iteration {rung['milestone']}): {_show(self.unscore(score))}"
        status = self.trials[trial_id]["status"]
        if status == "promoted":
            self.trials[trial_id]["status"] = "running"
            return Decision(Action.CONTINUE, f"{where} in the best {len(rung['promoted'])} of the rung; on to "
                                             f"iteration {rungs[k + 1]['milestone']}")
        if status == "stopped":
            return Decision(Action.STOP, f"{where} not in the best {len(rung['promoted'])} of the rung "
                                         f"(cutoff {_show(self.unscore(rung['cutoff']))})")
        waiting = self._waiting(bracket, k)
        more = f"{waiting} more trial(s)" if waiting else "the rest of the rung to be added"
        return Decision(Action.PAUSE, f"{where}: waiting for {more}")

    def _ended(self, trial_id: str) -> None:
        self._close(self._where(trial_id)[0])

    def _waiting(self, bracket: dict[str, Any], k: int) -> int:
        rung = bracket["rungs"][k]
        return sum(1 for trial in rung["members"] if trial not in rung["values"]
                   and self.trials[trial]["status"] in {"running", "promoted"})

    def _close(self, bracket: dict[str, Any]) -> None:
        """Close the bracket's current rung once every member reported or ended: promote the best."""
        k = bracket["current"]
        rungs = bracket["rungs"]
        rung = rungs[k]
        if rung["closed"] or k == len(rungs) - 1:
            return
        if k == 0 and (bracket["n"] is None or len(rung["members"]) < bracket["n"]):
            return  # trials are still to come
        if self._waiting(bracket, k):
            return
        alive = [trial for trial in rung["members"]
                 if trial in rung["values"] and self.trials[trial]["status"] == "paused"]
        ranked = sorted(alive, key=lambda trial: (best_first(rung["values"][trial]), rung["members"].index(trial)))
        chosen = set(ranked[:rungs[k + 1]["size"]])
        rung["promoted"] = [trial for trial in rung["members"] if trial in chosen]
        rung["stopped"] = [trial for trial in alive if trial not in chosen]
        rung["cutoff"] = rung["values"][ranked[len(chosen) - 1]] if chosen else None
        for trial in alive:
            if trial in chosen:
                self.trials[trial]["status"], self.trials[trial]["rung"] = "promoted", k + 1
            else:
                self.trials[trial]["status"] = "stopped"
        rungs[k + 1]["members"] = list(rung["promoted"])
        rung["closed"] = True
        bracket["current"] = k + 1

    def resume(self) -> list[tuple[str, int]]:
        found = []
        for trial, entry in self.trials.items():
            if entry["status"] == "promoted":
                entry["status"] = "running"
                found.append((trial, self.target(trial)))
        return found

    def groups(self) -> list[list[str]]:
        groups = []
        for bracket in self.brackets_data:
            rung = bracket["rungs"][bracket["current"]]
            members = [trial for trial in rung["members"] if self.trials[trial]["status"] in {"running", "promoted"}]
            if members:
                groups.append(members)
        return groups

    def rungs(self) -> list[dict[str, Any]]:
        return [{"bracket": b, "s": bracket["s"], "rung": k, "milestone": rung["milestone"], "size": rung["size"],
                 "members": list(rung["members"]),
                 "values": {t: self.unscore(s) for t, s in rung["values"].items() if s is not None},
                 "invalid": [t for t, s in rung["values"].items() if s is None],
                 "promoted": list(rung["promoted"]), "stopped": list(rung["stopped"]), "closed": rung["closed"]}
                for b, bracket in enumerate(self.brackets_data) for k, rung in enumerate(bracket["rungs"])]


def hyperband_brackets(grace_period: int, reduction_factor: float, max_iterations: int
                       ) -> list[tuple[int, int, list[int]]]:
    """Li et al.'s brackets as ``(s, n, milestones)``, ``s = s_max .. 0``: ``s_max = floor(log_eta(R / grace))``,
    ``n = ceil((s_max + 1) / (s + 1) * eta**s)`` trials, milestones ``R * eta**(k - s)`` for k = 0 .. s rounded to
    the nearest iteration (at least ``grace``, repeats dropped), the last one ``R`` (``R = max_iterations``)."""
    eta = reduction_factor
    s_max = _floor(math.log(max_iterations / grace_period) / math.log(eta))
    out = []
    for s in range(s_max, -1, -1):
        n = _ceil((s_max + 1) / (s + 1) * eta**s)
        milestones: list[int] = []
        for k in range(s):
            milestone = max(grace_period, math.floor(max_iterations * eta ** (k - s) + 0.5))
            if milestone < max_iterations and (not milestones or milestone > milestones[-1]):
                milestones.append(milestone)
        out.append((s, n, milestones + [max_iterations]))
    return out


class Hyperband(SuccessiveHalving):
    """Synchronous Hyperband (Li et al., JMLR 2018), the textbook version (not Ray's ``HyperBandScheduler``).

    The brackets of :func:`hyperband_brackets` (for ``R = 27, eta = 3``: 27 trials from 1 iteration, 12 from 3,
    6 from 9 and 4 from 27) are each a :class:`SuccessiveHalving` with those milestones and sizes. Trials fill
    the brackets in order as they are added (``capacity()`` is the sum of the ``n``), and the brackets run side by
    side: ``groups()`` has one group per bracket, its current rung. One pass over the brackets (Ray starts a new
    band of brackets when they are full; here the sweep's trial budget ends it, and :meth:`seal` shrinks the
    brackets to the trials they got, dropping empty ones).
    """

    name = "hyperband"
    title = "Hyperband"

    def __init__(self, *, mode: str = "max", max_iterations: int = 27, grace_period: int = 1,
                 reduction_factor: float = 3):
        TrialScheduler.__init__(self, mode=mode, max_iterations=max_iterations)
        self.grace_period = _check_int("grace_period", grace_period, 1, self.max_iterations)
        self.reduction_factor = _check_eta(reduction_factor)
        self.sealed = False
        self.brackets_data = [self._bracket(n, milestones, s) for s, n, milestones in
                              hyperband_brackets(self.grace_period, self.reduction_factor, self.max_iterations)]
        self.bracket_of = {}


# -- median stopping -------------------------------------------------------------------------------------------
class MedianStopping(TrialScheduler):
    """The median stopping rule (Golovin et al., KDD 2017), as Ray's ``MedianStoppingRule`` (hard stop).

    At each result at iteration ``t >= grace_period``: the *others* are the other trials whose latest result is at
    iteration ``t`` or later (stopped and ended trials included); each one's running mean is the mean of its
    values at iterations ``grace_period .. t``. With at least ``min_samples_required`` others, the trial STOPs iff
    its best value so far (all its results) is strictly worse than the median of those running means.

    Where it differs from Ray: invalid values are left out of running means and of the best (an other with no
    valid value in the window does not count; a trial with no valid value is the worst and stops once there is a
    median); no ``min_time_slice`` pausing (every trial here has its own resources).
    """

    name = "median"
    title = "median stopping"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, grace_period: int = 1,
                 min_samples_required: int = 3):
        super().__init__(mode=mode, max_iterations=max_iterations)
        self.grace_period = _check_int("grace_period", grace_period, 1)
        self.min_samples_required = _check_int("min_samples_required", min_samples_required, 1)
        self.history: dict[str, list[list]] = {}  # trial -> [[iteration, score], ...]

    def _on_result(self, trial_id: str, iteration: int, score: float | None) -> Decision:
        self.history.setdefault(trial_id, []).append([iteration, score])
        if iteration < self.grace_period:
            return CONTINUE
        means = []
        for other, points in self.history.items():
            if other == trial_id or points[-1][0] < iteration:
                continue
            window = [s for at, s in points if self.grace_period <= at <= iteration and s is not None]
            if window:
                means.append(math.fsum(window) / len(window))
        if len(means) < self.min_samples_required:
            return CONTINUE
        middle = median(means)
        scores = [s for _, s in self.history[trial_id] if s is not None]
        best = max(scores) if scores else None
        if best is None or best < middle:
            self.trials[trial_id]["status"] = "stopped"
            return Decision(Action.STOP, f"iteration {iteration}: best {_show(self.unscore(best))} is worse than "
                                         f"the median {_show(self.unscore(middle))} of {len(means)} other trials' "
                                         "running means")
        return CONTINUE


# -- PBT -------------------------------------------------------------------------------------------------------
PERTURBATION_FACTORS = (1.2, 0.8)  # Ray's default


def mutation_problems(mutations: Any) -> list[tuple[str, str]]:
    """Problems of PBT's ``hyperparam_mutations`` as ``(parameter or "", message)``. A mutation is one of
    ``{"values": [...]}`` (a list: resampled, or moved to a neighbour), ``{"low", "high"}`` with optional
    ``"log": true`` and ``"factor": [...]`` (resampled uniformly, or multiplied by a factor, clipped to the range)
    and ``{"factor": [...]}`` (multiplied by a factor, never resampled)."""
    if not isinstance(mutations, dict) or not mutations:
        return [("", "must be a non-empty object: parameter -> {values} or {low, high} or {factor}")]
    problems = []
    for name, rule in mutations.items():
        if not isinstance(rule, dict):
            problems.append((name, "must be {values: [...]}, {low, high} or {factor: [...]}"))
            continue
        unknown = set(rule) - {"values", "low", "high", "log", "factor"}
        factors = rule.get("factor")
        if unknown:
            problems.append((name, f"unknown key(s) {', '.join(sorted(map(str, unknown)))}"))
        elif "values" in rule:
            if set(rule) != {"values"} or not isinstance(rule["values"], list) or not rule["values"]:
                problems.append((name, "{values: [...]} takes a non-empty list and nothing else"))
        elif "low" in rule or "high" in rule:
            low, high = rule.get("low"), rule.get("high")
            if not (_is_number(low) and _is_number(high) and math.isfinite(low) and math.isfinite(high)
                    and low < high):
                problems.append((name, "low and high must be finite numbers with low < high"))
            elif not isinstance(rule.get("log", False), bool) or (rule.get("log") and low <= 0):
                problems.append((name, "log must be true or false, and low more than 0 when true"))
            elif factors is not None and not _factors_ok(factors):
                problems.append((name, "factor must be a non-empty list of positive numbers"))
        elif not _factors_ok(factors) or "log" in rule:
            problems.append((name, "must be {values: [...]}, {low, high} or {factor: [positive numbers]}"))
    return problems


def _factors_ok(factors: Any) -> bool:
    return isinstance(factors, list) and bool(factors) and all(
        _is_number(f) and math.isfinite(f) and f > 0 for f in factors)


def explore(config: dict[str, Any], mutations: dict[str, Any], resample_probability: float,
            rng: random.Random) -> dict[str, Any]:
    """PBT's explore step on a copy of ``config``, drawing from ``rng`` in the order Ray's ``_explore`` draws:
    for each mutation in order, first the resample coin, then the new value or the perturbation.

    - ``{"values"}``: resample (or the current value is not listed): a random value; else the left or right
      neighbour (clamped at the ends);
    - ``{"low", "high"}``: resample (or the current value is not a number): uniform (log-uniform with ``log``) in
      the range; else times a random factor (``factor`` or Ray's 1.2/0.8), clipped to the range (Ray does not
      clip);
    - ``{"factor"}``: times a random factor (no coin: there is nothing to resample from);
    - a value that was an integer stays one (truncated, as Ray does).
    """
    new = copy.deepcopy(config)
    for name, rule in mutations.items():
        current = config.get(name)
        if "values" in rule:
            values = rule["values"]
            if rng.random() < resample_probability or current not in values:
                new[name] = copy.deepcopy(rng.choice(values))
            else:
                index = values.index(current) + rng.choice([-1, 1])
                new[name] = copy.deepcopy(values[min(max(index, 0), len(values) - 1)])
            continue
        factors = rule.get("factor", list(PERTURBATION_FACTORS))
        if "low" in rule:
            low, high = rule["low"], rule["high"]
            if rng.random() < resample_probability or not _is_number(current):
                if rule.get("log"):
                    value = math.exp(rng.uniform(math.log(low), math.log(high)))
                else:
                    value = rng.uniform(low, high)
            else:
                value = current * rng.choice(factors)
            value = min(max(value, low), high)
            if _is_int(current):
                value = min(max(int(value), math.ceil(low)), math.floor(high))
        elif _is_number(current):
            value = current * rng.choice(factors)
            if _is_int(current):
                value = int(value)
        else:
            continue  # nothing to multiply
        new[name] = value
    return new


class PBT(TrialScheduler):
    """Population based training (Jaderberg et al., 2017), asynchronous, as Ray's ``PopulationBasedTraining``.

    A trial is *at a perturbation step* when ``perturbation_interval`` iterations have passed since its last one
    (so at iterations ``interval, 2 * interval, ...``); only then its score is updated (its ``last_score``, as in
    Ray). The live trials with a score are ranked (invalid scores lowest, ties in the order added); with ``n`` of
    them (at least 2), the bottom and top quantiles hold ``ceil(n * quantile_fraction)`` trials each, at most
    ``floor(n / 2)``. A trial at its step in the bottom quantile gets ``Decision(CONTINUE, exploit=<a top trial,
    drawn from the seeded generator>, config=<that trial's config explored: :func:`explore`>)``: it should load
    that trial's latest checkpoint and run on with the new config, which becomes its config here. ``rungs()``
    lists the exploit steps.

    Where it differs from Ray: no exploit at ``max_iterations`` (the trial is done); the exploited trial keeps its
    own iteration count (Ray takes the donor's, since iterations here are the trial's own results); the donor's
    *latest* checkpoint is used (Ray uses the one saved at the donor's last step in the top quantile, and skips
    the exploit when there is none); ranges clip perturbed values; no burn-in, no synchronous mode.
    """

    name = "pbt"
    title = "PBT"

    def __init__(self, *, mode: str = "max", max_iterations: int = 10, perturbation_interval: int = 4,
                 quantile_fraction: float = 0.25, hyperparam_mutations: dict[str, Any] | None = None,
                 resample_probability: float = 0.25, seed: int = 0):
        super().__init__(mode=mode, max_iterations=max_iterations)
        self.perturbation_interval = _check_int("perturbation_interval", perturbation_interval, 1)
        if not _is_number(quantile_fraction) or not 0 <= quantile_fraction <= 0.5:
            raise ValueError(f"quantile_fraction must be between 0 and 0.5, got {quantile_fraction!r}")
        if not _is_number(resample_probability) or not 0 <= resample_probability <= 1:
            raise ValueError(f"resample_probability must be between 0 and 1, got {resample_probability!r}")
        if problems := mutation_problems(hyperparam_mutations):
            raise ValueError("hyperparam_mutations: " + "; ".join(f"{name}: {message}" if name else message
                                                                   for name, message in problems))
        self.quantile_fraction = float(quantile_fraction)
        self.resample_probability = float(resample_probability)
        self.hyperparam_mutations = copy.deepcopy(hyperparam_mutations)
        self.last_perturbation: dict[str, int] = {}
        self.last_score: dict[str, float | None] = {}
        self.exploits: list[dict[str, Any]] = []
        self._rng = random.Random(seed)

    def quantiles(self) -> tuple[list[str], list[str]]:
        """The bottom and the top quantile of the live trials with a score (worst first in both)."""
        ranked = [trial for trial, entry in self.trials.items()
                  if trial in self.last_score and entry["status"] in LIVE]
        ranked.sort(key=lambda trial: (self.last_score[trial] is not None, self.last_score[trial] or 0.0))
        if len(ranked) <= 1:
            return [], []
        count = min(_ceil(len(ranked) * self.quantile_fraction), len(ranked) // 2)
        if count <= 0:
            return [], []
        return ranked[:count], ranked[-count:]

    def _on_result(self, trial_id: str, iteration: int, score: float | None) -> Decision:
        if iteration - self.last_perturbation.get(trial_id, 0) < self.perturbation_interval:
            return CONTINUE
        self.last_perturbation[trial_id] = iteration
        self.last_score[trial_id] = score
        lower, upper = self.quantiles()
        if trial_id not in lower or iteration >= self.max_iterations:
            return CONTINUE
        donor = self._rng.choice(upper)
        config = explore(self.trials[donor]["config"], self.hyperparam_mutations, self.resample_probability,
                         self._rng)
        self.trials[trial_id]["config"] = copy.deepcopy(config)
        self.exploits.append({"iteration": iteration, "trial": trial_id, "from": donor,
                              "config": copy.deepcopy(config)})
        return Decision(Action.CONTINUE, f"iteration {iteration}: {_show(self.unscore(score))} in the bottom "
                                         f"{self.quantile_fraction:g}; takes the weights of trial {donor} (in the "
                                         "top) and an explored copy of its config", exploit=donor, config=config)

    def rungs(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.exploits)


# -- by name ---------------------------------------------------------------------------------------------------
SCHEDULERS: dict[str, type[TrialScheduler]] = {
    cls.name: cls for cls in (FIFO, ASHA, Hyperband, SuccessiveHalving, MedianStopping, PBT)}

# name -> option -> (type, default, description); a default of None: see the description.
SCHEDULER_OPTIONS: dict[str, dict[str, tuple[type, Any, str]]] = {
    "fifo": {},
    "asha": {"grace_period": (int, 1, "iterations before the first rung (at most max_iterations)"),
             "reduction_factor": (float, 3.0, "eta (more than 1): a rung keeps the top 1/eta"),
             "brackets": (int, 1, "brackets; bracket s starts at grace_period * eta**s, joined by Ray's softmax"),
             "seed": (int, None, "seed of the bracket draw (default: the sweep's seed)")},
    "hyperband": {"grace_period": (int, 1, "the fewest iterations a bracket starts with"),
                  "reduction_factor": (float, 3.0, "eta (more than 1)")},
    "sh": {"grace_period": (int, 1, "iterations of the first rung (at most max_iterations)"),
           "reduction_factor": (float, 3.0, "eta (more than 1): each rung keeps the best 1/eta"),
           "num_trials": (int, None, "trials in the bracket (default: the sweep's trial budget)")},
    "median": {"grace_period": (int, 1, "iterations before a trial can be stopped, and where running means start"),
               "min_samples_required": (int, 3, "other trials needed to take a median")},
    "pbt": {"perturbation_interval": (int, 4, "iterations between a trial's exploit/explore steps "
                                              "(less than max_iterations)"),
            "quantile_fraction": (float, 0.25, "the bottom and top fractions, 0 to 0.5"),
            "hyperparam_mutations": (dict, None, "required: parameter -> {values: [...]}, {low, high, log?, "
                                                 "factor?} or {factor: [...]}"),
            "resample_probability": (float, 0.25, "chance to resample instead of perturb, 0 to 1"),
            "seed": (int, None, "seed of the exploration (default: the sweep's seed)")},
}
REQUIRED_OPTIONS = {"pbt": ("hyperparam_mutations",)}
# Older option names, still accepted: name -> old -> new.
OPTION_ALIASES: dict[str, dict[str, str]] = {
    "median": {"min_samples": "min_samples_required"},
    "pbt": {"interval": "perturbation_interval", "quantile": "quantile_fraction", "mutations": "hyperparam_mutations"},
}


def _option_problem(option: str, value: Any, max_iterations: int | None) -> str | None:
    """What is wrong with one option's value (by its canonical name), or None."""
    if option in {"grace_period", "brackets", "num_trials", "min_samples_required", "perturbation_interval",
                  "seed"}:
        low = 0 if option == "seed" else 1
        if not _is_int(value) or value < low:
            return f"must be an integer of at least {low}"
        if option == "seed" and value > 2**32 - 1:
            return "must be at most 2**32 - 1"
        if option == "grace_period" and max_iterations is not None and value > max_iterations:
            return f"must be at most max_iterations ({max_iterations})"
        if option == "perturbation_interval" and max_iterations is not None and value >= max_iterations:
            return f"must be less than max_iterations ({max_iterations}), or PBT never exploits"
        return None
    if option in {"reduction_factor", "quantile_fraction", "resample_probability"}:
        if not _is_number(value) or not math.isfinite(value):
            return "must be a number"
        if option == "reduction_factor" and value <= 1:
            return "must be more than 1"
        if option == "quantile_fraction" and not 0 <= value <= 0.5:
            return "must be between 0 and 0.5"
        if option == "resample_probability" and not 0 <= value <= 1:
            return "must be between 0 and 1"
        return None
    return None


def options_problems(name: Any, options: Any, field: str = "spec.scheduler", *,
                     max_iterations: int | None = None) -> list[tuple[str, str]]:
    """Every problem of a scheduler name and its options, as ``(field, message)``: unknown options, bad values
    (with ``max_iterations``, also the bounds that depend on it), a required option missing, an option given
    under both its old and its new name. A mutation's problem is named down to its parameter. An option of None
    (JSON null) takes its default."""
    if not isinstance(name, str) or name not in SCHEDULER_OPTIONS:
        return [(f"{field}.name", f"must be one of {', '.join(SCHEDULER_OPTIONS)}")]
    if options is None:
        options = {}
    if not isinstance(options, dict):
        return [(f"{field}.options", "must be an object")]
    known, aliases = SCHEDULER_OPTIONS[name], OPTION_ALIASES.get(name, {})
    problems = []
    for key, value in options.items():
        where = f"{field}.options.{key}"
        option = aliases.get(key, key)
        if option not in known:
            problems.append((where, f"unknown option of {name}; allowed: {', '.join(known) or 'none'}"))
        elif option != key and option in options:
            problems.append((where, f"the old name of {option}, which is given too: give one"))
        elif value is None:
            continue  # its default
        elif option == "hyperparam_mutations":
            problems.extend((f"{where}.{param}" if param else where, message)
                            for param, message in mutation_problems(value))
        elif message := _option_problem(option, value, max_iterations):
            problems.append((where, message))
    given = {aliases.get(key, key) for key, value in options.items() if value is not None}
    for option in REQUIRED_OPTIONS.get(name, ()):
        if option not in given:
            problems.append((f"{field}.options.{option}", f"required: {known[option][2].removeprefix('required: ')}"))
    return problems


def normalize_options(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The options under their current names (older names renamed)."""
    aliases = OPTION_ALIASES.get(name, {})
    return {aliases.get(key, key): value for key, value in (options or {}).items()}


def make_scheduler(name: str, *, mode: str, max_iterations: int, seed: int | None = 0,
                   **options: Any) -> TrialScheduler:
    """A scheduler by name with its options, checked first (ValueError naming every bad one). ``seed`` seeds the
    schedulers that draw (ASHA with several brackets, PBT); an option ``seed`` is this argument. Options of None
    take their defaults."""
    seeded = isinstance(name, str) and "seed" in SCHEDULER_OPTIONS.get(name, {})
    if seeded and seed is not None:
        options["seed"] = seed
    problems = options_problems(name, options, max_iterations=max_iterations)
    if problems:
        raise ValueError("; ".join(f"{where}: {message}" for where, message in problems))
    options = {key: value for key, value in normalize_options(name, options).items() if value is not None}
    return SCHEDULERS[name](mode=mode, max_iterations=max_iterations, **options)
