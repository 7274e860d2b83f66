import subprocess
import sys

import pytest

from components.runtime.contract.spec import SpecError
from components.train.spec import FIELDS, TrainSpec

SPEC = TrainSpec()


def errors_of(spec) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        SPEC.validate(spec)
    return caught.value.errors


def test_defaults_are_filled_for_a_builtin_workload():
    assert SPEC.validate({"workload": "mlp-digits"}) == {
        "workload": "mlp-digits",
        "entrypoint": None,
        "epochs": 3,
        "max_steps": None,
        "batch_size": 64,
        "lr": 0.003,
        "seed": 0,
        "checkpoint_every": 50,
        "log_every": 10,
        "optimizer": "adam",
        "hidden": 128,
        "options": {},
        "data": {},
    }


def test_defaults_depend_on_workload_and_optimizer():
    gpt = SPEC.validate({"workload": "tiny-gpt"})
    assert (gpt["epochs"], gpt["hidden"]) == (5, 64)
    assert SPEC.validate({"workload": "cnn-synthetic"})["hidden"] == 16
    assert SPEC.validate({"workload": "cnn-synthetic", "optimizer": "sgd"})["lr"] == 0.05
    # Explicit values win, and nullable fields fall back to their defaults.
    assert SPEC.validate({"workload": "tiny-gpt", "epochs": 2, "lr": 0.01, "hidden": 32})["epochs"] == 2
    assert SPEC.validate({"workload": "tiny-gpt", "epochs": None, "lr": None})["epochs"] == 5


def test_entrypoint_spec_is_normalized_and_keeps_options():
    spec = SPEC.validate({"entrypoint": "my_pkg.train:main", "options": {"depth": 3}, "max_steps": 7})
    assert spec["workload"] is None
    assert spec["entrypoint"] == "my_pkg.train:main"
    assert spec["options"] == {"depth": 3}
    assert spec["max_steps"] == 7
    assert spec["hidden"] is None
    assert spec["epochs"] == 3


@pytest.mark.parametrize(
    "raw",
    [
        {"workload": "cnn-synthetic", "seed": 7, "max_steps": 3},
        {"entrypoint": "a.b:c", "options": {"x": [1, 2]}},
        {"workload": "tiny-gpt", "hidden": 32, "optimizer": "sgd"},
    ],
)
def test_validation_is_idempotent(raw):
    normalized = SPEC.validate(raw)
    assert SPEC.validate(normalized) == normalized


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workload", "resnet-9000"),
        ("workload", 3),
        ("entrypoint", "not a path"),
        ("entrypoint", "module_without_function"),
        ("epochs", 0),
        ("epochs", 1.5),
        ("epochs", "3"),
        ("max_steps", 0),
        ("batch_size", 0),
        ("batch_size", 65_537),
        ("batch_size", True),
        ("batch_size", None),
        ("lr", 0),
        ("lr", -0.1),
        ("lr", "fast"),
        ("seed", -1),
        ("seed", 2**32),
        ("checkpoint_every", 0),
        ("log_every", 0),
        ("optimizer", "rmsprop"),
        ("hidden", 0),
        ("hidden", 5000),
        ("options", [1, 2]),
    ],
)
def test_each_bad_field_is_named(field, value):
    base = {"entrypoint": "a.b:c"} if field == "options" else {"workload": "mlp-digits"}
    if field == "entrypoint":
        base = {}
    assert list(errors_of({**base, field: value})) == [f"spec.{field}"]


def test_every_bad_field_is_reported_at_once():
    errors = errors_of(
        {"workload": "tiny-gpt", "hidden": 10, "epochs": 0, "optimizer": "lion", "colour": "red"}
    )
    assert set(errors) == {"spec.hidden", "spec.epochs", "spec.optimizer", "spec.colour"}
    assert "multiple of 4" in errors["spec.hidden"]
    assert "unknown field" in errors["spec.colour"]


def test_unknown_field_is_rejected():
    assert errors_of({"workload": "mlp-digits", "learning_rate": 0.1}) == {
        "spec.learning_rate": "unknown field; allowed: " + ", ".join(sorted(FIELDS))
    }


def test_workload_and_entrypoint_are_exclusive():
    errors = errors_of({"workload": "mlp-digits", "entrypoint": "a.b:c"})
    assert set(errors) == {"spec.workload", "spec.entrypoint"}
    assert all("not workload and entrypoint" in message for message in errors.values())
    assert "an entrypoint or a command" in errors_of({"epochs": 2})["spec.workload"]
    errors = errors_of({"workload": "mlp-digits", "command": ["python", "main.py"]})
    assert set(errors) == {"spec.workload", "spec.command"}


def test_a_command_is_a_list_of_strings_and_takes_no_options_or_distributed():
    spec = TrainSpec().validate({"command": ["python", "main.py", "--lr", 0.1, "--epochs", 3],
                                 "environment": {"requirements": "requirements.txt", "env": {"MODE": 1}}})
    assert spec["command"] == ["python", "main.py", "--lr", "0.1", "--epochs", "3"]
    assert spec["environment"] == {"requirements": "requirements.txt", "pip": [], "python_path": [],
                                   "env": {"MODE": "1"}}
    errors = errors_of({"command": ["python", True], "options": {"a": 1}, "distributed": {"strategy": "ddp"},
                        "environment": {"requirements": "../x", "pip": ["-e ."], "env": {"RANK": "1"}, "zz": 1}})
    assert {"spec.command", "spec.options", "spec.distributed", "spec.environment.requirements",
            "spec.environment.pip", "spec.environment.env.RANK", "spec.environment.zz"} <= set(errors)
    assert "non-empty list" in errors_of({"command": []})["spec.command"]


def test_options_only_with_an_entrypoint_and_json_only():
    assert "entrypoint" in errors_of({"workload": "mlp-digits", "options": {"a": 1}})["spec.options"]
    assert "JSON" in errors_of({"entrypoint": "a.b:c", "options": {"a": float("nan")}})["spec.options"]
    assert "JSON" in errors_of({"entrypoint": "a.b:c", "options": {"a": object()}})["spec.options"]


def test_a_spec_must_be_an_object():
    assert errors_of(["workload", "mlp-digits"]) == {"spec": "must be an object"}


def test_spec_module_does_not_import_heavy_libraries():
    code = (
        "import sys, components.train.spec\n"
        "heavy = [name for name in ('torch', 'numpy', 'sklearn') if name in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class TestJsonSchema:
    @pytest.fixture(scope="class")
    def validator(self):
        jsonschema = pytest.importorskip("jsonschema")
        schema = SPEC.json_schema()
        jsonschema.Draft202012Validator.check_schema(schema)
        return jsonschema.Draft202012Validator(schema)

    def test_lists_every_field(self):
        schema = SPEC.json_schema()
        assert set(schema["properties"]) == FIELDS
        assert schema["additionalProperties"] is False
        assert schema["properties"]["workload"]["enum"][:3] == ["mlp-digits", "cnn-synthetic", "tiny-gpt"]

    @pytest.mark.parametrize(
        "raw",
        [
            {"workload": "mlp-digits"},
            {"workload": "tiny-gpt", "hidden": 32, "max_steps": 5},
            {"entrypoint": "pkg.mod:fn", "options": {"a": 1}},
        ],
    )
    def test_accepts_valid_and_normalized_specs(self, validator, raw):
        assert not list(validator.iter_errors(raw))
        assert not list(validator.iter_errors(SPEC.validate(raw)))

    @pytest.mark.parametrize(
        "raw",
        [
            {},
            {"workload": "mlp-digits", "entrypoint": "a.b:c"},
            {"workload": "mlp-digits", "extra": 1},
            {"workload": "mlp-digits", "batch_size": 0},
            {"workload": "mlp-digits", "lr": 0},
            {"workload": "mlp-digits", "options": {"a": 1}},
            {"workload": "tiny-gpt", "hidden": 10},
            {"entrypoint": "no colon"},
        ],
    )
    def test_rejects_what_validate_rejects(self, validator, raw):
        assert list(validator.iter_errors(raw))
        with pytest.raises(SpecError):
            SPEC.validate(raw)


def test_data_options_belong_to_an_installed_provider():
    """``spec.data`` opts a job into a plugin's prepared-data provider; with none installed that takes an
    option, every unknown option is named at once, beside the spec's other errors."""
    assert SPEC.validate({"workload": "mlp-digits", "data": {}})["data"] == {}
    errors = errors_of({"workload": "mlp-digits", "data": {"shard": True, "speed": 2}, "batch_size": 0})
    assert {"spec.data.shard", "spec.data.speed", "spec.batch_size"} <= set(errors)
    assert "no installed plugin takes this data option" in errors["spec.data.shard"]
    assert SPEC.validate({"workload": "mlp-digits", "data": {"cache": True}})["data"] == {"cache": True}
    assert set(errors_of({"workload": "mlp-digits", "data": [1]})) == {"spec.data"}
    assert set(errors_of({"workload": "mlp-digits", "data": {"x": float("nan")}})) == {"spec.data"}


def test_distributed_is_checked_with_the_rest_and_stored_normalized():
    """``spec.distributed`` (a gang's strategy, components.runtime.contract.distributed): every bad option is named beside
    the spec's other errors; a good one is stored with its defaults, and only when given."""
    assert "distributed" not in SPEC.validate({"workload": "mlp-digits"})
    errors = errors_of({"workload": "mlp-digits", "epochs": 0,
                        "distributed": {"strategy": "nope", "slow": {"factor": 0}}})
    assert {"spec.epochs", "spec.distributed.strategy", "spec.distributed.slow",
            "spec.distributed.slow.factor"} <= set(errors)
    assert set(errors_of({"workload": "mlp-digits", "distributed": {"strategy": "ddp", "bucket_mb": 0}})) == {
        "spec.distributed.bucket_mb"}
    spec = SPEC.validate({"workload": "mlp-digits", "distributed": {"strategy": "post-local-sgd", "period": 8,
                                                                    "slow": {"ranks": [1], "factor": 2}}})
    assert spec["distributed"] == {"strategy": "post-local-sgd", "backend": "auto", "timeout_s": 120.0,
                                   "period": 8, "warmup": 0, "slow": {"ranks": [1], "factor": 2}}
    assert SPEC.validate(spec) == spec  # the node validates the stored spec again
    assert SPEC.validate({"workload": "mlp-digits", "distributed": None}).get("distributed") is None


def test_a_streaming_workload_cannot_be_trained_by_a_gang():
    errors = errors_of({"workload": "cnn-dataset", "distributed": {"strategy": "ddp"}})
    assert "one worker" in errors["spec.distributed"]
    errors = errors_of({"workload": "cnn-dataset", "distributed": {"strategy": "nope"}})
    assert {"spec.distributed.strategy", "spec.data.dataset"} <= set(errors)
    for workload in ("mlp-digits", "cnn-synthetic", "cnn-fc", "tiny-gpt", "moe-gpt"):
        assert SPEC.validate({"workload": workload, "distributed": {}})["distributed"]["strategy"] == "ddp"


def test_a_gang_too_small_for_its_strategy_is_named_on_resources_workers():
    from components.train.spec import TrainSpec

    spec = TrainSpec().validate({"workload": "mlp-digits", "distributed": {"strategy": "post-local-sgd"}})
    problems = TrainSpec().resource_problems(spec, {"gpus": 1, "workers": 1})
    assert "at least 2 workers" in problems["resources.workers"]
    assert TrainSpec().resource_problems(spec, {"gpus": 1, "workers": 2}) == {}
    stanza = TrainSpec().validate({"workload": "cnn-fc", "distributed": {"strategy": "stanza", "fc_workers": 2}})
    assert "at least 4 workers" in TrainSpec().resource_problems(stanza, {"gpus": 1, "workers": 3})["resources.workers"]
    single = TrainSpec().validate({"workload": "mlp-digits"})
    assert TrainSpec().resource_problems(single, {"gpus": 1, "workers": 1}) == {}
