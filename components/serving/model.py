"""Rebuild the model of a finished ``train`` job from its ``model.pt``, ready to serve.

``model.pt`` is ``{"workload": name, "spec": normalized train spec, "state_dict": weights}`` (written by
:meth:`components.train.loop.TrainLoop._store_results`). Only built-in workloads can be rebuilt: an
entrypoint's model class is user code the serving side cannot know. The architecture's sizes are read from
the weights' shapes rather than from the spec, so no training data is loaded (the digits and the corpus are
never read) and a spec default that changed since training cannot rebuild the wrong model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

SAMPLE_ROWS = 1


@dataclass
class ServedModel:
    """A trained model ready for inference, and the contract of its requests.

    ``module`` is in eval mode on the CPU (the executor moves it to its device). A request is a batch of
    rows: ``(rows, *input_shape)`` of ``input_dtype`` ("float32" or "int64"); the answer is
    ``(rows, *output_shape)`` of ``output_dtype``. ``input_limit`` bounds int64 inputs (token ids must be in
    ``[0, input_limit)``), 0 when there is no bound. ``sample`` is a ``SAMPLE_ROWS``-row input used to
    profile the model's memory (:func:`components.gpushare.memory.profile_module`).
    """

    workload: str
    source_spec: dict[str, Any]
    module: nn.Module
    sample: torch.Tensor
    input_shape: tuple[int, ...]
    input_dtype: str
    output_shape: tuple[int, ...]
    output_dtype: str = "float32"
    input_limit: int = 0


def _shape(state: dict[str, torch.Tensor], key: str, dims: int) -> tuple[int, ...]:
    tensor = state.get(key)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != dims:
        raise ValueError(f"the weights have no {dims}-d tensor {key!r}")
    return tuple(tensor.shape)


def _build_mlp_digits(spec, state) -> tuple[nn.Module, tuple[int, ...], str, int]:
    from components.train.workloads import MLPDigits

    hidden, features = _shape(state, "0.weight", 2)
    classes, _ = _shape(state, "4.weight", 2)
    # build_model reads the input width from an example batch and the width from the spec.
    module = MLPDigits().build_model({**spec, "hidden": hidden}, torch.zeros(1, features), classes)
    return module, (features,), "float32", 0


def _build_cnn_synthetic(spec, state) -> tuple[nn.Module, tuple[int, ...], str, int]:
    from components.train.workloads import CNNSynthetic

    channels, in_channels, _, _ = _shape(state, "0.weight", 4)
    classes, _ = _shape(state, "7.weight", 2)
    size = CNNSynthetic.image_size
    example = torch.zeros(1, in_channels, size, size)
    module = CNNSynthetic().build_model({**spec, "hidden": channels}, example, classes)
    return module, (in_channels, size, size), "float32", 0


_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def _build_tiny_gpt(spec, state) -> tuple[nn.Module, tuple[int, ...], str, int]:
    from components.train.workloads import TinyGPT, TinyGPTWorkload

    vocabulary, width = _shape(state, "tokens.weight", 2)
    context, _ = _shape(state, "positions.weight", 2)
    layers = 1 + max((int(m.group(1)) for key in state if (m := _BLOCK.match(key))), default=-1)
    # The head count leaves no trace in the weights' shapes; it is fixed by the workload.
    module = TinyGPT(vocabulary, context, width, TinyGPTWorkload.heads, layers)
    return module, (context,), "int64", vocabulary


BUILDERS: dict[str, Callable[[dict[str, Any], dict[str, torch.Tensor]], tuple[nn.Module, tuple[int, ...], str, int]]] = {
    "mlp-digits": _build_mlp_digits,
    "cnn-synthetic": _build_cnn_synthetic,
    "tiny-gpt": _build_tiny_gpt,
}


def load_served_model(path: str | Path) -> ServedModel:
    """Load ``model.pt`` at ``path`` and rebuild its module with the trained weights.

    Raises :class:`FileNotFoundError` when there is no file, and :class:`ValueError` when the file is not a
    ``model.pt`` of a train job, its workload is not a built-in one, or its weights do not fit the workload.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    try:
        # weights_only: a model.pt is tensors, strings and numbers; nothing in it should run code on load.
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        detail = " ".join(str(error).split())
        raise ValueError(f"{path} is not a readable model.pt: {type(error).__name__}: {detail}") from error
    if not isinstance(saved, dict) or not {"workload", "spec", "state_dict"} <= saved.keys():
        raise ValueError(f"{path} is not the model.pt of a train job: expected the keys workload, spec and "
                         "state_dict")
    workload, spec, state = saved["workload"], saved["spec"], saved["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise ValueError(f"{path}: state_dict is not a mapping of tensors")
    builder = BUILDERS.get(workload) if isinstance(workload, str) else None
    if builder is None:
        raise ValueError(f"cannot serve workload {workload!r} from {path}: only built-in workloads can be rebuilt "
                         f"({', '.join(sorted(BUILDERS))})")
    spec = dict(spec) if isinstance(spec, dict) else {}
    try:
        # Fresh layers draw their initial weights from the global RNG; the process may be shared with
        # training jobs, so their random streams are left as they were.
        with torch.random.fork_rng(devices=[]):
            module, input_shape, input_dtype, input_limit = builder(spec, state)
        module.load_state_dict(state)  # strict: a missing, extra or misshapen weight is an error
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        # torch spreads its message over lines; one line reads better in a log or a gRPC status.
        raise ValueError(f"{path}: the weights do not fit a {workload} model: {' '.join(str(error).split())}") from error
    module = module.to("cpu").eval()
    dtype = torch.int64 if input_dtype == "int64" else torch.float32
    sample = torch.zeros((SAMPLE_ROWS, *input_shape), dtype=dtype)
    with torch.inference_mode():
        output = module(sample)
    return ServedModel(
        workload=workload,
        source_spec=spec,
        module=module,
        sample=sample,
        input_shape=tuple(input_shape),
        input_dtype=input_dtype,
        output_shape=tuple(output.shape[1:]),
        # What the wire will carry (components.serving.endpoint.encode_tensor).
        output_dtype="float32" if output.is_floating_point() else "int64",
        input_limit=int(input_limit),
    )


__all__ = ["BUILDERS", "ServedModel", "load_served_model"]
