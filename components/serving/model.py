"""Rebuild the model of a finished ``train`` job from its ``model.pt``, ready to serve.

``model.pt`` describes itself (workload, architecture config, input and output, weights: see
:mod:`components.train.model_format`, which the train component owns). This module only turns what
:func:`components.train.model_format.load_model` gives back into a :class:`ServedModel`; it knows nothing of
the workloads' weights. Built-in workloads are rebuilt from their config; a team's own model is served from the
program its train job exported into ``model.pt`` (``torch.export``; no class of the team's is imported), only in a
process of the job's own (``allow_program``), or through a loader class of the team's (:func:`load_user_model`).
No training data is loaded (the digits and the corpus are never read). Files of older train jobs (the
unversioned format 1) are still served: the loader infers their config.
"""

from __future__ import annotations

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

    ``variable_length``: a request may also carry shorter rows, ``(rows, length, *input_shape[1:])`` with
    ``1 <= length <= input_shape[0]``, and gets ``(rows, length, *output_shape[1:])`` back; rows of different
    lengths are batched by right-padding them (:meth:`pad_to`). Their run time grows with the length, which is
    the feature the deadline-aware batcher buckets requests by.
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
    variable_length: bool = False

    def length(self, inputs: torch.Tensor) -> int:
        """The length of a request's rows (its first row dimension), 1 for a model of fixed-size rows."""
        return int(inputs.shape[1]) if self.variable_length and inputs.dim() > 1 else 1

    def pad_to(self, inputs: torch.Tensor, length: int) -> torch.Tensor:
        """``inputs`` right-padded with zeros to ``length`` along the first row dimension."""
        missing = length - int(inputs.shape[1])
        if missing <= 0:
            return inputs
        padding = inputs.new_zeros((inputs.shape[0], missing, *inputs.shape[2:]))
        return torch.cat([inputs, padding], dim=1)


def load_served_model(path: str | Path, *, allow_program: bool = False) -> ServedModel:
    """Load ``model.pt`` at ``path`` and rebuild its module with the trained weights: a built-in workload from
    its config, or, with ``allow_program`` (a process of the job's own, never the GPU-sharing service), a team's
    model from the program its train job exported.

    Raises :class:`FileNotFoundError` when there is no file, and :class:`ValueError` when the file is not a
    ``model.pt`` of a train job, its workload is not a built-in one and it holds no program (or
    ``allow_program`` is false), or its weights do not fit the workload (the messages of
    :func:`components.train.model_format.load_model`).
    """
    from components.train.model_format import DTYPES, load_model
    from components.train.workloads import BUILTIN_WORKLOADS

    try:
        module, description = load_model(Path(path), allow_program=allow_program)
    except ValueError:
        found = _load_zoo_model(Path(path))
        if found is None:
            raise
        module, description = found
    inputs, outputs = description["input"], description["output"]
    input_shape = tuple(inputs["shape"])
    return ServedModel(
        workload=description["workload"],
        source_spec=dict(description["spec"]),
        module=module,
        sample=torch.zeros((SAMPLE_ROWS, *input_shape), dtype=DTYPES[inputs["dtype"]]),
        input_shape=input_shape,
        input_dtype=inputs["dtype"],
        output_shape=tuple(outputs["shape"]),
        # What the wire will carry (components.serving.endpoint.encode_tensor).
        output_dtype=outputs["dtype"],
        input_limit=int(inputs["limit"]),
        variable_length=bool(getattr(BUILTIN_WORKLOADS.get(description["workload"]), "variable_length", False)),
    )


def _load_zoo_model(path: Path) -> tuple[nn.Module, dict[str, Any]] | None:
    """``(module, description)`` of a ``model.pt`` whose workload is one of the serving component's own
    (:data:`components.serving.earlyexit.ZOO`: trained from an entry point of this component, not a team's
    code), rebuilt from its config as :func:`components.train.model_format.load_model` rebuilds a built-in
    one; None for any other workload."""
    from components.serving.earlyexit import ZOO
    from components.train.model_format import DTYPES, read_model

    model = read_model(path)
    cls = ZOO.get(model["workload"])
    if cls is None:
        return None
    config = model["config"]
    if not isinstance(config, dict):
        raise ValueError(f"{path} records no config of its {model['workload']} model")
    inputs, outputs = cls.describe_io(config)
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            module = cls.from_config(config)
        module.load_state_dict(model["state_dict"], strict=True, assign=True)
    except (TypeError, ValueError, KeyError, RuntimeError) as error:
        raise ValueError(f"{path}: the weights do not fit a {model['workload']} model of config {config!r}: "
                         f"{' '.join(str(error).split())}") from error
    module = module.to("cpu").eval()
    with torch.inference_mode():
        produced = module(torch.zeros((1, *inputs["shape"]), dtype=DTYPES[inputs["dtype"]]))
    if list(produced.shape[1:]) != list(outputs["shape"]):
        raise ValueError(f"{path}: the {model['workload']} model gives rows of {list(produced.shape[1:])}, not "
                         f"the recorded {outputs['shape']}")
    if hasattr(module, "reset_depths"):
        module.reset_depths()  # the check above is no request
    model.pop("state_dict")
    model.pop("program")
    return module, {**model, "input": inputs, "output": outputs, "program": None}


class UserModule(nn.Module):
    """A user model as a module: ``forward`` hands the batch to its ``predict`` as numpy and takes numpy back."""

    def __init__(self, model: Any):
        super().__init__()
        self.user = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        import numpy as np

        answer = np.asarray(self.user.predict(inputs.detach().cpu().numpy()))
        return torch.from_numpy(np.ascontiguousarray(answer))


def load_user_model(path: str | Path, entrypoint: str) -> ServedModel:
    """Serve ``model.pt`` at ``path`` through user code: ``entrypoint`` (``"package.module:Name"``) names a class
    (or factory) whose instances have ``load(path)``, ``predict(batch: numpy array) -> numpy array`` and the
    attributes ``input_shape`` (one row, no batch dimension), ``input_dtype`` (``"float32"`` or ``"int64"``),
    ``output_shape`` and optionally ``output_dtype`` (default ``"float32"``) and ``input_limit`` (int64 inputs
    lie in ``[0, input_limit)``; 0: no bound). One zero row goes through ``predict`` and must come back with the
    declared output shape. Raises ValueError naming what breaks the contract (ImportError when it cannot import).
    """
    import numpy as np

    from components.runtime.contract.registry import import_path

    try:
        factory = import_path(entrypoint)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import the model entrypoint {entrypoint!r}: {error}") from error
    model = factory()
    missing = [name for name in ("load", "predict", "input_shape", "input_dtype", "output_shape")
               if not hasattr(model, name)]
    if missing:
        raise ValueError(f"the model entrypoint {entrypoint!r} lacks {', '.join(missing)} (the contract: load(path), "
                         f"predict(batch), input_shape, input_dtype, output_shape)")
    model.load(Path(path))
    input_shape = tuple(int(size) for size in model.input_shape)
    output_shape = tuple(int(size) for size in model.output_shape)
    input_dtype = str(model.input_dtype)
    output_dtype = str(getattr(model, "output_dtype", "float32"))
    for role, dtype in (("input_dtype", input_dtype), ("output_dtype", output_dtype)):
        if dtype not in ("float32", "int64"):
            raise ValueError(f"the model entrypoint {entrypoint!r} has {role} {dtype!r}: use float32 or int64")
    sample = np.zeros((SAMPLE_ROWS, *input_shape), dtype=input_dtype)
    answer = np.asarray(model.predict(sample))
    if answer.shape != (SAMPLE_ROWS, *output_shape):
        raise ValueError(f"the model entrypoint {entrypoint!r} answered one row with shape {list(answer.shape)}, "
                         f"not [1, {', '.join(map(str, output_shape))}] (its output_shape)")
    return ServedModel(workload=entrypoint, source_spec={}, module=UserModule(model).eval(),
                       sample=torch.from_numpy(sample), input_shape=input_shape, input_dtype=input_dtype,
                       output_shape=output_shape, output_dtype=output_dtype,
                       input_limit=int(getattr(model, "input_limit", 0) or 0))


def servable_workloads() -> tuple[str, ...]:
    """The workloads whose ``model.pt`` can be served without a loader class: the train component's built-in ones
    (:func:`components.train.model_format.rebuildable_workloads`) and this component's early-exit network."""
    from components.serving.earlyexit import NAME
    from components.train.model_format import rebuildable_workloads

    return tuple(sorted((*rebuildable_workloads(), NAME)))


__all__ = ["ServedModel", "UserModule", "load_served_model", "load_user_model", "servable_workloads"]
