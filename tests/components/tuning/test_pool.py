"""The sweep on warm trial runners (components/tuning/pool.py, runners.py): real runner processes train real
trials one after another, each recorded as its own child job (submitted, started, reported and ended in batches),
with its checkpoint and model stored on its job, and a trial cancelled through the API stops."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest

from components.runtime.contract.context import DeviceHandle, LocalChildren, LocalContext
from components.runtime.contract.spec import SpecError
from components.tuning.pool import RunnerEngine, runners_per_gpu
from components.tuning.spec import TuneSpec

VIRTUAL = DeviceHandle("virtual", 0, 2**30, 1.0)
CUDA = DeviceHandle("cuda", 0, 2**34, 1.0)


def sweep(**overrides):
    spec = {"space": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.05}},
            "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}", "batch_size": 128}},
            "trials": 4, "max_iterations": 2, "searcher": {"name": "random"}, "seed": 0,
            "scheduler": {"name": "asha", "options": {"grace_period": 1, "reduction_factor": 2}}}
    spec.update(overrides)
    return TuneSpec().validate(spec)


def test_runners_per_gpu_follow_the_devices_unless_the_spec_says():
    assert runners_per_gpu(sweep(), [VIRTUAL, VIRTUAL]) == 1  # a virtual GPU is one core
    assert runners_per_gpu(sweep(packing=3), [CUDA]) == 3  # as many as may share a real GPU
    assert runners_per_gpu(sweep(runners=2), [VIRTUAL]) == 2
    assert runners_per_gpu(sweep(runners=0), [CUDA]) == 0  # every trial placed as a job of its own
    pbt = sweep(scheduler={"name": "pbt", "options": {"perturbation_interval": 1,
                                                      "hyperparam_mutations": {"lr": {"values": [0.01, 0.02]}}}})
    assert runners_per_gpu(pbt, [VIRTUAL]) == 0  # its exploit step starts jobs from other trials' checkpoints
    with pytest.raises(SpecError) as refused:
        sweep(runners=-1)
    assert "spec.runners" in str(refused.value.errors)


class CancellingChildren(LocalChildren):
    """Cancels the second trial's job "through the API" while it runs."""

    def batch(self, **parts):
        entries = [entry for entry in self.ctx.child_jobs if entry.get("by_parent")]
        if len(entries) > 1 and entries[1]["summary"]["state"] == "RUNNING" and not self.ctx.cancelled:
            self.cancel(entries[1]["summary"]["id"])  # while it runs: this call answers its state
            self.ctx.cancelled = entries[1]["summary"]["id"]
        return super().batch(**parts)


@dataclass
class Cluster(LocalContext):
    cancelled: str = ""

    def parts(self):
        _, *others = super().parts()
        return (CancellingChildren(self), *others)


def test_a_sweep_on_a_warm_runner_records_each_trial_as_a_job_of_its_own(tmp_path):
    import torch

    spec = sweep(max_iterations=6, trainable={"kind": "train", "spec": {  # trials of about a second
        "workload": "mlp-digits", "lr": "{{lr}}", "batch_size": 16}})
    ctx = Cluster(job_id="sweep", attempt_id="a1", spec=spec, workdir=tmp_path, devices=[VIRTUAL])
    engine = RunnerEngine(ctx, spec, per_gpu=1)
    summary = engine.run()
    children = {entry["summary"]["id"]: entry for entry in ctx.child_jobs}
    table = engine.table()
    assert summary["trials"] == 4 and len(children) == 4
    assert all(entry["by_parent"] and entry["job"]["resources"] == {"gpus": 1.0} for entry in children.values())
    # Every trial's job ended, as the sweep decided (or as the API said), with its points.
    for row in table["trials"]:
        entry = children[row["job"]]
        state = entry["summary"]["state"]
        if row["job"] == ctx.cancelled:
            assert state == "CANCELLED" and row["status"] == "stopped" and "outside the sweep" in row["reason"]
            continue
        assert {"completed": "SUCCEEDED", "stopped": "CANCELLED"}[row["status"]] == state, (row, state)
        if state == "CANCELLED":  # the job says who stopped it and when, not "cancelled by its parent <id>"
            assert entry["summary"]["reason"].startswith(f"stopped early by ASHA at iteration {row['iterations']}")
        names = {point["name"] for point in entry["points"]}
        assert "test_accuracy" in names and "loss" in names
        steps = sorted(point["step"] for point in entry["points"] if point["name"] == "test_accuracy")
        assert len(steps) == row["iterations"] >= 1
        # Its checkpoint is its job's (a real torch checkpoint of that trial), and a finished one has its model.
        checkpoint = torch.load(io.BytesIO(entry["files"][("checkpoint", "checkpoint.pt")]), weights_only=False)
        assert checkpoint["step"] == steps[-1]
        if state == "SUCCEEDED":
            assert ("artifact", "model.pt") in entry["files"] and row["iterations"] == 6
    assert ctx.cancelled and any(row["status"] == "completed" for row in table["trials"])
    assert summary["best_job"] in children and summary["best_value"] > 0.5
    # What running the trials cost outside their own code was measured per trial.
    platform = table["platform"]
    assert platform["runners"] == 1 and platform["trials_measured"] == 4 and platform["per_trial_s"] >= 0
    assert platform["batches"] >= 2
    assert engine.read_state()["trials"]  # the engine's own checkpoint (JSON, no torch), read back
