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
        "program": {"format": "torch.export", "archive": uint8 tensor} | absent,   # see below
    }

``config`` is None when the workload cannot describe its model's architecture (user code: an ``entrypoint``'s
workload that does not implement :meth:`~components.train.workloads.Workload.model_config`). Only built-in
workloads are rebuilt from their config: a user's model class is code the reader must not import.

**Exported programs (a team's own model).** A workload whose model cannot be rebuilt from a config but that
declares what one row of its model takes (:meth:`~components.train.workloads.Workload.serving_input`; every
``ClassificationWorkload`` does) gets its trained model *exported* as well (:func:`export_program`):
``torch.export`` traces the module, in eval mode on the CPU, with a dynamic batch dimension, into a graph of
PyTorch operators with the weights, and ``model.pt`` keeps that archive (``torch.export.save``'s bytes) as a
uint8 tensor under ``program``, with ``input`` and ``output`` describing one row. A reader then needs no class of
the team's: :func:`load_model` with ``allow_program=True`` deserializes the graph. That graph is still the
team's code (``torch.export.load`` may unpickle, and the graph may call any attribute of ``torch``), so it is
loaded only where a team's code may run, in a process of the job's own (the serve kind loads it only outside the
GPU-sharing service, where the node's sandbox applies): by default :func:`load_model` refuses it. The weights are
stored twice (``state_dict`` and in the archive), so ``state_dict`` stays readable on its own. A model that
``torch.export`` cannot trace (data-dependent Python control flow, say) is saved without a program, with its
reason logged; it is then served through a loader class of the team's (the serve kind's ``model.entrypoint``).
The key is optional: a format-2 file without it reads as before, and a reader that does not know it ignores it.

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
PROGRAM_FORMAT = "torch.export"  # model.pt's "program": torch.export.save's archive
EXPORT_ROWS = 2  # the example batch the export traces: a batch of 1 would be specialized to 1
MAX_EXPORT_ROWS = 65536  # the dynamic batch dimension's bound (the serve kind's largest max_rows)

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


def save_model(target: str | Path | BinaryIO, description: dict[str, Any], state_dict: dict[str, torch.Tensor],
               program: dict[str, Any] | None = None) -> None:
    """Write ``model.pt``: ``description`` (from :func:`describe_model`) and the weights ``state_dict``, plus the
    exported ``program`` when given (from :func:`export_program`: its archive, and the ``input`` and ``output``
    it was traced with, which then describe the model)."""
    missing = {"format", "workload", "config", "input", "output", "spec"} - description.keys()
    if missing:
        raise ValueError(f"the model description lacks {', '.join(sorted(missing))}")
    _check_weights(state_dict, "state_dict")
    weights = {name: tensor.detach().cpu() for name, tensor in state_dict.items()}
    saved = {**description, "state_dict": weights}
    if program is not None:
        archive = bytes(program["archive"])
        saved.update(input=copy.deepcopy(dict(program["input"])), output=copy.deepcopy(dict(program["output"])),
                     program={"format": PROGRAM_FORMAT,
                              "archive": torch.frombuffer(bytearray(archive), dtype=torch.uint8).clone()})
    torch.save(saved, target)


def export_program(workload: Workload) -> dict[str, Any] | None:
    """The set-up model of ``workload`` exported for serving without its class, or None when there is nothing to
    export: a built-in workload (rebuilt from its config instead), no ``serving_input()``, or no ``model``.

    Returns ``{"archive": bytes, "input": {"shape", "dtype", "limit"}, "output": {"shape", "dtype"}}``: the
    module, copied to the CPU in eval mode, traced by ``torch.export`` on a zero batch of :data:`EXPORT_ROWS`
    rows with a dynamic batch dimension, checked against the module itself on a random batch of 3 rows and on one
    row, and saved. Raises ValueError (one line) when the model cannot be exported or the program does not give
    the module's outputs; the caller logs it and saves the model without a program.
    """
    if workload.model_config() is not None:
        return None
    inputs = workload.serving_input()
    model = getattr(workload, "model", None)
    if inputs is None or not isinstance(model, nn.Module):
        return None
    inputs = _check_io(inputs, {"shape": [1], "dtype": "float32"}, "serving_input()")[0]
    dtype = DTYPES[inputs["dtype"]]
    with torch.random.fork_rng(devices=[]):
        sample = torch.zeros((EXPORT_ROWS, *inputs["shape"]), dtype=dtype)
        if inputs["dtype"] == "int64":
            probe = torch.randint(0, max(1, inputs["limit"] or 2), (3, *inputs["shape"]))
        else:
            probe = torch.randn((3, *inputs["shape"]))
        try:
            import torch.export as export

            module = copy.deepcopy(model).to("cpu").eval()

            batch = export.Dim("batch", min=1, max=MAX_EXPORT_ROWS)
            with torch.no_grad():
                program = export.export(module, (sample,), dynamic_shapes=({0: batch},), strict=False)
            buffer = io.BytesIO()
            export.save(program, buffer)
            archive = buffer.getvalue()
            exported = export.load(io.BytesIO(archive)).module()
            with torch.inference_mode():
                expected, got = module(probe), exported(probe)
                single = exported(probe[:1])
        except Exception as error:
            raise ValueError(f"torch.export cannot export the model: {type(error).__name__}: "
                             f"{_one_line(error)[:300]}") from error
    if not isinstance(expected, torch.Tensor) or not isinstance(got, torch.Tensor):
        raise ValueError(f"the model gives a {type(expected).__name__}, not one tensor")
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise ValueError("the exported program does not give the model's outputs on a batch of 3 rows")
    if single.shape[1:] != expected.shape[1:]:
        raise ValueError("the exported program does not take a batch of one row")
    output = {"shape": list(expected.shape[1:]), "dtype": str(expected.dtype).removeprefix("torch.")}
    if output["dtype"] not in DTYPES or not output["shape"]:
        raise ValueError(f"the model gives {output}: rows of float32 or int64 values are served")
    return {"archive": archive, "input": inputs, "output": output}


def read_model(source: Source) -> dict[str, Any]:
    """Read and check ``model.pt`` (a path, its bytes or a binary file) without building the module.

    Returns the format-2 dict, ``state_dict`` included, and ``program``: the exported program's archive (bytes)
    or None; an older (format 1) file of a built-in workload comes back with the config, input and output it
    implies and ``"format": 1``. Raises FileNotFoundError when a path names no file, and ValueError when the file
    is not a readable ``model.pt``.
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
        "program": _program_archive(saved.get("program"), label),
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


def load_model(source: Source, *, allow_program: bool = False) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the trained module of ``model.pt`` (a path, its bytes or a binary file).

    Returns ``(module, description)``: the module in eval mode on the CPU with the trained weights, and the
    file's description (:func:`read_model` without ``state_dict``; ``input`` / ``output`` as above, with
    ``shape`` a list; ``program``: ``"torch.export"`` when the module is the file's exported program, else
    None). The module is built by the workload's own ``from_config`` -- only built-in workloads -- or, for any
    other workload, when ``allow_program`` is true and the file holds an exported program, deserialized from it
    (an :class:`ExportedModule`). Raises FileNotFoundError when a path names no file, and ValueError (one line,
    naming the file) when the file is not a ``model.pt``, its format is unknown, its workload is not a built-in
    one and it holds no program (or ``allow_program`` is false), its config or program cannot be built or its
    weights or its recorded input and output do not fit the model.
    """
    model = read_model(source)
    label = _label(source)
    workload, config, state = model["workload"], model["config"], model.pop("state_dict")
    archive = model.pop("program")
    model["program"] = None
    cls = BUILTIN_WORKLOADS.get(workload)
    if cls is None and archive is not None:
        if not allow_program:
            raise ValueError(f"{label} holds the exported program of {workload!r}, a team's code: it is loaded only "
                             "in a process of the job's own (allow_program=True), never next to other teams' jobs")
        inputs, outputs = _check_io(model["input"], model["output"], label)
        try:
            import torch.export as export

            with torch.random.fork_rng(devices=[]):
                module = ExportedModule(export.load(io.BytesIO(archive)).module())
        except Exception as error:
            raise ValueError(f"{label}: cannot load the exported program of {workload!r}: "
                             f"{type(error).__name__}: {_one_line(error)[:300]}") from error
        module = module.to("cpu").eval()
        _check_sample(module, inputs, outputs, label, workload)
        return module, {**model, "input": inputs, "output": outputs, "program": PROGRAM_FORMAT}
    if cls is None:
        raise ValueError(f"cannot rebuild workload {workload!r} from {label}: only built-in workloads can be "
                         f"rebuilt ({', '.join(rebuildable_workloads())}), and the file holds no exported program "
                         "(Workload.serving_input)")
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
    _check_sample(module, inputs, outputs, label, workload)
    return module, {**model, "input": inputs, "output": outputs}


class ExportedModule(nn.Module):
    """The module of an exported program (``ExportedProgram.module()``), as servers use modules: ``eval()`` and
    ``train()`` only set the flag (the program was traced in eval mode and is inference only; the graph module
    itself refuses both), and ``forward`` calls the graph."""

    def __init__(self, graph: nn.Module):
        super().__init__()
        self.graph = graph

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.graph(inputs)

    def train(self, mode: bool = True) -> ExportedModule:
        self.training = bool(mode)
        return self


def _check_sample(module: nn.Module, inputs: dict[str, Any], outputs: dict[str, Any], label: str,
                  workload: str) -> None:
    """One zero row of the recorded input goes through ``module`` and must give the recorded output."""
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


def _program_archive(program: Any, label: str) -> bytes | None:
    """The archive bytes of ``model.pt``'s optional ``program`` entry (None when there is none)."""
    if program is None:
        return None
    if (not isinstance(program, dict) or program.get("format") != PROGRAM_FORMAT
            or not isinstance(program.get("archive"), torch.Tensor) or program["archive"].dtype != torch.uint8
            or program["archive"].dim() != 1):
        raise ValueError(f"{label}: the program is not {{'format': '{PROGRAM_FORMAT}', 'archive': a uint8 tensor}}")
    return program["archive"].numpy().tobytes()


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


__all__ = ["LEGACY_FORMAT", "MODEL_FORMAT", "PROGRAM_FORMAT", "ExportedModule", "describe_model", "export_program",
           "load_model", "read_model", "rebuildable_workloads", "save_model"]
