"""``model.pt``: the model artifact of a ``train`` job, a file that describes itself.

The train component owns this format: :class:`~components.train.loop.TrainLoop` writes it (:func:`save_model`)
and anyone who needs the trained module back -- the ``serve`` kind -- reads it with :func:`load_model`, never
by reading the workload's weight names. Format 2 (:data:`MODEL_FORMAT`) is one ``torch.save`` of a dict of
plain values and tensors, so it loads with ``torch.load(..., weights_only=True)``::

    {
        "format": 2,
        "workload": "tiny-gpt",              # the built-in workload's name (or a job's entrypoint)
        "config": {...} | None,              # Workload.model_config(): the architecture, enough for
                                             #   Workload.from_config(config) to rebuild the module
        "input": {"shape": [64], "dtype": "int64", "limit": 96} | None,   # one row, no batch dimension
        "output": {"shape": [64, 96], "dtype": "float32"} | None,
        "state_dict": {name: tensor},        # the trained weights (CPU)
        "spec": {...},                       # the normalized train spec, for information only
    }

``config``, ``input`` and ``output`` are None when the workload cannot describe its model (user code: an
``entrypoint``'s workload that does not implement :meth:`~components.train.workloads.Workload.model_config`).
Only built-in workloads are rebuilt: a user's model class is code the reader must not import.

**Older files.** ``model.pt`` files written before the format had a version (format 1, no ``"format"`` key:
``{"workload", "spec", "state_dict"}``) are still read: a built-in workload infers its config from its own
weights' names and shapes (:meth:`~components.train.workloads.Workload.config_from_weights`) and describes
its inputs and outputs from that, so the artifacts of older jobs stay servable. Any other format number is
refused with a ValueError naming it.

:func:`load_model` builds the module on the ``meta`` device and assigns the stored tensors to it: no random
initialisation runs (the process-global random streams, which co-located training jobs may use, are left
alone) and no memory is spent on weights that are replaced anyway. Then one zero row of the recorded input
goes through the module, and its output must have the recorded shape and dtype.
"""

from __future__ import annotations

import copy
import io
import itertools
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from components.train.workloads import BUILTIN_WORKLOADS, Workload

MODEL_FORMAT = 2
LEGACY_FORMAT = 1  # the unversioned {"workload", "spec", "state_dict"} of older jobs
DTYPES = {"float32": torch.float32, "int64": torch.int64}

Source = str | Path | bytes | bytearray | memoryview | BinaryIO


def rebuildable_workloads() -> tuple[str, ...]:
    """The workloads whose ``model.pt`` :func:`load_model` can rebuild (the built-in ones), sorted."""
    return tuple(sorted(name for name, cls in BUILTIN_WORKLOADS.items()
                        if cls.from_config.__func__ is not Workload.from_config.__func__))


def describe_model(workload: Workload, *, name: str | None = None, spec: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The description of ``workload``'s set-up model: every key of ``model.pt`` but ``state_dict``.

    ``name`` defaults to the workload's name (a job trained from an entrypoint passes the entrypoint).
    Plain values only, copied: the description does not change when training goes on.
    """
    config = workload.model_config()
    inputs = outputs = None
    if config is not None:
        config = copy.deepcopy(dict(config))
        inputs, outputs = (copy.deepcopy(dict(part)) for part in type(workload).describe_io(config))
    description = {
        "format": MODEL_FORMAT,
        "workload": name or workload.name,
        "config": config,
        "input": inputs,
        "output": outputs,
        "spec": copy.deepcopy(dict(spec or {})),
    }
    _check_plain(description, "the model description")
    return description


def save_model(target: str | Path | BinaryIO, description: dict[str, Any], state_dict: dict[str, torch.Tensor]
               ) -> None:
    """Write ``model.pt``: ``description`` (from :func:`describe_model`) and the weights ``state_dict``."""
    missing = {"format", "workload", "config", "input", "output", "spec"} - description.keys()
    if missing:
        raise ValueError(f"the model description lacks {', '.join(sorted(missing))}")
    _check_weights(state_dict, "state_dict")
    weights = {name: tensor.detach().cpu() for name, tensor in state_dict.items()}
    torch.save({**description, "state_dict": weights}, target)


def read_model(source: Source) -> dict[str, Any]:
    """Read and check ``model.pt`` (a path, its bytes or a binary file) without building the module.

    Returns the format-2 dict, ``state_dict`` included; an older (format 1) file of a built-in workload comes
    back with the config, input and output it implies and ``"format": 1``. Raises FileNotFoundError when a
    path names no file, and ValueError when the file is not a readable ``model.pt``.
    """
    label, stream = _open(source)
    try:
        # weights_only: a model.pt is tensors, strings and numbers; nothing in it may run code on load.
        saved = torch.load(stream, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{label} is not a readable model.pt: {type(error).__name__}: {_one_line(error)}") from error
    if not isinstance(saved, dict) or not {"workload", "state_dict"} <= saved.keys():
        raise ValueError(f"{label} is not the model.pt of a train job: expected a dict with at least the keys "
                         "workload and state_dict")
    version = saved.get("format", LEGACY_FORMAT)
    if version not in (LEGACY_FORMAT, MODEL_FORMAT) or isinstance(version, bool):
        raise ValueError(f"{label}: unsupported model.pt format {version!r} (formats {LEGACY_FORMAT} and "
                         f"{MODEL_FORMAT} can be read)")
    workload = saved["workload"]
    if not isinstance(workload, str) or not workload:
        raise ValueError(f"{label}: the workload is {workload!r}, not a name")
    state = saved["state_dict"]
    try:
        _check_weights(state, "state_dict")
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None
    spec = saved.get("spec")
    model = {
        "format": version,
        "workload": workload,
        "config": saved.get("config"),
        "input": saved.get("input"),
        "output": saved.get("output"),
        "state_dict": state,
        "spec": dict(spec) if isinstance(spec, dict) else {},
    }
    if version == LEGACY_FORMAT:
        cls = BUILTIN_WORKLOADS.get(workload)
        if cls is not None:
            try:
                model["config"] = cls.config_from_weights(state)
            except ValueError as error:
                raise ValueError(f"{label}: the weights do not fit a {workload} model: {error}") from None
            model["input"], model["output"] = cls.describe_io(model["config"])
    for key in ("config", "input", "output"):
        if model[key] is not None and not isinstance(model[key], dict):
            raise ValueError(f"{label}: {key} is a {type(model[key]).__name__}, not a dict")
    return model


def load_model(source: Source) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the trained module of ``model.pt`` (a path, its bytes or a binary file).

    Returns ``(module, description)``: the module in eval mode on the CPU with the trained weights, and the
    file's description (:func:`read_model` without ``state_dict``; ``input`` / ``output`` as above, with
    ``shape`` a list). The module is built by the workload's own ``from_config`` -- only built-in workloads.
    Raises FileNotFoundError when a path names no file, and ValueError (one line, naming the file) when the file
    is not a ``model.pt``, its format is unknown, its workload is not a built-in one, its config cannot be built
    or its weights or its recorded input and output do not fit the model.
    """
    model = read_model(source)
    label = _label(source)
    workload, config, state = model["workload"], model["config"], model.pop("state_dict")
    cls = BUILTIN_WORKLOADS.get(workload)
    if cls is None:
        raise ValueError(f"cannot rebuild workload {workload!r} from {label}: only built-in workloads can be "
                         f"rebuilt ({', '.join(rebuildable_workloads())})")
    if config is None:
        raise ValueError(f"{label} records no config of its {workload} model")
    inputs, outputs = _check_io(model["input"], model["output"], label)
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            module = cls.from_config(config)
    except (TypeError, ValueError, KeyError, RuntimeError) as error:
        raise ValueError(f"{label}: cannot build a {workload} model of config {config!r}: "
                         f"{type(error).__name__}: {_one_line(error)}") from error
    try:
        module.load_state_dict(state, strict=True, assign=True)  # a missing, extra or misshapen weight fails
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{label}: the weights do not fit a {workload} model: {_one_line(error)}") from error
    unset = [name for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers())
             if tensor.is_meta]
    if unset:
        raise ValueError(f"{label}: the {workload} model has tensors no weight sets: {', '.join(unset)}")
    module = module.to("cpu").eval()
    sample = torch.zeros((1, *inputs["shape"]), dtype=DTYPES[inputs["dtype"]])
    try:
        with torch.inference_mode():
            output = module(sample)
    except Exception as error:
        raise ValueError(f"{label}: the {workload} model fails on its recorded input {inputs}: "
                         f"{type(error).__name__}: {_one_line(error)}") from error
    produced = {"shape": list(output.shape[1:]), "dtype": str(output.dtype).removeprefix("torch.")}
    if produced != outputs:
        raise ValueError(f"{label}: the {workload} model gives {produced}, not the recorded output {outputs}")
    return module, {**model, "input": inputs, "output": outputs}


def _label(source: Source) -> str:
    """How errors name ``source``: its path, a binary file's name, or just "model.pt"."""
    if isinstance(source, (str, Path)):
        return str(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) and name else "model.pt"


def _open(source: Source) -> tuple[str, Any]:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no model file at {path}")
        return _label(source), path
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _label(source), io.BytesIO(bytes(source))
    return _label(source), source


def _check_io(inputs: Any, outputs: Any, label: str) -> tuple[dict[str, Any], dict[str, Any]]:
    def shape(part: dict[str, Any], what: str) -> list[int]:
        value = part.get("shape")
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in value):
            raise ValueError(f"{label}: the {what} shape {value!r} is not a list of positive sizes")
        return [int(size) for size in value]

    def dtype(part: dict[str, Any], what: str) -> str:
        if part.get("dtype") not in DTYPES:
            raise ValueError(f"{label}: the {what} dtype {part.get('dtype')!r} is not one of {', '.join(DTYPES)}")
        return part["dtype"]

    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise ValueError(f"{label} does not describe its model's input and output")
    limit = inputs.get("limit", 0)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"{label}: the input limit {limit!r} is not a count")
    return ({"shape": shape(inputs, "input"), "dtype": dtype(inputs, "input"), "limit": limit},
            {"shape": shape(outputs, "output"), "dtype": dtype(outputs, "output")})


def _check_weights(state: Any, what: str) -> None:
    if not isinstance(state, dict) or not all(
            isinstance(name, str) and isinstance(tensor, torch.Tensor) for name, tensor in state.items()):
        raise ValueError(f"{what} is not a mapping of names to tensors")


_PLAIN = (str, int, float, bool, type(None))


def _check_plain(value: Any, where: str) -> None:
    """Only what ``torch.load(weights_only=True)`` reads back: dicts, lists, tuples, strings, numbers, None."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, _PLAIN):
                raise TypeError(f"{where} has a key of type {type(key).__name__}")
            _check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
    elif not isinstance(value, _PLAIN):
        raise TypeError(f"{where} is a {type(value).__name__}: model.pt holds only plain values")


def _one_line(error: BaseException) -> str:
    # torch spreads its messages over lines; one line reads better in a log or a gRPC status.
    return " ".join(str(error).split())


__all__ = ["LEGACY_FORMAT", "MODEL_FORMAT", "describe_model", "load_model", "read_model", "rebuildable_workloads",
           "save_model"]
