"""PerFect through the train loop: phases as configured, chosen automatically on a constructed slow pipeline,
kept across a resume, stopped at the target, and a cache directory removed mid-job costing only recomputation."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from support import wait_for

from components.datacache import pipeline as pipelines
from components.datacache.source import Plan
from components.datacache.store import CacheStore
from components.runtime.contract.context import LocalContext
from components.train.component import TrainComponent
from components.train.spec import TrainSpec


def run_job(workdir: Path, definition, *, epochs: int = 6, **data):
    spec = TrainSpec().validate({"workload": "cnn-dataset", "epochs": epochs, "batch_size": 32, "hidden": 4,
                                 "log_every": 1000, "checkpoint_every": 1000,
                                 "data": {"dataset": {"name": "small", "definition": definition}, "workers": 0,
                                          **data}})
    ctx = LocalContext(job_id="job", attempt_id="a" * 32, spec=spec, workdir=workdir)
    TrainComponent().run(ctx)
    return ctx


def series(ctx: LocalContext, name: str) -> list[float]:
    return [value for metric, value, _ in ctx.metric_points if metric == name]


def test_plan_reuses_then_switches_as_configured():
    plan = Plan(10, {"reuse": 3, "switch": 0.6})
    assert plan.decided and (plan.reuse, plan.switch) == (3, 6)
    assert [plan.variant(e) for e in range(10)] == [0, 0, 0, 1, 1, 1, 6, 7, 8, 9]
    assert [plan.phase(e) for e in range(10)] == [1] * 6 + [2] * 4


def test_plan_decides_from_measured_throughput():
    slow = Plan(12, {})
    assert not slow.decided and slow.variant(0) == 0
    slow.decide(3.2)  # preprocessing an epoch takes 3.2x training one
    assert (slow.reuse, slow.switch) == (3, 9)  # the fine-tune phase gets ceil(12 / 4) = 3 epochs
    fast = Plan(12, {})
    fast.decide(1.1)
    assert (fast.reuse, fast.switch) == (1, 0) and [fast.phase(e) for e in range(12)] == [2] * 12
    capped = Plan(12, {"switch": 0.5})
    capped.decide(40.0)
    assert (capped.reuse, capped.switch) == (8, 6)


def test_a_gain_switch_follows_the_measured_reuse_gain():
    automatic = Plan(12, {})
    automatic.decide(3.2)
    assert not automatic.revise(1, 1.0) and automatic.switch == 9  # the default keeps the reuse factor's rule
    plan = Plan(12, {"switch": "gain"})
    plan.decide(3.2)
    assert plan.switch == 9
    # Reuse epochs took as long as building a fresh variant (gain 1, shared cores): phase 2 gets ceil(12 / 2).
    assert plan.revise(1, 1.0) and plan.switch == 6
    assert not plan.revise(2, 1.0)  # unchanged
    assert not plan.revise(5, 0.2) and plan.switch == 6  # the next epoch is the switch: too late to move it
    assert plan.revise(3, 11.0) and plan.switch == 11  # a large gain: one fresh epoch
    fixed = Plan(12, {"reuse": 3, "switch": 0.5})
    assert not fixed.revise(1, 1.0) and fixed.switch == 6  # a set switch stays


def test_the_fine_tune_phase_decays_the_learning_rate():
    plan = Plan(10, {"reuse": 2, "switch": 0.6, "fine_tune_lr": 0.4})
    scales = [plan.lr_scale(epoch) for epoch in range(10)]
    assert scales[:6] == [1.0] * 6 and scales[6] == pytest.approx(0.4)
    assert scales[6:] == sorted(scales[6:], reverse=True) and 0 < scales[9] < 0.1
    plain = Plan(10, None)
    assert [plain.lr_scale(epoch) for epoch in range(10)] == [1.0] * 10


def test_the_automatic_fine_tune_rate_is_phase_twos_share_of_the_epochs():
    short = Plan(12, {})
    short.decide(3.2)  # switch 9: 3 fresh epochs of 12
    assert short.fine_tune_start() == pytest.approx(0.25) and short.lr_scale(9) == pytest.approx(0.25)
    long = Plan(12, {"switch": 0.25, "reuse": 3})
    assert long.fine_tune_start() == pytest.approx(0.75)
    almost_all_reused = Plan(40, {"switch": 39 / 40, "reuse": 3})
    assert almost_all_reused.fine_tune_start() == pytest.approx(0.1)  # never below 0.1


def test_the_workload_trains_phase_two_at_the_scheduled_rate(tmp_path, npz_dataset, definition_of, monkeypatch):
    from components.train import workloads

    rates: dict[int, set[float]] = {}
    original = workloads.CNNDataset.train_step

    def recording(self, batch):
        rates.setdefault(self._epoch_data[0], set()).add(self.optimizer.param_groups[0]["lr"])
        return original(self, batch)

    monkeypatch.setattr(workloads.CNNDataset, "train_step", recording)
    ctx = run_job(tmp_path, definition_of(npz_dataset), epochs=6, perfect={"reuse": 2, "switch": 0.5})
    base = ctx.spec["lr"]
    scales = series(ctx, "data_lr_scale")
    assert scales[:3] == [1.0, 1.0, 1.0] and scales[3] == 0.5 and scales[3:] == sorted(scales[3:], reverse=True)
    assert [sorted(rates[epoch]) for epoch in range(6)] == [[pytest.approx(base * scale, rel=1e-3)]
                                                            for scale in scales]


def test_a_job_switches_phases_as_configured(tmp_path, npz_dataset, definition_of):
    ctx = run_job(tmp_path, definition_of(npz_dataset), epochs=6, cache=True, perfect={"reuse": 2, "switch": 0.5})
    assert series(ctx, "data_phase") == [1, 1, 1, 2, 2, 2]
    assert series(ctx, "data_variant") == [0, 0, 1, 3, 4, 5]
    assert series(ctx, "data_cache_hit")[:3] == [0, 0, 0]  # built here; reuse is in memory, not a cache hit
    assert "model.pt" in ctx.artifacts


def test_the_phases_are_chosen_automatically_on_a_slow_pipeline(tmp_path, npz_dataset, monkeypatch, definition_of):
    original = pipelines.preprocess

    def slow(sample, definition, variant, index):
        time.sleep(0.01)  # 10 ms a sample: preprocessing is far slower than training this tiny model
        return original(sample, definition, variant, index)

    monkeypatch.setattr(pipelines, "preprocess", slow)
    ctx = run_job(tmp_path, definition_of(npz_dataset), epochs=9, perfect={})
    decisions = [message for _, _, message in ctx.logs if "PerFect" in message]
    phases = series(ctx, "data_phase")
    reuse = series(ctx, "data_reuse")[-1]
    assert reuse > 1, f"a slow pipeline must be reused, got {reuse}: {decisions}"
    assert phases[0] == 1 and phases[-1] == 2 and phases == sorted(phases), phases
    assert any("PerFect: preprocessing one epoch takes" in message for _, _, message in ctx.logs)


def test_a_fast_pipeline_is_not_reused(tmp_path, npz_dataset, monkeypatch, definition_of):
    from components.train import workloads

    original = workloads.CNNDataset.train_step

    def slow_step(self, batch):
        time.sleep(0.05)  # training is far slower than preprocessing
        return original(self, batch)

    monkeypatch.setattr(workloads.CNNDataset, "train_step", slow_step)
    ctx = run_job(tmp_path, definition_of(npz_dataset), epochs=4, perfect={})
    assert series(ctx, "data_reuse")[-1] == 1 and series(ctx, "data_variant") == [0, 1, 2, 3]
    assert any("keeps up with training" in message for _, _, message in ctx.logs)


def test_the_decision_survives_a_resume(tmp_path, npz_dataset, definition_of):
    class StopAfter(LocalContext):
        def should_stop(self):
            return len([m for m in self.metric_points if m[0] == "data_phase"]) >= 3

    definition = definition_of(npz_dataset)
    spec = TrainSpec().validate({"workload": "cnn-dataset", "epochs": 6, "batch_size": 32, "hidden": 4,
                                 "checkpoint_every": 4, "data": {"dataset": {"name": "small",
                                                                             "definition": definition},
                                                                 "workers": 0, "perfect": {"reuse": 2, "switch": 0.67}}})
    first = StopAfter(job_id="job", attempt_id="a" * 32, spec=spec, workdir=tmp_path)
    TrainComponent().run(first)
    decided = series(first, "data_reuse")[0]
    second = LocalContext(job_id="job", attempt_id="b" * 32, spec=spec, workdir=tmp_path)
    TrainComponent().run(second)
    assert "model.pt" in second.artifacts
    assert set(series(second, "data_reuse")) == {decided}
    assert series(first, "data_variant") + series(second, "data_variant") == [0, 0, 1, 1, 4, 5]


def test_phase_two_stops_at_the_target(tmp_path, npz_dataset, definition_of):
    ctx = run_job(tmp_path, definition_of(npz_dataset), epochs=8, perfect={"reuse": 2, "switch": 0.25, "target": 0.0})
    assert len(series(ctx, "data_phase")) == 1, "a target of 0 is reached after the first epoch"
    assert any("reached the target" in message for _, _, message in ctx.logs)


def test_a_cache_directory_removed_while_a_job_runs_costs_recomputation(tmp_path, npz_dataset, cache_dir,
                                                                       monkeypatch, definition_of):
    from components.train import workloads

    original = workloads.CNNDataset.end_epoch

    def remove_after_first(self, epoch, evaluation):
        if epoch == 0:  # the loader may be writing the next variant meanwhile: remove until it is gone
            wait_for(lambda: shutil.rmtree(cache_dir, ignore_errors=True) or not cache_dir.exists(), 30,
                     message="the cache directory to be removed")
        return original(self, epoch, evaluation)

    monkeypatch.setattr(workloads.CNNDataset, "end_epoch", remove_after_first)
    ctx = run_job(tmp_path / "job", definition_of(npz_dataset), epochs=3, cache=True)
    assert "model.pt" in ctx.artifacts and len(series(ctx, "data_variant")) == 3
    assert CacheStore(cache_dir).stats()["entries"] >= 1  # recreated, and filled again


def test_two_jobs_on_one_pipeline_share_its_variants(tmp_path, npz_dataset, cache_dir, definition_of):
    first = run_job(tmp_path / "one", definition_of(npz_dataset), epochs=2, cache=True)
    second = run_job(tmp_path / "two", definition_of(npz_dataset), epochs=2, cache=True)
    assert series(first, "data_cache_hit") == [0, 0]
    assert series(second, "data_cache_hit") == [1, 1]
    assert series(second, "data_prep_cpu_s")[-1] == 0.0, "the second job preprocessed nothing"
    stats = CacheStore(cache_dir).stats()
    assert stats["misses"] == 3 and stats["hits"] >= 3  # test set + 2 variants, computed once


@pytest.mark.timeout(300)
def test_loader_worker_processes_build_the_same_bytes(tmp_path, npz_dataset, cache_dir, definition_of):
    spec = definition_of(npz_dataset)
    raw = pipelines.load_raw(spec)
    pool = pipelines.worker_pool(2)
    try:
        parallel = pipelines.build_variant(raw, spec, 2, pool, 2)
    finally:
        pool.shutdown()
    assert parallel["x"].tobytes() == pipelines.build_variant(raw, spec, 2, None, 0)["x"].tobytes()
