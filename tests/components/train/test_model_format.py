"""model.pt describes itself: saved by the train loop, rebuilt by the workload's own from_config; and every
built-in workload gives its model as stages whose composition is its forward."""

import io

import pytest
import torch
from torch import nn

from components.runtime.contract.context import LocalContext
from components.train import model_format
from components.train.loop import TrainLoop
from components.train.model_format import describe_model, load_model, read_model, save_model
from components.train.spec import TrainSpec
from components.train.workloads import BUILTIN_WORKLOADS, MLPDigits, builtin_workload

SMALL = {"cnn-dataset": {"hidden": 4, "data": {"dataset": "digits", "workers": 0}}, "mlp-digits": {"hidden": 16}, "cnn-synthetic": {"hidden": 4}, "tiny-gpt": {"hidden": 32, "batch_size": 4},
         "moe-gpt": {"hidden": 32, "batch_size": 4}, "cnn-fc": {"hidden": 4},
         "dlrm-ctr": {"hidden": 8, "batch_size": 256}, "dlrm-movielens": {"hidden": 8, "batch_size": 256}}


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trained(name, steps=2, seed=4):
    """A set-up built-in workload after ``steps`` real optimizer steps, and its spec."""
    spec = TrainSpec().validate({"workload": name, "seed": seed, **SMALL.get(name, {})})
    workload = builtin_workload(name)
    workload.setup(spec, torch.device("cpu"))
    for index in range(steps):
        workload.train_step(workload.batch(0, index))
    workload.model.eval()
    return workload, spec


def test_every_builtin_workload_is_covered():
    assert set(SMALL) == set(BUILTIN_WORKLOADS)
    assert model_format.rebuildable_workloads() == tuple(sorted(BUILTIN_WORKLOADS))


@pytest.mark.parametrize("name", sorted(BUILTIN_WORKLOADS))
def test_a_round_trip_gives_the_same_outputs(tmp_path, name):
    workload, spec = trained(name)
    save_model(tmp_path / "model.pt", describe_model(workload, spec=spec), workload.model_state())

    # Plain containers and tensors only: it loads with weights_only=True.
    saved = torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=True)
    assert saved.keys() == {"format", "workload", "config", "input", "output", "state_dict", "spec"}
    assert saved["format"] == model_format.MODEL_FORMAT and saved["workload"] == name
    assert saved["config"] == workload.model_config() and saved["spec"] == spec

    module, description = load_model(tmp_path / "model.pt")
    assert type(module) is type(workload.model) and not module.training
    assert "state_dict" not in description
    assert description["config"] == saved["config"]
    assert (description["input"], description["output"]) == (saved["input"], saved["output"])
    rows = workload.batch(0, 0)[0][:3]
    assert list(rows.shape[1:]) == description["input"]["shape"]
    assert str(rows.dtype).removeprefix("torch.") == description["input"]["dtype"]
    with torch.inference_mode():
        expected = workload.model(rows)
        assert torch.equal(module(rows), expected)
    assert list(expected.shape[1:]) == description["output"]["shape"]
    for key, tensor in workload.model_state().items():
        assert torch.equal(module.state_dict()[key], tensor), key

    # The same from the bytes and from an open file.
    data = (tmp_path / "model.pt").read_bytes()
    with torch.inference_mode():
        assert torch.equal(load_model(data)[0](rows), expected)
        assert torch.equal(load_model(io.BytesIO(data))[0](rows), expected)


# Workloads that existed before model.pt recorded its config (format 2): only they can have older files.
LEGACY_WORKLOADS = sorted(set(BUILTIN_WORKLOADS) - {"cnn-dataset", "dlrm-ctr", "dlrm-movielens"})


@pytest.mark.parametrize("name", LEGACY_WORKLOADS)
def test_older_unversioned_files_still_load(tmp_path, name):
    workload, spec = trained(name)
    torch.save({"workload": name, "spec": spec, "state_dict": workload.model_state()}, tmp_path / "old.pt")
    module, description = load_model(tmp_path / "old.pt")
    assert description["format"] == model_format.LEGACY_FORMAT
    assert description["config"] == workload.model_config()
    assert (description["input"], description["output"]) == type(workload).describe_io(workload.model_config())
    rows = workload.batch(0, 0)[0][:3]
    with torch.inference_mode():
        assert torch.equal(module(rows), workload.model(rows))


def test_the_train_loop_writes_the_format(tmp_path):
    spec = TrainSpec().validate({"workload": "tiny-gpt", "hidden": 32, "batch_size": 4, "max_steps": 3, "seed": 2})
    ctx = LocalContext(job_id="job", attempt_id="attempt", spec=dict(spec), workdir=tmp_path)
    loop = TrainLoop(builtin_workload("tiny-gpt"), spec, ctx, owns_process=False)
    assert loop.run()
    saved = torch.load(ctx.artifacts["model.pt"], weights_only=True)
    assert saved["format"] == model_format.MODEL_FORMAT
    assert saved["config"] == {"vocabulary": 96, "context": 64, "width": 32, "heads": 4, "layers": 2}
    assert saved["input"] == {"shape": [64], "dtype": "int64", "limit": 96}
    assert saved["output"] == {"shape": [64, 96], "dtype": "float32"}
    assert saved["spec"] == spec
    module, _ = load_model(ctx.artifacts["model.pt"])
    tokens = loop.workload.batch(0, 0)[0][:2]
    loop.workload.model.eval()
    with torch.inference_mode():
        assert torch.equal(module(tokens), loop.workload.model(tokens))


def test_loading_leaves_the_global_random_stream_alone(tmp_path):
    workload, spec = trained("tiny-gpt", steps=0)
    save_model(tmp_path / "model.pt", describe_model(workload, spec=spec), workload.model_state())
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    load_model(tmp_path / "model.pt")
    assert torch.equal(torch.rand(3), expected)


def test_bad_files_give_a_clear_value_error(tmp_path):
    workload, spec = trained("mlp-digits", steps=0)
    description = describe_model(workload, spec=spec)
    weights = workload.model_state()

    def write(name, value):
        torch.save(value, tmp_path / name)
        return tmp_path / name

    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="is not a readable model.pt"):
        load_model(b"garbage, not a torch file")
    (tmp_path / "truncated.pt").write_bytes(write("whole.pt", {**description, "state_dict": weights})
                                            .read_bytes()[:200])
    with pytest.raises(ValueError, match=r"truncated.pt is not a readable model.pt"):
        load_model(tmp_path / "truncated.pt")
    with pytest.raises(ValueError, match="not the model.pt of a train job"):
        load_model(write("list.pt", [1, 2, 3]))
    with pytest.raises(ValueError, match="unsupported model.pt format 99"):
        load_model(write("future.pt", {**description, "format": 99, "state_dict": weights}))
    with pytest.raises(ValueError, match="state_dict is not a mapping of names to tensors"):
        load_model(write("numbers.pt", {**description, "state_dict": {"0.weight": 1.0}}))
    with pytest.raises(ValueError, match="cannot rebuild workload 'mine:Model'.*only built-in"):
        load_model(write("user.pt", {**description, "workload": "mine:Model", "state_dict": weights}))
    with pytest.raises(ValueError, match="records no config"):
        load_model(write("noconfig.pt", {**description, "config": None, "state_dict": weights}))
    with pytest.raises(ValueError, match="cannot build a mlp-digits model of config"):
        load_model(write("badconfig.pt", {**description, "config": {"hidden": 16}, "state_dict": weights}))
    wider = {**description["config"], "hidden": 32}
    with pytest.raises(ValueError, match="the weights do not fit a mlp-digits model.*size mismatch"):
        load_model(write("wider.pt", {**description, "config": wider, "state_dict": weights}))
    wrong_output = {**description["output"], "shape": [11]}
    with pytest.raises(ValueError, match="gives .*not the recorded output"):
        load_model(write("output.pt", {**description, "output": wrong_output, "state_dict": weights}))
    wrong_input = {**description["input"], "shape": [63]}
    with pytest.raises(ValueError, match="fails on its recorded input"):
        load_model(write("input.pt", {**description, "input": wrong_input, "state_dict": weights}))
    with pytest.raises(ValueError, match="input dtype 'float16'"):
        load_model(write("dtype.pt", {**description, "input": {**description["input"], "dtype": "float16"},
                                      "state_dict": weights}))
    # A pickled object is never loaded: weights_only refuses it before anything runs.
    with pytest.raises(ValueError, match="is not a readable model.pt"):
        load_model(write("object.pt", {**description, "state_dict": weights, "spec": ValueError("boom")}))


def test_a_user_workload_without_a_config_is_saved_but_not_rebuilt(tmp_path):
    class Custom(MLPDigits):  # builds its own model: nothing describes it
        def build_model(self, spec, x_train, classes):
            return nn.Sequential(nn.Linear(x_train.shape[1], classes))

    spec = TrainSpec().validate({"workload": "mlp-digits"})
    workload = Custom()
    workload.setup(spec, torch.device("cpu"))
    description = describe_model(workload, name="mine:Custom", spec=spec)
    assert (description["config"], description["input"], description["output"]) == (None, None, None)
    save_model(tmp_path / "model.pt", description, workload.model_state())
    assert read_model(tmp_path / "model.pt")["workload"] == "mine:Custom"
    with pytest.raises(ValueError, match="only built-in workloads"):
        load_model(tmp_path / "model.pt")


def test_a_config_must_be_plain_values():
    class Odd(MLPDigits):
        def model_config(self):
            return {**super().model_config(), "device": torch.device("cpu")}

    workload = Odd()
    workload.setup(TrainSpec().validate({"workload": "mlp-digits"}), torch.device("cpu"))
    with pytest.raises(TypeError, match="only plain values"):
        describe_model(workload)


@pytest.mark.parametrize("name", sorted(BUILTIN_WORKLOADS))
def test_stages_composed_equal_the_forward(name):
    workload, _ = trained(name, steps=1)
    stages = workload.stages()
    assert len(stages) > 1 and all(isinstance(stage, nn.Module) for stage in stages)
    rows = workload.batch(0, 1)[0]
    with torch.no_grad():
        x = rows
        for stage in stages:
            x = stage(x)
        assert torch.equal(x, workload.model(rows))
    # The stages share the model's parameters (no copies), each exactly once.
    shared = [parameter for stage in stages for parameter in stage.parameters()]
    assert len(shared) == len({id(parameter) for parameter in shared})
    assert {id(parameter) for parameter in shared} == {id(parameter) for parameter in workload.model.parameters()}


def test_tiny_gpt_stages_are_the_embedding_each_blocks_halves_and_the_head():
    workload, _ = trained("tiny-gpt", steps=0)
    names = [type(stage).__name__ for stage in workload.stages()]
    assert names == ["InputEmbedding", *["Residual"] * (2 * workload.layers), "Head"]


class TeamClassifier(MLPDigits):
    """A team's own classifier: it builds its model itself, so no config describes it (like a bundle's class)."""

    def build_model(self, spec, x_train, classes):
        return nn.Sequential(nn.Linear(x_train.shape[1], 12), nn.ReLU(), nn.Dropout(0.5), nn.Linear(12, classes))


def test_a_team_model_is_exported_and_loaded_only_where_team_code_may_run(tmp_path):
    spec = TrainSpec().validate({"entrypoint": "mine:TeamClassifier", "max_steps": 3, "seed": 5})
    ctx = LocalContext(job_id="job", attempt_id="attempt", spec=dict(spec), workdir=tmp_path)
    loop = TrainLoop(TeamClassifier(), spec, ctx, owns_process=False)
    assert loop.run()
    assert any("model.pt: the model is exported (torch.export" in line for _, _, line in ctx.logs), ctx.logs
    saved = torch.load(ctx.artifacts["model.pt"], weights_only=True)  # still plain values and tensors
    assert saved["config"] is None and saved["program"]["format"] == model_format.PROGRAM_FORMAT
    assert saved["input"] == {"shape": [64], "dtype": "float32", "limit": 0}
    assert saved["output"] == {"shape": [10], "dtype": "float32"}
    assert saved["state_dict"].keys() == loop.workload.model.state_dict().keys()  # the weights, readable alone

    # The program is the team's code: refused unless the caller runs where a team's code may run.
    with pytest.raises(ValueError, match="holds the exported program of 'mine:TeamClassifier', a team's code"):
        load_model(ctx.artifacts["model.pt"])
    module, description = load_model(ctx.artifacts["model.pt"], allow_program=True)
    assert isinstance(module, model_format.ExportedModule) and not module.training
    assert description["program"] == "torch.export" and description["workload"] == "mine:TeamClassifier"
    rows = loop.workload.x_test[:5]
    loop.workload.model.eval()
    with torch.inference_mode():
        assert torch.allclose(module(rows), loop.workload.model(rows), atol=1e-6)  # eval mode: no dropout
        assert module(rows[:1]).shape == (1, 10)
        assert module(loop.workload.x_test).shape == (len(loop.workload.x_test), 10)  # any batch size
    assert module.train() is module and module.training  # a flag only: the graph itself refuses train()
    assert read_model(ctx.artifacts["model.pt"])["program"][:2] == b"PK"  # torch.export.save's zip archive


def test_a_model_torch_export_cannot_trace_is_saved_without_a_program(tmp_path):
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(64, 10)

        def forward(self, x):
            if float(x.sum()) > 0:  # data-dependent Python control flow
                return self.layer(x)
            return -self.layer(x)

    class Team(MLPDigits):
        def build_model(self, spec, x_train, classes):
            return Branchy()

    spec = TrainSpec().validate({"entrypoint": "mine:Team", "max_steps": 2})
    with pytest.raises(ValueError, match="torch.export cannot export the model"):
        workload = Team()
        workload.setup(spec, torch.device("cpu"))
        model_format.export_program(workload)
    ctx = LocalContext(job_id="job", attempt_id="attempt", spec=dict(spec), workdir=tmp_path)
    assert TrainLoop(Team(), spec, ctx, owns_process=False).run()
    warnings = [line for _, level, line in ctx.logs if level == "warning"]
    assert any("not exported for serving" in line and "model.entrypoint" in line for line in warnings), ctx.logs
    assert "program" not in torch.load(ctx.artifacts["model.pt"], weights_only=True)
    with pytest.raises(ValueError, match="holds no exported program"):
        load_model(ctx.artifacts["model.pt"], allow_program=True)


def test_built_in_and_undescribed_workloads_export_nothing():
    workload, _ = trained("mlp-digits", steps=0)
    assert model_format.export_program(workload) is None  # rebuilt from its config instead

    class Plain(MLPDigits):
        def build_model(self, spec, x_train, classes):
            return nn.Linear(x_train.shape[1], classes)

        def serving_input(self):
            return None

    plain = Plain()
    plain.setup(TrainSpec().validate({"workload": "mlp-digits"}), torch.device("cpu"))
    assert model_format.export_program(plain) is None


def test_a_damaged_program_entry_is_a_clear_error(tmp_path):
    workload, spec = trained("mlp-digits", steps=0)
    description = describe_model(workload, name="mine:Team", spec=spec)
    torch.save({**description, "state_dict": workload.model_state(), "program": {"format": "pickle", "archive": "abc"}},
               tmp_path / "odd.pt")
    with pytest.raises(ValueError, match="the program is not"):
        read_model(tmp_path / "odd.pt")
    torch.save({**description, "input": {"shape": [64], "dtype": "float32"}, "output": {"shape": [10], "dtype": "float32"},
                "state_dict": workload.model_state(),
                "program": {"format": "torch.export", "archive": torch.zeros(8, dtype=torch.uint8)}},
               tmp_path / "zeros.pt")
    with pytest.raises(ValueError, match="cannot load the exported program of 'mine:Team'"):
        load_model(tmp_path / "zeros.pt", allow_program=True)
