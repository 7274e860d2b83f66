"""The Fluid engine (components/tuning/component.py) against a simulated cluster: a context whose nested children
are trials that advance with simulated time at a speed proportional to their share, reporting points of recorded
learning curves. The e2e test runs a real sweep on `strata up`; here the engine's decisions are checked exactly."""

from __future__ import annotations

import json
import math

import pytest

from components.runtime.contract.context import Children, DeviceHandle, LocalContext
from components.tuning.component import Engine
from components.tuning.spec import TuneSpec

CURVES = json.loads((__import__("pathlib").Path(__file__).parent / "data" / "curves.json").read_text())["curves"]
NAMES = sorted(CURVES)


class SimulatedChildren(Children):
    """``ctx.children`` of the simulated cluster: the control plane's side, in SimulatedCluster."""

    def submit(self, job, idempotency_key=None, *, nested=False, checkpoint_from=None):
        return self.ctx.submit_child(job, idempotency_key, nested=nested, checkpoint_from=checkpoint_from)

    def cancel(self, job_id, reason=""):
        return self.ctx.cancel_child(job_id, reason)

    def hold(self, job_id, reason=""):
        return self.ctx.hold_child(job_id, reason)

    def release(self, job_id, reason=""):
        return self.ctx.release_child(job_id, reason)

    def resize(self, job_id, resources, reason=""):
        return self.ctx.resize_child(job_id, resources, reason)

    def metrics(self, job_id, after=0):
        return self.ctx.child_metrics(job_id, after)


class SimulatedCluster(LocalContext):
    """Nested children that run: a trial with params ``{"curve": i}`` follows curve i, one iteration every
    ``seconds / share`` simulated seconds (``seconds`` from its params, default 10)."""

    def __init__(self, workdir, gpus: float = 1.0, fail: set[int] | None = None):
        super().__init__(job_id="tune-job", attempt_id="a1", spec={}, workdir=workdir,
                         devices=[DeviceHandle(kind="virtual", index=i, memory=2**33, share=min(1.0, gpus - i))
                                  for i in range(math.ceil(gpus))])
        self.now = 1000.0
        self.kids: dict[str, dict] = {}
        self.next_point = 1
        self.fail = fail or set()
        self.peak = 0.0
        self.resizes = 0

    def parts(self):
        return (SimulatedChildren(self), *super().parts()[1:])

    # -- the control plane's side ---------------------------------------------------------------------------
    def submit_child(self, job, idempotency_key=None, *, nested=False, checkpoint_from=None):
        assert nested
        for kid in self.kids.values():
            if kid["key"] == idempotency_key:
                return self._summary(kid)
        progress = 0.0
        if checkpoint_from is not None:  # its checkpoint: the last whole iteration the donor did
            progress = math.floor(self.kids[checkpoint_from]["progress"])
            if progress < 1:
                raise ValueError(f"the child job was refused: checkpoint_from: job {checkpoint_from} has no "
                                 "checkpoint yet")
        kid = {"id": f"job-{len(self.kids)}", "key": idempotency_key, "spec": job["spec"],
               "resources": dict(job["resources"]), "state": "RUNNING", "held": False, "progress": progress,
               "points": [], "reason": "", "checkpoint_from": checkpoint_from}
        self.kids[kid["id"]] = kid
        return self._summary(kid)

    def _summary(self, kid):
        return {"id": kid["id"], "state": kid["state"], "reason": kid["reason"], "held": kid["held"],
                "resources": kid["resources"], "nested": True}

    def cancel_child(self, job_id, reason=""):
        self.kids[job_id]["state"], self.kids[job_id]["reason"] = "CANCELLED", reason
        return self._summary(self.kids[job_id])

    def hold_child(self, job_id, reason=""):
        kid = self.kids[job_id]
        kid["held"], kid["progress"] = True, math.floor(kid["progress"])
        if kid["state"] == "RUNNING":
            kid["state"] = "QUEUED"
        return self._summary(kid)

    def release_child(self, job_id, reason=""):
        kid = self.kids[job_id]
        kid["held"] = False
        if kid["state"] == "QUEUED":
            kid["state"] = "RUNNING"
        return self._summary(kid)

    def resize_child(self, job_id, resources, reason=""):
        kid = self.kids[job_id]
        kid["resources"], kid["progress"] = dict(resources), math.floor(kid["progress"])  # restart at a checkpoint
        self.resizes += 1
        return self._summary(kid)

    def child_metrics(self, job_id, after=0):
        kid = self.kids[job_id]
        return {**self._summary(kid), "points": [p for p in kid["points"] if p["id"] > after],
                "cursor": max([p["id"] for p in kid["points"]] + [after])}

    # -- simulated time -----------------------------------------------------------------------------------------
    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        running = [kid for kid in self.kids.values() if kid["state"] == "RUNNING"]
        used = sum(kid["resources"]["gpus"] for kid in running)
        self.peak = max(self.peak, used)
        for kid in running:
            spec = kid["spec"]
            curve = CURVES[NAMES[int(spec["curve"]) % len(NAMES)]]
            before = math.floor(kid["progress"])
            kid["progress"] += seconds * kid["resources"]["gpus"] / float(spec.get("seconds", 10))
            for iteration in range(before + 1, min(math.floor(kid["progress"]), spec["epochs"]) + 1):
                if int(spec["curve"]) in self.fail and iteration == 2:
                    kid["state"], kid["reason"] = "FAILED", "attempt 1 failed (boom)"
                    break
                kid["points"].append({"id": self.next_point, "name": "test_accuracy", "step": iteration * 100,
                                      "value": curve[iteration - 1], "time": self.now})
                self.next_point += 1
            if kid["state"] == "RUNNING" and kid["progress"] >= spec["epochs"]:
                kid["state"] = "SUCCEEDED"


def tune_spec(**overrides):
    spec = {"space": {"curve": {"type": "int", "low": 0, "high": 26}},
            "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "seed": "{{curve}}"}},
            "trials": 9, "max_iterations": 9, "searcher": {"name": "random"}, "seed": 1,
            "scheduler": {"name": "asha", "options": {"grace_period": 1, "reduction_factor": 3}}}
    spec.update(overrides)
    normalized = TuneSpec().validate(spec)
    # The simulated trial reads its curve and speed from its spec: same substitution as a real one.
    normalized["trainable"]["spec"] = {"curve": "{{curve}}", **overrides.get("sim", {})}
    return normalized


def run(ctx, spec, ticks=100_000):
    engine = Engine(ctx, spec, poll=1.0, clock=ctx.clock, sleep=ctx.sleep)
    return engine, engine.run()


def test_an_asha_sweep_ends_every_trial_and_names_the_best(tmp_path):
    ctx = SimulatedCluster(tmp_path, gpus=1.0)
    engine, summary = run(ctx, tune_spec())
    assert len(engine.trials) == 9
    statuses = {t.status for t in engine.trials.values()}
    assert statuses <= {"completed", "stopped"} and "completed" in statuses and "stopped" in statuses
    stopped = [t for t in engine.trials.values() if t.status == "stopped"]
    assert all(ctx.kids[t.job]["state"] == "CANCELLED" and t.iterations < 9 for t in stopped)
    # Each stopped trial's job says who stopped it, when and why (not "cancelled by its parent <id>").
    for trial in stopped:
        reason = ctx.kids[trial.job]["reason"]
        assert reason.startswith(f"stopped early by ASHA at iteration {trial.iterations}: rung "), reason
        assert "not in the top 1/3" in reason
    completed = [t for t in engine.trials.values() if t.status == "completed"]
    assert all(t.iterations == 9 and ctx.kids[t.job]["state"] == "SUCCEEDED" for t in completed)
    best = max((t for t in engine.trials.values()), key=lambda t: t.best("max"))
    assert summary["best_trial"] == best.number and summary["best_job"] == best.job
    assert ctx.peak <= 1.0 + 1e-9  # never more than the tune job's GPU
    saved = json.loads((tmp_path / "artifacts" / "trials.json").read_text())
    assert len(saved["trials"]) == 9 and saved["rungs"]
    assert json.loads((tmp_path / "artifacts" / "best.json").read_text())["best_job"] == best.job
    assert {"trials_done", "trials_running", "best_test_accuracy"} <= {name for name, _, _ in ctx.metric_points}
    done = [value for name, value, _ in ctx.metric_points if name == "trials_done"]
    assert done == sorted(done) and done[-1] == 9


def test_slower_trials_get_more_of_the_gpu(tmp_path):
    ctx = SimulatedCluster(tmp_path, gpus=1.0)
    spec = tune_spec(trials=2, max_concurrent=2, scheduler={"name": "fifo"}, max_iterations=6)
    spec["trainable"]["spec"] = {"curve": "{{curve}}", "seconds": "{{curve}}"}
    spec["space"] = {"curve": {"type": "choice", "values": [5, 20]}}
    spec["searcher"] = {"name": "grid"}
    engine, _ = run(ctx, spec)
    by_speed = {int(t.params["curve"]): t for t in engine.trials.values()}
    # After both were measured, the one needing 20 s an iteration got more than the one needing 5 s.
    slow = max(share for _, share in by_speed[20].shares)
    fast = min(share for _, share in by_speed[5].shares if share > 0)
    assert slow > fast and ctx.resizes >= 1
    assert all(t.status == "completed" for t in engine.trials.values())


def test_a_restarted_engine_resumes_without_resubmitting(tmp_path):
    ctx = SimulatedCluster(tmp_path, gpus=1.0)
    spec = tune_spec()
    first = Engine(ctx, spec, poll=1.0, clock=ctx.clock, sleep=ctx.sleep)
    calls = {"n": 0}

    def stop_after():
        calls["n"] += 1
        return calls["n"] > 40

    ctx.should_stop = stop_after  # the node lost: the attempt stops (checkpointed)
    first.run()
    submitted = len(ctx.kids)
    assert 0 < submitted <= 9
    ctx.should_stop = lambda: False
    second, summary = run(ctx, spec)
    assert len(second.trials) == 9 and len(ctx.kids) == 9  # the trials it knew were not submitted again
    assert {t.number for t in second.trials.values()} == set(range(9))
    assert summary["best_job"] is not None


def test_a_crashing_trial_is_recorded_failed_and_the_sweep_goes_on(tmp_path):
    ctx = SimulatedCluster(tmp_path, gpus=1.0, fail={3})
    spec = tune_spec(space={"curve": {"type": "choice", "values": [1, 3, 5, 7]}}, trials=4,
                     searcher={"name": "grid"}, scheduler={"name": "fifo"}, max_iterations=4)
    engine, summary = run(ctx, spec)
    failed = [t for t in engine.trials.values() if t.status == "failed"]
    assert [int(t.params["curve"]) for t in failed] == [3] and "boom" in failed[0].reason
    assert sum(t.status == "completed" for t in engine.trials.values()) == 3
    assert summary["best_job"] != failed[0].job


def test_successive_halving_holds_rungs_and_promotes_the_best(tmp_path):
    ctx = SimulatedCluster(tmp_path, gpus=1.0)
    spec = tune_spec(trials=9, max_iterations=9, scheduler={"name": "sh", "options": {"grace_period": 1}})
    engine, _ = run(ctx, spec)
    completed = [t for t in engine.trials.values() if t.status == "completed"]
    stopped = [t for t in engine.trials.values() if t.status == "stopped"]
    assert len(completed) == 1 and len(stopped) == 8
    # Stopped at the rungs (1 then 3 iterations), never in between.
    assert sorted(t.iterations for t in stopped) == [1] * 6 + [3] * 2  # 9 -> 3 -> 1, at rungs 1 and 3
    assert all(ctx.kids[t.job]["reason"].startswith(f"stopped early by successive halving at iteration "
                                                    f"{t.iterations}: ") for t in stopped)
    assert completed[0].iterations == 9


def test_the_same_seed_gives_the_same_sweep(tmp_path):
    def params(seed, where):
        ctx = SimulatedCluster(tmp_path / where, gpus=1.0)
        engine, _ = run(ctx, tune_spec(seed=seed))
        return [engine.trials[n].params for n in sorted(engine.trials)], [t.status for t in engine.trials.values()]

    assert params(4, "a") == params(4, "b")
    assert params(4, "a")[0] != params(5, "c")[0]


@pytest.mark.parametrize("gpus", [0.5, 2.0])
def test_shares_never_exceed_the_budget(tmp_path, gpus):
    ctx = SimulatedCluster(tmp_path, gpus=gpus)
    engine, _ = run(ctx, tune_spec(trials=12, max_concurrent=12))
    assert ctx.peak <= gpus + 1e-9
    assert all(t.status in {"completed", "stopped"} for t in engine.trials.values())


def test_pbt_trials_take_better_trials_weights_and_explored_configs(tmp_path):
    """PBT's exploit step: a trial in the bottom quantile goes on as a new child job that starts from the
    donor's checkpoint with the explored config; its old job is cancelled, and the sweep ends every trial."""
    ctx = SimulatedCluster(tmp_path, gpus=1.0)
    values = list(range(0, 26, 5))
    spec = tune_spec(space={"curve": {"type": "choice", "values": values}}, trials=6, max_concurrent=6,
                     max_iterations=9, scheduler={"name": "pbt", "options": {
                         "perturbation_interval": 2, "quantile_fraction": 0.34,
                         "hyperparam_mutations": {"curve": {"values": values}}}})
    engine, summary = run(ctx, spec)
    exploited = [t for t in engine.trials.values() if t.exploits]
    assert exploited, "someone in the bottom third must have been exploited"
    for trial in exploited:
        chain = [*trial.jobs, trial.job]
        assert len(chain) == len(trial.exploits) + 1
        for old, step in zip(chain[:-1], trial.exploits, strict=True):
            assert ctx.kids[old]["state"] == "CANCELLED"
            new = ctx.kids[step["job"]]
            donor = engine.trials[step["from"]]
            assert new["checkpoint_from"] in [*donor.jobs, donor.job]
            assert new["spec"]["curve"] == step["params"]["curve"]
        assert trial.params == trial.exploits[-1]["params"]
        # The trial's values go on across its jobs: its current job's points, each once, after the earlier ones.
        assert [value for _, value, _ in trial.values[trial.base:]] == \
            [point["value"] for point in ctx.kids[trial.job]["points"]]
        assert trial.base == trial.exploits[-1]["iteration"]
        assert trial.iterations >= trial.exploits[0]["iteration"] + 1
    assert all(t.status == "completed" for t in engine.trials.values())
    assert len(engine.scheduler.rungs()) == sum(len(t.exploits) for t in engine.trials.values())
    assert summary["best_job"] in {t.job for t in engine.trials.values()}
    assert ctx.peak <= 1.0 + 1e-9
    table = engine.table()
    assert any(row["exploits"] and row["jobs"] for row in table["trials"])


def test_pbt_without_a_donor_checkpoint_keeps_the_trials_weights(tmp_path):
    ctx = SimulatedCluster(tmp_path, gpus=1.0)
    spec = tune_spec(trials=2, max_iterations=4, scheduler={"name": "pbt", "options": {
        "perturbation_interval": 1, "quantile_fraction": 0.5,
        "hyperparam_mutations": {"curve": {"values": [1, 2]}}}})
    engine = Engine(ctx, spec, poll=1.0, clock=ctx.clock, sleep=ctx.sleep)
    original = ctx.submit_child

    def no_checkpoints(job, idempotency_key=None, *, nested=False, checkpoint_from=None):
        if checkpoint_from is not None:
            raise ValueError("the child job was refused: checkpoint_from: no checkpoint yet")
        return original(job, idempotency_key, nested=nested)

    ctx.submit_child = no_checkpoints
    engine.run()
    assert all(not t.exploits and not t.jobs and t.status == "completed" for t in engine.trials.values())
    assert any("keeps its weights" in message for _, _, message in ctx.logs)
    for trial in engine.trials.values():  # the scheduler's config is the trial's own again
        assert engine.scheduler.trials[str(trial.number)]["config"] == trial.params


def test_the_sweeps_data_options_reach_every_trial(tmp_path, install_plugins):
    """The shared-data hook: a tune job's ``data`` options (an installed data provider's) go into every trial's
    spec, so the trials prepare their data once; an option no provider takes is named at submit."""
    from components.runtime.contract.spec import SpecError

    install_plugins("tests.components.runtime.test_data:CACHE")
    spec = TuneSpec().validate({"space": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
                                "trainable": {"spec": {"workload": "mlp-digits", "lr": "{{lr}}"}},
                                "data": {"cache": True}, "trials": 2})
    assert spec["data"] == {"cache": True}
    ctx = SimulatedCluster(tmp_path)
    engine = Engine(ctx, spec, poll=1.0, clock=ctx.clock, sleep=ctx.sleep)
    assert engine.child_body(0, {"lr": 0.05}, 0.5)["spec"]["data"] == {"cache": True}
    with pytest.raises(SpecError) as caught:
        TuneSpec().validate({"space": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
                             "trainable": {"spec": {"workload": "mlp-digits", "lr": "{{lr}}"}},
                             "data": {"cache": "yes", "turbo": 1}})
    assert {"spec.data.cache", "spec.data.turbo"} <= set(caught.value.errors)
