"""User models: a train job's own model.pt served through a class with load(path) and predict(batch)."""

import grpc
import numpy as np
import pytest
import torch

from components.gpushare.executor import DeviceExecutor
from components.runtime.contract.context import LocalContext
from components.serving.client import ServingError, describe, predict
from components.serving.endpoint import start_serving
from components.serving.model import load_user_model
from components.train.loop import TrainLoop
from components.train.spec import TrainSpec

ENTRYPOINT = "components.serving.examples:LinearModel"


@pytest.fixture(scope="module")
def linear_model(tmp_path_factory):
    """The model.pt of a train job that ran user code (components.train.examples:linear_workload)."""
    from components.train.examples import linear_workload

    spec = TrainSpec().validate({"entrypoint": "components.train.examples:linear_workload", "epochs": 3,
                                 "batch_size": 64})
    ctx = LocalContext(job_id="user", attempt_id="a", spec=dict(spec), workdir=tmp_path_factory.mktemp("user"))
    TrainLoop(linear_workload(ctx), spec, ctx, owns_process=False).run()
    return ctx.artifacts["model.pt"]


def test_a_user_model_is_served_through_its_own_load_and_predict(linear_model):
    served = load_user_model(linear_model, ENTRYPOINT)
    assert served.input_shape == (8,) and served.output_shape == (1,) and served.workload == ENTRYPOINT
    state = torch.load(linear_model, weights_only=True)["state_dict"]
    rows = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    expected = rows @ state["weight"].numpy().T + state["bias"].numpy()
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        with start_serving(executor, "user", served, max_rows=16) as handle:
            np.testing.assert_allclose(predict(handle.address, rows), expected, rtol=1e-5, atol=1e-6)
            assert describe(handle.address)["workload"] == ENTRYPOINT
            with pytest.raises(ServingError) as wrong:
                predict(handle.address, rows[:, :3])
            assert wrong.value.code == grpc.StatusCode.INVALID_ARGUMENT


class NoPredict:
    input_shape, input_dtype, output_shape = (2,), "float32", (1,)

    def load(self, path):
        pass


class WrongShape(NoPredict):
    def predict(self, batch):
        return np.zeros((len(batch), 3), np.float32)


class BadDtype(WrongShape):
    input_dtype = "float16"


def test_a_model_that_breaks_the_contract_is_refused_by_name(linear_model, monkeypatch):
    import sys
    import types

    module = types.ModuleType("strata_test_user_models")  # importable by name, whatever pytest calls this file
    module.NoPredict, module.WrongShape, module.BadDtype = NoPredict, WrongShape, BadDtype
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(ValueError, match="lacks predict"):
        load_user_model(linear_model, "strata_test_user_models:NoPredict")
    with pytest.raises(ValueError, match=r"answered one row with shape \[1, 3\], not \[1, 1\]"):
        load_user_model(linear_model, "strata_test_user_models:WrongShape")
    with pytest.raises(ValueError, match="input_dtype 'float16'"):
        load_user_model(linear_model, "strata_test_user_models:BadDtype")
    with pytest.raises(ImportError, match="cannot import the model entrypoint"):
        load_user_model(linear_model, "no_such_module_here:Model")


def team_model(path):
    """The model.pt of a train job of a team's own classifier: its model exported (torch.export)."""
    from torch import nn

    from components.train import model_format
    from components.train.workloads import MLPDigits

    class Team(MLPDigits):
        def build_model(self, spec, x_train, classes):
            return nn.Sequential(nn.Linear(x_train.shape[1], 16), nn.ReLU(), nn.Linear(16, classes))

    spec = TrainSpec().validate({"entrypoint": "mywork:Team", "seed": 3})
    workload = Team()
    workload.setup(spec, torch.device("cpu"))
    for index in range(20):
        workload.train_step(workload.batch(0, index))
    model_format.save_model(path, model_format.describe_model(workload, name="mywork:Team", spec=spec),
                            workload.model_state(), model_format.export_program(workload))
    return workload


def test_a_team_model_is_served_from_its_exported_program_in_its_own_process_only(tmp_path):
    from components.runtime.contract.context import DeviceHandle
    from components.runtime.contract.project import UserError
    from components.serving.component import ServeComponent
    from components.serving.model import load_served_model

    workload = team_model(tmp_path / "model.pt")
    with pytest.raises(ValueError, match="a team's code"):
        load_served_model(tmp_path / "model.pt")  # not in a shared process
    served = load_served_model(tmp_path / "model.pt", allow_program=True)
    assert (served.workload, served.input_shape, served.output_shape) == ("mywork:Team", (64,), (10,))
    rows = workload.x_test[:7]
    workload.model.eval()
    with torch.inference_mode():
        expected = workload.model(rows).numpy()
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        with start_serving(executor, "team", served, max_rows=16) as handle:
            np.testing.assert_allclose(predict(handle.address, rows.numpy()), expected, rtol=1e-5, atol=1e-5)
            assert describe(handle.address)["workload"] == "mywork:Team"

    # The serve kind's session: in a process of its own it loads the program; hosted (the GPU-sharing service,
    # shared with other teams' jobs) it refuses to.
    spec = {"model": {"job": "0d4f3c1a-8b7e-4f60-a2d9-6c5b4e3f2a10"}}
    ctx = LocalContext(job_id="s", attempt_id="a", spec=dict(spec), workdir=tmp_path / "own",
                       devices=[DeviceHandle("virtual", 0, 2**30)], sources={"model.pt": tmp_path / "model.pt"})
    session = ServeComponent().session(ctx)
    session.prepare()
    assert session.served.workload == "mywork:Team"
    hosted = ServeComponent().session(LocalContext(job_id="s", attempt_id="b", spec=dict(spec), workdir=tmp_path / "b",
                                                   sources={"model.pt": tmp_path / "model.pt"}), hosted=True)
    with pytest.raises(ValueError, match="a team's code"):
        hosted.prepare()

    # A team's model.pt without a program (nothing declared its input, or torch.export could not trace it) fails
    # the attempt once (a UserError, not retried), naming the way out.
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    del state["program"]
    torch.save(state, tmp_path / "plain.pt")
    ctx = LocalContext(job_id="s", attempt_id="c", spec=dict(spec), workdir=tmp_path / "c",
                       devices=[DeviceHandle("virtual", 0, 2**30)], sources={"model.pt": tmp_path / "plain.pt"})
    with pytest.raises(UserError, match="holds no exported program"):
        ServeComponent().session(ctx).prepare()
