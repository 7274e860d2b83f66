"""Rebuilding a train job's model from its model.pt: every built-in workload, without its training data."""

import pytest
import torch

from components.serving.model import load_served_model
from components.train import model_format
from components.train.spec import TrainSpec
from components.train.workloads import VOCABULARY, builtin_workload


def save_model(path, name, legacy=False, **fields):
    """A model.pt exactly as a train job stores it (or, ``legacy``, as older jobs stored it: format 1), after
    two real steps of ``name``."""
    spec = TrainSpec().validate({"workload": name, "seed": 4, **fields})
    workload = builtin_workload(name)
    workload.setup(spec, torch.device("cpu"))
    for index in range(2):
        workload.train_step(workload.batch(0, index))
    if legacy:
        torch.save({"workload": name, "spec": spec, "state_dict": workload.model_state()}, path)
    else:
        model_format.save_model(path, model_format.describe_model(workload, spec=spec), workload.model_state())
    return workload


def test_mlp_digits_is_rebuilt_from_the_trained_weights(digits_model, digits_test_set):
    served = load_served_model(digits_model)
    assert (served.workload, served.input_shape, served.input_dtype, served.output_shape) == (
        "mlp-digits", (64,), "float32", (10,))
    assert served.input_limit == 0 and served.output_dtype == "float32"
    assert served.source_spec["hidden"] == 64
    assert not served.module.training
    assert all(p.device.type == "cpu" for p in served.module.parameters())
    assert served.sample.shape == (1, 64) and served.sample.dtype == torch.float32
    features, labels = digits_test_set
    with torch.inference_mode():
        predicted = served.module(torch.from_numpy(features)).argmax(dim=1).numpy()
    assert (predicted == labels).mean() > 0.85


@pytest.mark.parametrize("legacy", [False, True], ids=["format-2", "legacy-format-1"])
@pytest.mark.parametrize(
    ("name", "fields", "input_shape", "dtype", "output_shape", "limit"),
    [
        ("mlp-digits", {"hidden": 16}, (64,), torch.float32, (10,), 0),
        ("cnn-synthetic", {"hidden": 8}, (1, 16, 16), torch.float32, (6,), 0),
        ("tiny-gpt", {"hidden": 32, "batch_size": 4}, (64,), torch.int64, (64, len(VOCABULARY)), len(VOCABULARY)),
    ],
)
def test_builtin_workloads_serve_the_same_outputs(tmp_path, name, fields, input_shape, dtype, output_shape, limit,
                                                  legacy):
    trained = save_model(tmp_path / "model.pt", name, legacy=legacy, **fields)
    served = load_served_model(tmp_path / "model.pt")
    assert (served.workload, served.input_shape, served.output_shape, served.input_limit) == (
        name, input_shape, output_shape, limit)
    assert served.input_dtype == str(dtype).removeprefix("torch.")
    assert served.sample.dtype == dtype and served.sample.shape == (1, *input_shape)
    rows = trained.batch(0, 0)[0][:3]
    trained.model.eval()
    with torch.inference_mode():
        assert torch.equal(served.module(rows), trained.model(rows))


def test_loading_leaves_the_global_random_stream_alone(digits_model):
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    load_served_model(digits_model)
    assert torch.equal(torch.rand(3), expected)


def test_bad_files_fail_clearly(tmp_path, digits_model):
    with pytest.raises(FileNotFoundError):
        load_served_model(tmp_path / "missing.pt")

    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a torch file at all")
    with pytest.raises(ValueError, match="not a readable model.pt"):
        load_served_model(corrupt)

    torch.save({"weights": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not the model.pt of a train job"):
        load_served_model(tmp_path / "other.pt")

    saved = torch.load(digits_model, weights_only=True)
    assert saved["format"] == model_format.MODEL_FORMAT
    torch.save({**saved, "workload": "custom"}, tmp_path / "custom.pt")
    with pytest.raises(ValueError, match="only built-in workloads.*mlp-digits"):
        load_served_model(tmp_path / "custom.pt")

    state = dict(saved["state_dict"])
    del state["2.bias"]
    torch.save({**saved, "state_dict": state}, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match="do not fit a mlp-digits model.*2.bias"):
        load_served_model(tmp_path / "partial.pt")

    # A file whose workload does not match its weights: the config builds a CNN the weights do not fit.
    legacy = {key: saved[key] for key in ("spec", "state_dict")}
    torch.save({**legacy, "workload": "cnn-synthetic"}, tmp_path / "mislabelled.pt")
    with pytest.raises(ValueError, match="no 4-d tensor '0.weight'"):
        load_served_model(tmp_path / "mislabelled.pt")
    cnn_config = {"in_channels": 1, "size": 16, "hidden": 8, "classes": 10}
    torch.save({**saved, "workload": "cnn-synthetic", "config": cnn_config}, tmp_path / "mislabelled2.pt")
    with pytest.raises(ValueError, match="do not fit a cnn-synthetic model"):
        load_served_model(tmp_path / "mislabelled2.pt")


def test_the_light_spec_names_exactly_the_workloads_that_can_be_rebuilt():
    from components.serving.model import servable_workloads
    from components.serving.spec import SERVABLE_WORKLOADS

    assert set(SERVABLE_WORKLOADS) == set(servable_workloads())
