"""The ``train`` job kind's spec. Light: imported by the control plane, so no torch, numpy or sklearn here."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from components.runtime.contract.data import option_errors
from components.runtime.contract.distributed import (
    distributed_errors,
    elastic_default,
    normalize,
    workers_problems,
)
from components.runtime.contract.project import (
    command_errors,
    environment_errors,
    normalize_command,
    normalize_environment,
)
from components.runtime.contract.spec import ENTRYPOINT_PATTERN, Checker, KindSpec

# The last two are the embeddings plugin's DLRMs on CTR data (components.train.workloads.PLUGIN_WORKLOADS).
WORKLOADS: tuple[str, ...] = ("mlp-digits", "cnn-synthetic", "tiny-gpt", "moe-gpt", "cnn-dataset", "cnn-fc",
                              "dlrm-ctr", "dlrm-movielens")
# Workloads whose data is a stream of epochs from spec.data.dataset (components.runtime.contract.data.open_epochs).
STREAMING = ("cnn-dataset",)
TRANSFORMERS = ("tiny-gpt", "moe-gpt")  # width a multiple of the head count
OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")

_ENTRYPOINT = re.compile(ENTRYPOINT_PATTERN)

DEFAULT_EPOCHS = 3
# One tiny-gpt epoch (one pass over the corpus windows) is short; five make a model worth sampling from.
WORKLOAD_EPOCHS = {"tiny-gpt": 5, "moe-gpt": 5, "dlrm-ctr": 2, "dlrm-movielens": 4}
DEFAULT_LR = {"adam": 0.003, "sgd": 0.05}
# "hidden" is the width of each model: MLP hidden units, CNN first-layer channels, transformer model width.
DEFAULT_HIDDEN = {"mlp-digits": 128, "cnn-synthetic": 16, "tiny-gpt": 64, "moe-gpt": 64, "cnn-dataset": 16, "cnn-fc": 16,
                  "dlrm-ctr": 64, "dlrm-movielens": 64}
DEFAULT_BATCH_SIZE = 64
# CTR rows are tiny: large batches (as DLRM trains) keep an epoch of 200,000 rows short.
WORKLOAD_BATCH_SIZE = {"dlrm-ctr": 1024, "dlrm-movielens": 1024}
TINY_GPT_HEADS = 4

MAX_EPOCHS = 100_000
MAX_STEPS = 10**9
MAX_BATCH_SIZE = 65_536
MAX_HIDDEN = 4096
MAX_SEED = 2**32 - 1
MAX_OPTIONS_BYTES = 65_536

FIELDS = {
    "workload",
    "entrypoint",
    "command",
    "environment",
    "epochs",
    "max_steps",
    "batch_size",
    "lr",
    "seed",
    "checkpoint_every",
    "log_every",
    "optimizer",
    "hidden",
    "options",
    "data",
    "distributed",
}


class TrainSpec(KindSpec):
    """Train a model: one of the built-in workloads, or user code named by ``entrypoint``."""

    kind: ClassVar[str] = "train"
    component: ClassVar[str] = "components.train.component:TrainComponent"
    products: ClassVar[tuple[str, ...]] = ("model.pt",)  # components.train.model_format
    description: ClassVar[str] = (
        "Train a model with PyTorch: a built-in workload (mlp-digits, cnn-synthetic, tiny-gpt, moe-gpt, "
        "cnn-dataset over a registered dataset, dlrm-ctr and dlrm-movielens for click-through rates) "
        "or your own code: 'package.module:function', or any program as a command (a list of strings, from "
        "the job's code bundle). Checkpoints and resumes after preemption."
    )

    def validate(self, spec: dict[str, Any]) -> dict[str, Any]:
        check = Checker(spec)
        check.unknown(FIELDS)

        workload = check.string("workload", None, choices=WORKLOADS)
        entrypoint = check.string("entrypoint", None, max_length=256)
        if entrypoint is not None and "spec.entrypoint" not in check.errors:
            if not _ENTRYPOINT.match(entrypoint):
                check.errors["spec.entrypoint"] = "must look like 'package.module:function'"
        command = spec.get("command")
        check.errors.update(command_errors(command))
        check.errors.update(environment_errors(spec.get("environment")))
        given = [name for name, value in (("workload", workload), ("entrypoint", entrypoint), ("command", command))
                 if value is not None]
        if len(given) > 1:
            for name in given:
                both = "give one of workload, entrypoint or command, not " + " and ".join(given)
                key = f"spec.{name}"
                check.errors[key] = f"{check.errors[key]}; {both}" if key in check.errors else both
        elif not given and not {"spec.workload", "spec.entrypoint", "spec.command"} & set(check.errors):
            check.errors["spec.workload"] = (f"give a workload ({', '.join(WORKLOADS)}), an entrypoint or a "
                                             "command")
        if command is not None and spec.get("distributed") is not None:
            check.errors["spec.distributed"] = ("a command job runs its own distributed code: Strata sets the "
                                                "variables torchrun sets (leave distributed out)")
        builtin = workload if workload in WORKLOADS and entrypoint is None and command is None else None

        epochs = check.number(
            "epochs", WORKLOAD_EPOCHS.get(builtin, DEFAULT_EPOCHS), kind=int, minimum=1, maximum=MAX_EPOCHS
        )
        if epochs is None:
            epochs = WORKLOAD_EPOCHS.get(builtin, DEFAULT_EPOCHS)
        max_steps = check.number("max_steps", None, kind=int, minimum=1, maximum=MAX_STEPS)
        _not_null(check, "batch_size", "seed", "checkpoint_every", "log_every", "optimizer", "options")
        default_batch = WORKLOAD_BATCH_SIZE.get(builtin, DEFAULT_BATCH_SIZE)
        batch_size = _required(
            check.number("batch_size", default_batch, kind=int, minimum=1, maximum=MAX_BATCH_SIZE), default_batch
        )
        optimizer = _required(check.string("optimizer", "adam", choices=OPTIMIZERS), "adam")
        lr = check.number("lr", None, kind=float)
        if lr is None:
            lr = DEFAULT_LR.get(optimizer, DEFAULT_LR["adam"])
        elif "spec.lr" not in check.errors and not 0 < lr <= 10:
            check.errors["spec.lr"] = "must be > 0 and <= 10"
        seed = _required(check.number("seed", 0, kind=int, minimum=0, maximum=MAX_SEED), 0)
        checkpoint_every = _required(
            check.number("checkpoint_every", 50, kind=int, minimum=1, maximum=MAX_STEPS), 50
        )
        log_every = _required(check.number("log_every", 10, kind=int, minimum=1, maximum=MAX_STEPS), 10)

        hidden = check.number("hidden", DEFAULT_HIDDEN.get(builtin), kind=int, minimum=1, maximum=MAX_HIDDEN)
        if hidden is None and builtin is not None:
            hidden = DEFAULT_HIDDEN[builtin]
        if builtin in TRANSFORMERS and hidden is not None and "spec.hidden" not in check.errors:
            if hidden % TINY_GPT_HEADS:
                check.errors["spec.hidden"] = f"must be a multiple of {TINY_GPT_HEADS} for {builtin}"

        options = spec.get("options", {})
        if options is None:  # reported by _not_null
            options = {}
        elif not isinstance(options, dict):
            check.errors["spec.options"] = "must be an object"
            options = {}
        elif options and (workload is not None or command is not None):
            check.errors["spec.options"] = "is only used with an entrypoint (a command takes arguments)"
        else:
            try:
                encoded = json.dumps(options, allow_nan=False)
            except (TypeError, ValueError):
                check.errors["spec.options"] = "must hold JSON values only"
            else:
                if len(encoded) > MAX_OPTIONS_BYTES:
                    check.errors["spec.options"] = f"must be at most {MAX_OPTIONS_BYTES} bytes as JSON"

        data = spec.get("data") or {}
        check.errors.update(option_errors(spec.get("data")))
        if isinstance(data, dict) and "spec.data" not in check.errors:
            if builtin in STREAMING and "dataset" not in data and "spec.data.dataset" not in check.errors:
                check.errors["spec.data.dataset"] = (f"required: {builtin} trains on a dataset; name one "
                                                     "(GET /api/v1/datasets/ lists them), e.g. shapes-jpeg")
            elif "dataset" in data and builtin is not None and builtin not in STREAMING \
                    and "spec.data.dataset" not in check.errors:
                check.errors["spec.data.dataset"] = (f"only {', '.join(STREAMING)} (or an entrypoint's workload) "
                                                     f"reads a dataset; {builtin} prepares its own data")
        distributed = spec.get("distributed")
        check.errors.update(distributed_errors(distributed))
        if distributed is not None and builtin in STREAMING and "spec.distributed" not in check.errors:
            check.errors["spec.distributed"] = (f"{builtin} streams its epochs from one node's cache; train it on "
                                                "one worker (a gang reads batches by index: mlp-digits, "
                                                "cnn-synthetic, cnn-fc, tiny-gpt, moe-gpt)")
        check.raise_if_errors()
        normalized = {
            "workload": workload,
            "entrypoint": entrypoint,
            "epochs": epochs,
            "max_steps": max_steps,
            "batch_size": batch_size,
            "lr": lr,
            "seed": seed,
            "checkpoint_every": checkpoint_every,
            "log_every": log_every,
            "optimizer": optimizer,
            "hidden": hidden,
            "options": options,
            "data": data if isinstance(data, dict) else {},
        }
        if command is not None:
            normalized["command"] = normalize_command(command)
        environment = normalize_environment(spec.get("environment"))
        if environment is not None:
            normalized["environment"] = environment
        if distributed is not None:  # only a gang's spec carries it
            normalized["distributed"] = normalize(distributed)
        return normalized

    def resource_problems(self, spec: dict[str, Any], resources: dict[str, Any]) -> dict[str, str]:
        return workers_problems(spec.get("distributed"), int(resources.get("workers", 1)))

    def elastic_for(self, spec: dict[str, Any]) -> dict[str, float] | None:
        """A gang of an elastic strategy (SMS, say) may give up workers down to the strategy's minimum."""
        return elastic_default(spec.get("distributed"))

    def entrypoint_spec(self, entrypoint: str) -> dict[str, Any]:
        return self.validate({"entrypoint": entrypoint})

    def json_schema(self) -> dict[str, Any]:
        step_count = {"type": "integer", "minimum": 1, "maximum": MAX_STEPS}
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "train",
            "description": self.description,
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "workload": {
                    "type": ["string", "null"],
                    "enum": [*WORKLOADS, None],
                    "description": "A built-in workload. Give this or entrypoint.",
                },
                "entrypoint": {
                    "type": ["string", "null"],
                    "pattern": ENTRYPOINT_PATTERN,
                    "maxLength": 256,
                    "description": (
                        "Your code, importable on the node, as 'package.module:function'. The function gets "
                        "the job context and either trains by itself (returns None) or returns a Workload "
                        "that Strata drives step by step. Give this or workload."
                    ),
                },
                "command": {
                    "type": ["array", "null"],
                    "items": {"type": "string"},
                    "minItems": 1,
                    "description": (
                        "Any program, run in the job's code bundle: e.g. [\"python\", \"train.py\", \"--lr\", "
                        "\"{{lr}}\"]. stdout and stderr are the job's log; lines 'strata: name=value' (or the "
                        "strata_report module) report metrics; STRATA_CHECKPOINT_DIR is checkpointed and restored, "
                        "STRATA_OUTPUT_DIR's files become artifacts; gangs get torchrun's variables. Give this, "
                        "workload or entrypoint (docs/projects.md)."
                    ),
                },
                "environment": {
                    "type": ["object", "null"],
                    "description": (
                        "The job's Python environment, built once per node and cached: {requirements: a file of "
                        "the code bundle, pip: [specs], python_path: [dirs of the bundle], env: {NAME: value}, "
                        "secrets: [names of the team's secrets, given as environment variables]}."
                    ),
                },
                "epochs": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": MAX_EPOCHS,
                    "description": f"Passes over the training data. Default {DEFAULT_EPOCHS} (tiny-gpt: {WORKLOAD_EPOCHS['tiny-gpt']}).",
                },
                "max_steps": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": MAX_STEPS,
                    "default": None,
                    "description": "Stop after this many optimizer steps, even within an epoch.",
                },
                "batch_size": {"type": "integer", "minimum": 1, "maximum": MAX_BATCH_SIZE,
                               "description": f"Examples per step. Default {DEFAULT_BATCH_SIZE} "
                                              f"(dlrm-ctr, dlrm-movielens: {WORKLOAD_BATCH_SIZE['dlrm-ctr']})."},
                "lr": {
                    "type": ["number", "null"],
                    "exclusiveMinimum": 0,
                    "maximum": 10,
                    "description": "Learning rate. Default {} with adam, {} with sgd.".format(
                        DEFAULT_LR["adam"], DEFAULT_LR["sgd"]
                    ),
                },
                "seed": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_SEED,
                    "default": 0,
                    "description": "Seeds model initialisation, data generation and data order.",
                },
                "checkpoint_every": {
                    **step_count,
                    "default": 50,
                    "description": "Checkpoint every this many steps (and when stopped).",
                },
                "log_every": {
                    **step_count,
                    "default": 10,
                    "description": "Report metrics every this many steps.",
                },
                "optimizer": {
                    "type": "string",
                    "enum": list(OPTIMIZERS),
                    "default": "adam",
                    "description": "adam, or sgd with momentum 0.9.",
                },
                "hidden": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": MAX_HIDDEN,
                    "description": "Model width: {}. A multiple of {} for tiny-gpt and moe-gpt.".format(
                        ", ".join(f"{name} {width}" for name, width in DEFAULT_HIDDEN.items()), TINY_GPT_HEADS
                    ),
                },
                "options": {
                    "type": "object",
                    "default": {},
                    "description": "Free-form settings for entrypoint code (ctx.spec['options']).",
                },
                "distributed": {
                    "type": ["object", "null"],
                    "default": None,
                    "description": (
                        "Train one model on all of resources.workers: {strategy: ddp | <a plugin's strategy>, "
                        "backend: auto | gloo | nccl, timeout_s, slow: {ranks: [1] | random: p, factor, duration, "
                        "mode: sleep | cpu} (fault injection), bandwidth_mbit (an emulated link)}, plus the "
                        "strategy's own options (docs/plugins.md, strategies)."
                    ),
                },
                "data": {
                    "type": "object",
                    "default": {},
                    "description": (
                        "Data options: where the workload's prepared (preprocessed) data comes from. Each option "
                        "belongs to an installed plugin's data provider (see docs/plugins.md, data_providers)."
                    ),
                },
            },
            "oneOf": [
                {
                    "required": ["workload"],
                    "properties": {
                        "workload": {"type": "string"},
                        "entrypoint": {"type": "null"},
                        "command": {"type": "null"},
                        "options": {"maxProperties": 0},
                    },
                },
                {
                    "required": ["entrypoint"],
                    "properties": {"entrypoint": {"type": "string"}, "workload": {"type": "null"},
                                   "command": {"type": "null"}},
                },
                {
                    "required": ["command"],
                    "properties": {"command": {"type": "array"}, "workload": {"type": "null"},
                                   "entrypoint": {"type": "null"}, "options": {"maxProperties": 0}},
                },
            ],
            "allOf": [
                {
                    "if": {
                        "required": ["workload", "hidden"],
                        "properties": {"workload": {"enum": list(TRANSFORMERS)}},
                    },
                    "then": {"properties": {"hidden": {"multipleOf": TINY_GPT_HEADS}}},
                }
            ],
        }


def _not_null(check: Checker, *names: str) -> None:
    for name in names:
        if name in check.spec and check.spec[name] is None:
            check.errors[f"spec.{name}"] = "must not be null"


def _required(value: Any, default: Any) -> Any:
    """The value of a field that cannot be null (a null was reported by ``_not_null``)."""
    return default if value is None else value
