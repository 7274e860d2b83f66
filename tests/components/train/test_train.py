import json
import math
import re
import sys
import types

import pytest
import torch

from components.runtime.contract.context import LocalContext
from components.train.component import TrainComponent, resolve_entrypoint, torch_threads
from components.train.loop import TrainLoop
from components.train.spec import TrainSpec
from components.train.workloads import VOCABULARY, TinyGPT, builtin_workload, encode, synthetic_shapes


def make_ctx(workdir, spec, **kwargs) -> LocalContext:
    return LocalContext(job_id="job", attempt_id="attempt", spec=dict(spec), workdir=workdir, **kwargs)


def run(workdir, spec, context=LocalContext) -> LocalContext:
    ctx = context(job_id="job", attempt_id="attempt", spec=dict(spec), workdir=workdir)
    TrainComponent().run(ctx)
    return ctx


def series(ctx, name) -> list[tuple[int, float]]:
    return [(step, value) for metric, value, step in ctx.metric_points if metric == name]


def final_weights(ctx) -> dict[str, torch.Tensor]:
    return torch.load(ctx.artifacts["model.pt"], weights_only=True)["state_dict"]


class StopAt(LocalContext):
    """Asks to stop once a metric at or after ``STOP_STEP`` was reported (as a preemption would)."""

    STOP_STEP = 30

    def metrics(self, values, step):
        super().metrics(values, step)
        if step >= self.STOP_STEP:
            self.request_stop()


def test_mlp_digits_learns_and_uploads_artifacts(tmp_path):
    ctx = run(tmp_path, {"workload": "mlp-digits"})

    losses = series(ctx, "loss")
    # 23 steps per epoch: reports every 10 steps and at each epoch's end.
    assert [step for step, _ in losses] == [10, 20, 23, 30, 40, 46, 50, 60, 69]
    assert all(math.isfinite(value) for _, value in losses)
    assert losses[-1][1] < losses[0][1] / 3
    assert all(0 <= value <= 1 for _, value in series(ctx, "accuracy"))
    assert all(value > 0 for _, value in series(ctx, "samples_per_s"))
    test_accuracy = series(ctx, "test_accuracy")
    assert [step for step, _ in test_accuracy] == [23, 46, 69]
    assert test_accuracy[-1][1] >= 0.85

    messages = [message for _, _, message in ctx.logs]
    assert messages[0].startswith("training mlp-digits on cpu: 3 epochs x 23 steps")
    assert sum(message.startswith("epoch ") for message in messages) == 3
    assert messages[-1].startswith("done: mlp-digits ran 69 steps")

    assert set(ctx.artifacts) == {"model.pt", "metrics.json"}
    saved = torch.load(ctx.artifacts["model.pt"], weights_only=True)
    assert saved["workload"] == "mlp-digits"
    assert saved["spec"] == TrainSpec().validate({"workload": "mlp-digits"})
    assert saved["format"] == 2  # components.train.model_format
    assert saved["config"] == {"features": 64, "hidden": 128, "classes": 10}
    assert saved["input"] == {"shape": [64], "dtype": "float32", "limit": 0}
    assert saved["output"] == {"shape": [10], "dtype": "float32"}
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )
    model.load_state_dict(saved["state_dict"])  # strict: every weight is there, with the right shape

    summary = json.loads(ctx.artifacts["metrics.json"].read_text())
    assert summary["steps"] == summary["total_steps"] == 69
    assert summary["epochs"] == 3
    assert summary["samples"] == 3 * 1438
    assert summary["eval"]["test_accuracy"] == pytest.approx(test_accuracy[-1][1])
    assert summary["resumed_from_step"] is None
    assert summary["duration_s"] > 0 and summary["samples_per_s"] > 0


@pytest.mark.parametrize(
    ("spec", "first_loss_at_least"),
    [
        ({"workload": "cnn-synthetic", "max_steps": 40}, 1.0),
        ({"workload": "tiny-gpt", "max_steps": 30, "batch_size": 32}, 3.0),
    ],
)
def test_builtin_workloads_train(tmp_path, spec, first_loss_at_least):
    ctx = run(tmp_path, {**spec, "log_every": 10})
    losses = [value for _, value in series(ctx, "loss")]
    assert len(losses) == spec["max_steps"] // 10
    assert all(math.isfinite(value) for value in losses)
    assert losses[0] >= first_loss_at_least
    assert losses[-1] < 0.85 * losses[0]
    assert losses[-1] == min(losses)
    evaluation = {name: value for name, value, step in ctx.metric_points if step == spec["max_steps"]}
    assert 0 <= evaluation["test_accuracy"] <= 1
    assert math.isfinite(evaluation["test_loss"])
    assert any("(partial)" in message for _, _, message in ctx.logs)
    assert json.loads(ctx.artifacts["metrics.json"].read_text())["steps"] == spec["max_steps"]


@pytest.mark.parametrize(
    ("spec", "stop_step"),
    [
        ({"workload": "mlp-digits", "checkpoint_every": 25}, 30),  # resumes inside epoch 2
        ({"workload": "cnn-synthetic", "max_steps": 20, "checkpoint_every": 7}, 10),
        (
            {"workload": "tiny-gpt", "max_steps": 8, "batch_size": 16, "log_every": 3, "checkpoint_every": 2},
            3,
        ),
        ({"workload": "mlp-digits", "optimizer": "sgd", "max_steps": 30, "log_every": 5}, 15),
    ],
)
def test_resume_after_stop_is_bit_identical(tmp_path, spec, stop_step):
    uninterrupted = run(tmp_path / "straight", spec)

    stop_at = type("Stop", (StopAt,), {"STOP_STEP": stop_step})
    stopped = run(tmp_path / "interrupted", spec, context=stop_at)
    assert stopped.should_stop()
    assert stopped.artifacts == {}
    assert "stopping" in stopped.logs[-1][2]
    checkpoint = stopped.restore()
    assert checkpoint["step"] == stop_step
    assert max(step for _, _, step in stopped.metric_points) == stop_step

    resumed = run(tmp_path / "interrupted", spec)
    assert resumed.logs[0][2].startswith(
        f"resumed {spec['workload']} from the checkpoint at step {stop_step}/"
    )
    assert min(step for _, _, step in resumed.metric_points) > stop_step
    expected, actual = final_weights(uninterrupted), final_weights(resumed)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert json.loads(resumed.artifacts["metrics.json"].read_text())["resumed_from_step"] == stop_step
    # The resumed run reports exactly what the uninterrupted run reported for the same steps.
    later = [
        point for point in uninterrupted.metric_points if point[2] > stop_step and point[0] != "samples_per_s"
    ]
    again = [point for point in resumed.metric_points if point[0] != "samples_per_s"]
    assert later == again


def test_different_seeds_give_different_models(tmp_path):
    first = run(tmp_path / "a", {"workload": "mlp-digits", "max_steps": 5, "seed": 1})
    second = run(tmp_path / "b", {"workload": "mlp-digits", "max_steps": 5, "seed": 2})
    assert not torch.equal(final_weights(first)["0.weight"], final_weights(second)["0.weight"])


def test_stop_before_the_first_step_checkpoints_and_returns(tmp_path):
    ctx = make_ctx(tmp_path, {"workload": "mlp-digits"})
    ctx.request_stop()
    TrainComponent().run(ctx)  # returns normally: the runtime decides what the job becomes
    assert ctx.restore()["step"] == 0
    assert ctx.metric_points == []
    assert ctx.artifacts == {}
    assert ctx.logs[-1][2] == "stopping mlp-digits at step 0/69: checkpoint saved"


def test_a_finished_run_that_restarts_only_uploads_again(tmp_path):
    first = run(tmp_path, {"workload": "mlp-digits", "max_steps": 12})
    again = run(tmp_path, {"workload": "mlp-digits", "max_steps": 12})
    assert again.logs[0][2].startswith("resumed mlp-digits from the checkpoint at step 12/12")
    assert [name for name, _, _ in again.metric_points] == ["test_loss", "test_accuracy"]
    for name, tensor in final_weights(first).items():
        assert torch.equal(tensor, final_weights(again)[name])


def test_a_checkpoint_of_another_workload_is_refused(tmp_path):
    run(tmp_path, {"workload": "mlp-digits", "max_steps": 2})
    with pytest.raises(ValueError, match="checkpoint is of 'mlp-digits'"):
        run(tmp_path, {"workload": "cnn-synthetic", "max_steps": 2})


def test_a_checkpoint_resumes_with_this_runs_learning_rate_and_optimizer(tmp_path):
    """A run that starts from a checkpoint (a population-based-training trial taking another trial's weights
    with an explored config) keeps the checkpoint's weights, and this run's learning rate; a checkpoint of
    another optimizer gives the weights and a fresh optimizer."""
    run(tmp_path, {"workload": "mlp-digits", "max_steps": 6, "lr": 0.01})
    saved = make_ctx(tmp_path, {}).restore()

    def resumed(spec):
        workload = builtin_workload("mlp-digits")
        loop = TrainLoop(workload, TrainSpec().validate({"workload": "mlp-digits", "max_steps": 12, **spec}),
                         make_ctx(tmp_path, spec))
        loop.start()
        return workload

    slower = resumed({"lr": 0.001})
    assert [group["lr"] for group in slower.optimizer.param_groups] == [0.001]
    assert slower.optimizer.state_dict()["state"], "Adam's moments come from the checkpoint"
    for name, tensor in saved["state"]["model"].items():
        assert torch.equal(slower.model.state_dict()[name], tensor), name
    other = resumed({"optimizer": "sgd", "lr": 0.05})
    assert isinstance(other.optimizer, torch.optim.SGD) and other.optimizer.state_dict()["state"] == {}
    assert [group["lr"] for group in other.optimizer.param_groups] == [0.05]
    for name, tensor in saved["state"]["model"].items():
        assert torch.equal(other.model.state_dict()[name], tensor), name


def test_interleaved_loops_match_solo_runs(tmp_path):
    """Two jobs stepped alternately in one process train exactly as they would alone."""

    def loop(name, seed, workdir):
        spec = TrainSpec().validate({"workload": name, "seed": seed, "max_steps": 12, "batch_size": 16})
        ctx = make_ctx(workdir, spec)
        return TrainLoop(builtin_workload(name), spec, ctx, owns_process=False)

    solo = [loop("mlp-digits", 1, tmp_path / "s1"), loop("tiny-gpt", 2, tmp_path / "s2")]
    for each in solo:
        each.run()
    shared = [loop("mlp-digits", 1, tmp_path / "i1"), loop("tiny-gpt", 2, tmp_path / "i2")]
    for each in shared:
        each.start()
    while not all(each.done for each in shared):
        for each in shared:
            if not each.done:
                each.step()
    for alone, interleaved in zip(solo, shared, strict=True):
        for name, tensor in alone.workload.model_state().items():
            assert torch.equal(tensor, interleaved.workload.model_state()[name]), name


def test_entrypoint_returning_a_workload_is_driven_by_the_loop(tmp_path):
    spec = {
        "entrypoint": "components.train.examples:linear_workload",
        "options": {"features": 4, "samples": 512},
        "epochs": 4,
        "batch_size": 32,
        "lr": 0.05,
        "log_every": 16,
        "checkpoint_every": 16,
    }
    ctx = run(tmp_path, spec)
    losses = [value for _, value in series(ctx, "loss")]
    assert len(losses) == 4
    assert losses[-1] < 0.05 < losses[0]
    assert series(ctx, "test_loss")[-1][1] < 0.05  # the noise floor is 0.1**2
    assert final_weights(ctx)["weight"].shape == (1, 4)
    assert ctx.restore()["step"] == 64


def test_entrypoint_may_name_a_workload_class(tmp_path):
    ctx = run(tmp_path, {"entrypoint": "components.train.examples:LinearRegression", "max_steps": 3})
    assert ctx.logs[0][2].startswith("training components.train.examples:LinearRegression on cpu")
    assert json.loads(ctx.artifacts["metrics.json"].read_text())["steps"] == 3


def test_entrypoint_that_trains_by_itself(tmp_path):
    spec = {"entrypoint": "components.train.examples:fit_line", "lr": 0.5, "max_steps": 200, "log_every": 50}
    stopper = type("Stop", (StopAt,), {"STOP_STEP": 100})
    stopped = run(tmp_path, spec, context=stopper)
    assert stopped.restore()["step"] == 100
    ctx = run(tmp_path, spec)
    assert ctx.logs[0][2] == "resumed at step 100"
    assert [step for step, _ in series(ctx, "loss")] == [150, 200]
    assert series(ctx, "loss")[-1][1] < 0.01
    assert ctx.logs[-1][2] == "components.train.examples:fit_line finished"
    slope, intercept = re.fullmatch(r"fit y = (\S+) x \+ (\S+) in 200 steps", ctx.logs[-2][2]).groups()
    assert float(slope) == pytest.approx(2, abs=0.02)
    assert float(intercept) == pytest.approx(-1, abs=0.02)
    assert ctx.artifacts == {}  # artifacts are up to code that trains by itself


@pytest.fixture
def user_module(monkeypatch):
    module = types.ModuleType("strata_user_code")
    module.returns_number = lambda ctx: 42
    module.not_callable = 3
    monkeypatch.setitem(sys.modules, "strata_user_code", module)
    return module


def test_bad_entrypoints_fail_clearly(tmp_path, user_module):
    ctx = make_ctx(tmp_path, {})
    with pytest.raises(ImportError, match="cannot import the entrypoint 'no_such_package.mod:main'"):
        resolve_entrypoint(ctx, "no_such_package.mod:main")
    with pytest.raises(ImportError, match="cannot import"):
        resolve_entrypoint(ctx, "strata_user_code:missing")
    with pytest.raises(TypeError, match="returned int"):
        resolve_entrypoint(ctx, "strata_user_code:returns_number")
    with pytest.raises(TypeError, match="not callable"):
        resolve_entrypoint(ctx, "strata_user_code:not_callable")


def test_torch_threads_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("STRATA_TORCH_THREADS", raising=False)
    assert torch_threads() == 2
    monkeypatch.setenv("STRATA_TORCH_THREADS", "1")
    assert torch_threads() == 1
    monkeypatch.setenv("STRATA_TORCH_THREADS", "zero")
    with pytest.raises(ValueError, match="STRATA_TORCH_THREADS"):
        torch_threads()


def test_synthetic_shapes_are_deterministic_and_balanced():
    first = synthetic_shapes(600, 16, torch.Generator().manual_seed(5))
    second = synthetic_shapes(600, 16, torch.Generator().manual_seed(5))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert first[0].shape == (600, 1, 16, 16)
    assert torch.bincount(first[1], minlength=6).min() > 60


def test_tiny_gpt_is_causal_and_knows_the_corpus_alphabet():
    torch.manual_seed(0)
    model = TinyGPT(len(VOCABULARY), context=16, width=32, heads=4, layers=2).eval()
    tokens = encode("def f(x): return")[:16].view(1, -1)
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % len(VOCABULARY)
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.allclose(before[0, :10], after[0, :10])
    assert not torch.allclose(before[0, 10:], after[0, 10:])
    assert encode("\u00e9")[0] == VOCABULARY.index("?")
