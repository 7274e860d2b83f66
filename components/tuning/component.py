"""The ``tune`` job on the node: the Fluid execution engine.

The tune job's attempt holds the job's GPUs (``resources``: what the team's quota counts) and runs this engine
in a child process. Every trial is a *nested* child job (a job of the trainable's kind with the trial's
parameters substituted into its spec) that the control plane places inside the tune job's own allocation. The
engine:

1. asks the searcher (Optuna) for configurations while fewer than ``max_concurrent`` trials run and the trial
   scheduler takes more, and submits each as a nested child (idempotently: a restarted engine finds its trials);
2. watches each trial's ``metric`` (one point per iteration, e.g. per epoch) through ``ctx.children.metrics_of``
   (one call for all live trials every ``POLL_SECONDS``) and feeds it to the scheduler: STOP cancels the trial, PAUSE holds it at its rung, a promotion releases it;
3. water-fills the job's GPUs over the live trials (:mod:`components.tuning.waterfill`) from each trial's
   measured seconds per iteration and iterations left, whenever the set of trials or what is known of their
   speed changes, and resizes the trials whose share changed (they checkpoint and resume with the new share);
4. checkpoints its own state (searcher log, scheduler state, trials) so a new attempt of the tune job (after a
   node loss, say) carries on where it was, and reports ``best_<metric>``, ``trials_done`` and
   ``trials_running`` as metrics;
5. ends when every trial has ended, writing ``trials.json`` (every trial: parameters, state, values, shares over
   time) and ``best.json`` (the best trial's job id, which a ``serve`` job can read its model from).
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.runtime.contract.context import Context
from components.tuning.schedulers import Action, make_scheduler
from components.tuning.space import substitute
from components.tuning.waterfill import Bounds, allocate, grow

ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}
# How often the engine reads its trials' new results (one call for all of them): a trial's result reaches the
# scheduler within this plus its report interval, and a freed slot is refilled in the same tick.
POLL_SECONDS = 0.25


@dataclass
class Trial:
    number: int
    params: dict[str, Any]
    job: str = ""
    status: str = "running"  # running, paused, stopped, completed, failed
    values: list[list[float]] = field(default_factory=list)  # [iteration, value, unix time]
    cursor: int = 0
    share: float = 0.0
    shares: list[list[float]] = field(default_factory=list)  # [unix time, share]
    reason: str = ""
    jobs: list[str] = field(default_factory=list)  # earlier child jobs of this trial (PBT: one per exploit)
    base: int = 0  # values[base:] came from the current job (its steps restart where its checkpoint was)
    exploits: list[dict[str, Any]] = field(default_factory=list)  # PBT: {"iteration", "from", "params", "job"}

    @property
    def iterations(self) -> int:
        return len(self.values)

    def best(self, mode: str) -> float | None:
        values = [value for _, value, _ in self.values]
        if not values:
            return None
        return max(values) if mode == "max" else min(values)

    def seconds_per_iteration(self) -> float | None:
        """Measured wall seconds per iteration at the trial's share (from the last points), or None."""
        times = [at for _, _, at in self.values]
        if len(times) >= 2:
            return max((times[-1] - times[0]) / (len(times) - 1), 1e-3)
        return None


class Engine:
    """One tune attempt's loop. ``clock``/``sleep`` are injectable for tests; everything else goes through
    ``ctx``, so the same code runs against the real control plane or a test's context."""

    def __init__(self, ctx: Context, spec: dict[str, Any], *, poll: float = POLL_SECONDS, clock=time.time,
                 sleep=time.sleep):
        from components.tuning.searchers import Searcher

        self.ctx, self.spec, self.poll, self.clock, self.sleep = ctx, spec, poll, clock, sleep
        self.mode, self.metric = spec["mode"], spec["metric"]
        self.searcher = Searcher(spec["searcher"]["name"], spec["space"], mode=self.mode, seed=spec["seed"],
                                 budget=spec["trials"])
        options = dict(spec["scheduler"]["options"])
        if spec["scheduler"]["name"] == "sh":
            options.setdefault("num_trials", self.searcher.budget)
        options.pop("seed", None)  # the sweep's seed seeds the schedulers that draw (ASHA brackets, PBT)
        self.scheduler = make_scheduler(spec["scheduler"]["name"], mode=self.mode, seed=spec["seed"],
                                        max_iterations=spec["max_iterations"], **options)
        self.budget = sum(device.share for device in ctx.devices) or 1.0
        self.bounds = Bounds(low=1 / spec["packing"], high=float(spec["max_gpus_per_trial"]))
        self.trials: dict[int, Trial] = {}
        self.exhausted = False
        self.layout: tuple = ()
        self.started = self.clock()

    # -- state -------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"format": 1, "searcher": self.searcher.state(), "scheduler": self.scheduler.state(),
                "trials": [asdict(trial) for trial in self.trials.values()], "exhausted": self.exhausted}

    def restore(self, state: dict[str, Any]) -> None:
        self.searcher.restore(state["searcher"])
        self.scheduler.restore(state["scheduler"])
        self.trials = {entry["number"]: Trial(**entry) for entry in state["trials"]}
        self.exhausted = bool(state.get("exhausted"))
        self.ctx.log(f"resumed the sweep: {len(self.trials)} trials known, "
                     f"{sum(t.status in {'running', 'paused'} for t in self.trials.values())} live")

    def save(self) -> None:
        self.ctx.checkpoint({"tune": json.dumps(self.state())})

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        saved = self.ctx.restore()
        if saved and "tune" in saved:
            self.restore(json.loads(saved["tune"]))
        self.ctx.log(f"sweep: {self.spec['trials']} trials of {self.spec['trainable']['kind']}, searcher "
                     f"{self.spec['searcher']['name']}, scheduler {self.spec['scheduler']['name']}, "
                     f"{self.budget:g} GPU shared (at most {self.bounds.per_gpu} trials per GPU)")
        while True:
            if self.ctx.should_stop():
                self.save()
                self.ctx.log("stopping the sweep (its trials keep their checkpoints)")
                return self.summary()
            changed = self.watch()  # first: trials that ended free room for the next ones at once
            changed |= self.fill()
            changed |= self.rebalance()
            if changed:
                self.save()
                self.report()
            if self.finished():
                break
            self.sleep(self.poll)
        self.save()
        self.report()
        return self.finish()

    def live(self) -> list[Trial]:
        return [trial for trial in self.trials.values() if trial.status in {"running", "paused"}]

    def finished(self) -> bool:
        return self.exhausted and not self.live()

    def fill(self) -> bool:
        """Start new trials while there is room."""
        changed = False
        room = min(self.spec["max_concurrent"], max(1, int(self.budget * self.spec["packing"] + 1e-9)))
        while len([t for t in self.live() if t.status == "running"]) < room and not self.exhausted:
            trial = self.propose()
            if trial is None:
                break
            self.submit(trial)
            changed = True
        return changed

    def propose(self) -> Trial | None:
        """The searcher's next trial, registered with the scheduler; None (and the sweep sealed) when the searcher
        or the scheduler's capacity has no more."""
        capacity = self.scheduler.capacity()
        proposal = self.searcher.ask() if capacity is None or capacity > 0 else None
        if proposal is None:
            self.exhausted = True
            if hasattr(self.scheduler, "seal"):
                self.scheduler.seal()
            self.apply_resumes()
            return None
        number, params = proposal
        trial = Trial(number, params)
        self.trials[number] = trial
        self.scheduler.add(str(number), params)
        return trial

    def child_body(self, number: int, params: dict[str, Any], share: float) -> dict[str, Any]:
        """Trial ``number``'s child job: the trainable's kind with ``params`` substituted into its spec."""
        trainable = self.spec["trainable"]
        spec = substitute(trainable["spec"], params)
        spec[self.spec["iterations_field"]] = self.spec["max_iterations"]
        if self.spec.get("data"):  # the sweep's data options: its trials share one preparation of their data
            spec.setdefault("data", copy.deepcopy(self.spec["data"]))
        return {"kind": trainable["kind"], "name": f"trial-{number}", "spec": spec, "resources": {"gpus": share},
                "max_attempts": self.spec["trial_max_attempts"], "time_limit": self.spec["trial_time_limit"]}

    def submit(self, trial: Trial) -> None:
        share = self.initial_share()
        body = self.child_body(trial.number, trial.params, share)
        summary = self.ctx.children.submit(body, f"{self.ctx.job_id}:trial:{trial.number}", nested=True)
        trial.job, trial.share = summary["id"], share
        trial.shares.append([self.clock(), share])
        self.ctx.log(f"trial {trial.number} ({trial.job}): {json.dumps(trial.params, sort_keys=True)}, "
                     f"{share:g} GPU")

    def initial_share(self) -> float:
        """An equal share among the trials expected to run at once (the running ones and those still to come, up
        to max_concurrent), so a sweep's first trials are not all resized as the next ones arrive."""
        running = sum(t.status == "running" and bool(t.job) for t in self.trials.values())
        to_come = max(self.searcher.budget - len(self.trials), 0) + 1
        expected = max(1, min(self.spec["max_concurrent"], running + to_come))
        shares = allocate({str(i): None for i in range(expected)}, self.budget, self.bounds)
        return max(min(share for share in shares.values() if share > 0), self.bounds.low)

    def watch(self) -> bool:
        """Read new results of every live trial and act on the scheduler's decisions."""
        changed = False
        live = [trial for trial in self.live() if trial.job]
        try:  # one call for every live trial
            answers = self.ctx.children.metrics_of({trial.job: trial.cursor for trial in live})
        except Exception as error:  # noqa: BLE001 - a lost poll is retried at the next tick
            self.ctx.log(f"could not read the trials: {error}", level="warning")
            return False
        for trial in live:
            seen = answers.get(trial.job)
            if seen is None:
                continue
            trial.cursor = seen.get("cursor", trial.cursor)
            steps = {int(v[0]) for v in trial.values[trial.base:]}
            for point in seen.get("points", []):
                if point["name"] != self.metric or trial.status not in {"running"}:
                    continue
                if point["step"] in steps:
                    continue
                steps.add(point["step"])
                decision, iteration = self.observe(trial, point["step"], point["value"], point.get("time"))
                changed = True
                if decision.action is Action.STOP and iteration >= self.spec["max_iterations"]:
                    break  # it has done every iteration: it completes (its top rung judged it, nothing to stop)
                if decision.action is Action.STOP:
                    self.end(trial, "stopped", decision.reason)
                    break
                if decision.action is Action.PAUSE:
                    trial.status, trial.reason = "paused", decision.reason
                    self.ctx.children.hold(trial.job, decision.reason)
                    break
                if decision.exploit is not None and self.exploit(trial, decision):
                    seen = {}  # the old job's state is no longer the trial's
                    break
            state = seen.get("state")
            if trial.status in {"running", "paused"} and state in ENDED:
                if state == "SUCCEEDED":
                    self.end(trial, "completed", "finished its iterations")
                elif trial.status != "stopped":
                    self.end(trial, "failed", seen.get("reason", state))
                changed = True
        changed |= self.apply_resumes()
        return changed

    def observe(self, trial: Trial, step: float, value: float, at: float | None) -> tuple[Any, int]:
        """Record one result of the sweep's metric (the trial's next iteration) and ask the scheduler; returns
        (its decision, the iteration)."""
        iteration = trial.iterations + 1
        trial.values.append([float(step), float(value), float(at or 0)])
        self.searcher.report(trial.number, iteration, float(value))
        return self.scheduler.result(str(trial.number), iteration, float(value)), iteration

    def exploit(self, trial: Trial, decision: Any) -> bool:
        """PBT's exploit and explore: the trial goes on as a new child job that starts from a copy of the donor
        trial's latest checkpoint, with the explored config; its old job is cancelled. Returns False (the trial
        goes on unchanged) when the donor has no checkpoint yet."""
        donor = self.trials[int(decision.exploit)]
        params = dict(decision.config)
        generation = len(trial.jobs) + 1
        try:
            summary = self.ctx.children.submit(self.child_body(trial.number, params, trial.share),
                                            f"{self.ctx.job_id}:trial:{trial.number}:{generation}", nested=True,
                                            checkpoint_from=donor.job)
        except ValueError as error:
            self.scheduler.trials[str(trial.number)]["config"] = dict(trial.params)
            self.ctx.log(f"trial {trial.number} keeps its weights: {error}", level="warning")
            return False
        old = trial.job
        self.ctx.children.cancel(old, f"replaced by {self.scheduler.title} at iteration {trial.iterations}: the trial "
                                      f"goes on from trial {donor.number}'s weights")
        trial.jobs.append(old)
        trial.job, trial.params, trial.cursor, trial.base = summary["id"], params, 0, len(trial.values)
        trial.reason = decision.reason
        trial.exploits.append({"iteration": trial.iterations, "from": donor.number, "params": params,
                               "job": trial.job})
        self.ctx.log(f"trial {trial.number} ({trial.job}) takes trial {donor.number}'s weights at iteration "
                     f"{trial.iterations}: {json.dumps(params, sort_keys=True)}")
        return True

    def apply_resumes(self) -> bool:
        changed = False
        for number, _target in self.scheduler.resume():
            trial = self.trials[int(number)]
            trial.status, trial.reason = "running", "promoted"
            self.resume_child(trial)
            changed = True
        for trial in list(self.live()):  # synchronous rungs stop the trials they did not promote
            if self.scheduler.trials.get(str(trial.number), {}).get("status") == "stopped":
                self.end(trial, "stopped", "not promoted at its rung")
                changed = True
        return changed

    def end(self, trial: Trial, status: str, reason: str) -> None:
        trial.status, trial.reason = status, reason
        best = trial.best(self.mode)
        if status == "completed":
            self.scheduler.complete(str(trial.number))
            last = trial.values[-1][1] if trial.values else None
            self.searcher.tell(trial.number, last, state="complete" if last is not None else "failed")
        elif status == "stopped":
            if self.scheduler.trials[str(trial.number)]["status"] == "running":
                self.scheduler.stop(str(trial.number))
            self.searcher.tell(trial.number, best, state="pruned")
            self.stop_child(trial)
        else:
            self.scheduler.fail(str(trial.number))
            self.searcher.tell(trial.number, None, state="failed")
        trial.shares.append([self.clock(), 0.0])
        trial.share = 0.0
        self.ctx.log(f"trial {trial.number} {status} after {trial.iterations} iteration(s): {reason}")

    def stop_reason(self, trial: Trial) -> str:
        """What a stopped trial's job shows as its reason (its page, ``strata jobs``): who stopped it, when, why."""
        text = f"stopped early by {self.scheduler.title} at iteration {trial.iterations}"
        return f"{text}: {trial.reason}"[:300] if trial.reason else text

    def stop_child(self, trial: Trial) -> None:
        """The scheduler stopped ``trial``: cancel its job, saying why."""
        self.ctx.children.cancel(trial.job, self.stop_reason(trial))

    def resume_child(self, trial: Trial) -> None:
        """The scheduler promoted the paused ``trial``: let its job be placed again."""
        self.ctx.children.release(trial.job, "promoted to the next rung")

    def rebalance(self) -> bool:
        """Give freed GPUs to the running trials furthest behind, once no trial waits to start.

        While trials are still to come, freed capacity goes to them (``fill``). Once the searcher is done, the
        running trials with more than one iteration left grow to their water-filled shares (``waterfill.grow``)
        as far as the free GPUs cover, largest shortfall first; nobody is shrunk, since each resize restarts a
        trial from its checkpoint. Checked whenever the set of running trials, or what is known of their speed,
        changes."""
        running = [t for t in self.trials.values() if t.status == "running" and t.job]
        known = tuple(sorted((t.number, t.seconds_per_iteration() is not None) for t in running))
        if known == self.layout or not running or not self.exhausted:
            self.layout = known
            return False
        self.layout = known
        movable = [t for t in running if self.scheduler.target(str(t.number)) - t.iterations > 1]
        work = {}
        for trial in movable:
            per_iteration = trial.seconds_per_iteration()
            left = max(self.scheduler.target(str(trial.number)) - trial.iterations, 1)
            # Work at width 1: measured seconds per iteration at its share, times that share.
            work[str(trial.number)] = per_iteration * max(trial.share, self.bounds.low) * left \
                if per_iteration is not None else None
        fixed = sum(t.share for t in running if t not in movable)
        shares = grow({str(t.number): t.share for t in movable}, work, self.budget - fixed, self.bounds)
        changed = False
        for trial in movable:
            share = shares.get(str(trial.number))
            if share is None or math.isclose(share, trial.share, abs_tol=1e-6):
                continue
            try:
                self.ctx.children.resize(trial.job, {"gpus": share}, f"water-filled: {share:g} GPU")
            except ValueError as error:
                self.ctx.log(f"could not resize trial {trial.number}: {error}", level="warning")
                continue
            self.ctx.log(f"trial {trial.number}: {trial.share:g} -> {share:g} GPU (water-filled)")
            trial.share = share
            trial.shares.append([self.clock(), share])
            changed = True
        return changed

    # -- results -----------------------------------------------------------------------------------------
    def best(self) -> Trial | None:
        done = [t for t in self.trials.values() if t.best(self.mode) is not None and t.status != "failed"]
        if not done:
            return None
        pick = max if self.mode == "max" else min
        return pick(done, key=lambda t: (t.best(self.mode), -t.number) if self.mode == "max"
                    else (t.best(self.mode), t.number))

    def report(self) -> None:
        done = sum(t.status in {"completed", "stopped", "failed"} for t in self.trials.values())
        values = {"trials_done": float(done), "trials_running": float(sum(t.status == "running"
                                                                          for t in self.trials.values()))}
        best = self.best()
        if best is not None:
            values[f"best_{self.metric}"] = float(best.best(self.mode))
        self.ctx.metrics(values, step=len(self.trials))
        self.ctx.report("tuning", self.table())

    def table(self) -> dict[str, Any]:
        """The sweep as the ``tuning`` attempt report carries it (the job's ``trials`` route and panels read it):
        every trial with its parameters, state, values per iteration and shares over time (the newest 100 of
        each), the best so far and the scheduler's rungs."""
        best = self.best()
        trials = []
        for trial in sorted(self.trials.values(), key=lambda t: t.number):
            trials.append({"number": trial.number, "job": trial.job, "params": trial.params, "status": trial.status,
                           "iterations": trial.iterations, "best": trial.best(self.mode),
                           "last": trial.values[-1][1] if trial.values else None, "share": trial.share,
                           "reason": trial.reason[:300],
                           "values": [[index + 1, value] for index, (_, value, _) in enumerate(trial.values)][-100:],
                           "shares": trial.shares[-100:], "jobs": trial.jobs[-100:],
                           "exploits": trial.exploits[-100:]})
        return {"metric": self.metric, "mode": self.mode, "budget": self.budget, "trials": trials,
                "best": {"number": best.number, "job": best.job, "params": best.params,
                         "value": best.best(self.mode)} if best else None,
                "rungs": self.scheduler.rungs()[:1000]}

    def summary(self) -> dict[str, Any]:
        best = self.best()
        return {"trials": len(self.trials), "best_trial": best.number if best else None,
                "best_job": best.job if best else None, "best_value": best.best(self.mode) if best else None,
                "best_params": best.params if best else None, "metric": self.metric, "mode": self.mode,
                "seconds": round(self.clock() - self.started, 3)}

    def finish(self) -> dict[str, Any]:
        summary = self.summary()
        with tempfile.TemporaryDirectory() as directory:
            trials = Path(directory) / "trials.json"
            trials.write_text(json.dumps({"metric": self.metric, "mode": self.mode,
                                          "trials": [asdict(t) for t in self.trials.values()],
                                          "rungs": self.scheduler.rungs()}, indent=1))
            self.ctx.artifact(trials)
            best = Path(directory) / "best.json"
            best.write_text(json.dumps(summary, indent=1))
            self.ctx.artifact(best)
        if summary["best_job"]:
            self.ctx.log(f"best trial {summary['best_trial']} (job {summary['best_job']}): {self.metric} "
                         f"{summary['best_value']:.4g} with {json.dumps(summary['best_params'], sort_keys=True)}")
        else:
            self.ctx.log("no trial reported the metric", level="warning")
        return summary
