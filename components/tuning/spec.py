"""The ``tune`` job kind's spec: a sweep of trials (child jobs) over a search space. Light: the control plane
imports it (standard library, the space and the schedulers' option tables only)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from components.runtime.contract.data import option_errors
from components.runtime.contract.spec import Checker, KindSpec, SpecError
from components.tuning.schedulers import SCHEDULER_OPTIONS, normalize_options, options_problems
from components.tuning.space import normalize_space, placeholders, space_problems, substitute

FIELDS = {"space", "metric", "mode", "trials", "max_concurrent", "trainable", "searcher", "scheduler",
          "max_iterations", "iterations_field", "packing", "max_gpus_per_trial", "seed", "trial_time_limit",
          "trial_max_attempts", "data", "runners"}
SEARCHERS = ("random", "grid", "tpe")
MAX_TRIALS = 10_000
DEFAULT_METRIC = "test_accuracy"


def _sample(space: dict[str, Any]) -> dict[str, Any]:
    """One valid assignment of every parameter (for checking the trainable's spec): lows and first values."""
    params: dict[str, Any] = {}
    for name, definition in space.items():
        params[name] = definition["values"][0] if definition["type"] == "choice" else definition["low"]
    return params


class TuneSpec(KindSpec):
    """Tune hyperparameters: trials of a trainable job kind, chosen by a searcher, stopped early by a trial
    scheduler, sharing the tune job's GPUs by Fluid's water-filling."""

    kind: ClassVar[str] = "tune"
    component: ClassVar[str] = "components.tuning.kind:TuneComponent"
    description: ClassVar[str] = (
        "Tune hyperparameters: trials of a train job over a search space (random, grid or TPE through Optuna; "
        "ASHA, Hyperband, successive halving, median stopping or PBT), water-filled onto the job's GPUs."
    )

    def objective(self, spec: dict[str, Any]) -> tuple[str, str] | None:
        """The sweep's metric and mode: what its trials report, and how retention ranks their checkpoints."""
        return str(spec.get("metric") or DEFAULT_METRIC), "min" if spec.get("mode") == "min" else "max"

    def validate(self, spec: dict[str, Any]) -> dict[str, Any]:
        check = Checker(spec)
        check.unknown(FIELDS)
        for name in ("metric", "mode", "trials", "max_concurrent", "max_iterations", "packing", "seed"):
            check.not_null(name)
        space = spec.get("space")
        problems = space_problems(space)
        for field, message in problems:
            check.errors[field] = message
        metric = check.string("metric", DEFAULT_METRIC, max_length=100) or DEFAULT_METRIC
        mode = check.string("mode", "max", choices=("min", "max")) or "max"
        trials = check.number("trials", 16, kind=int, minimum=1, maximum=MAX_TRIALS) or 16
        max_concurrent = check.number("max_concurrent", 8, kind=int, minimum=1, maximum=256) or 8
        max_iterations = check.number("max_iterations", 4, kind=int, minimum=1, maximum=10_000) or 4
        iterations_field = check.string("iterations_field", "epochs", max_length=64) or "epochs"
        packing = check.number("packing", 4, kind=int, minimum=1, maximum=64) or 4
        max_gpus = check.number("max_gpus_per_trial", 1, kind=int, minimum=1, maximum=64) or 1
        seed = check.number("seed", 0, kind=int, minimum=0, maximum=2**32 - 1) or 0
        trial_time_limit = check.number("trial_time_limit", 3600, kind=int, minimum=10, maximum=7 * 86400) or 3600
        trial_attempts = check.number("trial_max_attempts", 2, kind=int, minimum=1, maximum=10) or 2
        runners = check.number("runners", None, kind=int, minimum=0, maximum=64)

        searcher = spec.get("searcher", {"name": "random"})
        if isinstance(searcher, str):
            searcher = {"name": searcher}
        if not isinstance(searcher, dict) or searcher.get("name") not in SEARCHERS or set(searcher) - {"name"}:
            check.errors["spec.searcher"] = f'must be {{"name": one of {", ".join(SEARCHERS)}}}'
            searcher = {"name": "random"}

        scheduler = spec.get("scheduler", {"name": "asha"})
        if isinstance(scheduler, str):
            scheduler = {"name": scheduler}
        if not isinstance(scheduler, dict) or set(scheduler) - {"name", "options"}:
            check.errors["spec.scheduler"] = 'must be {"name": ..., "options": {...}}'
            scheduler = {"name": "asha"}
        options = scheduler.get("options", {})
        for field, message in options_problems(scheduler.get("name"), options, max_iterations=max_iterations):
            check.errors[field] = message

        # The trials' shared data options (a data provider's, e.g. a node-local cache of preprocessed samples):
        # every trial's spec gets them, so the sweep prepares its data once.
        data_problems = option_errors(spec.get("data"))
        check.errors.update(data_problems)
        data = spec.get("data") if isinstance(spec.get("data"), dict) and not data_problems else {}

        trainable = spec.get("trainable")
        normalized_trainable = None
        if not isinstance(trainable, dict) or set(trainable) - {"kind", "spec"} or not isinstance(
                trainable.get("spec"), dict):
            check.errors["spec.trainable"] = ('must be {"kind": "train", "spec": {...}}: the trial job, with '
                                              '"{{name}}" where a parameter goes')
        else:
            normalized_trainable = {"kind": trainable.get("kind", "train"), "spec": copy.deepcopy(trainable["spec"])}
            known = set(space) if isinstance(space, dict) else set()
            for name in sorted(placeholders(normalized_trainable["spec"]) - known):
                check.errors["spec.trainable.spec"] = f"{{{{{name}}}}} names no parameter of the space"
            if not problems and "spec.trainable.spec" not in check.errors:
                self._check_trainable(check, normalized_trainable, space, iterations_field, max_iterations, data)

        if not problems and searcher["name"] == "grid":
            from components.tuning.space import grid_problem

            if problem := grid_problem(normalize_space(space)):
                check.errors["spec.searcher"] = problem
        mutations = normalize_options("pbt", options).get("hyperparam_mutations") \
            if scheduler.get("name") == "pbt" and isinstance(options, dict) else None
        if isinstance(mutations, dict):
            for name in mutations:
                if isinstance(space, dict) and name not in space:
                    check.errors[f"spec.scheduler.options.hyperparam_mutations.{name}"] = \
                        "names no parameter of the space"
        check.raise_if_errors()
        return {
            "space": normalize_space(space), "metric": metric, "mode": mode, "trials": trials,
            "max_concurrent": max_concurrent, "trainable": normalized_trainable, "searcher": searcher,
            "scheduler": {"name": scheduler["name"], "options": dict(options or {})},
            "max_iterations": max_iterations, "iterations_field": iterations_field, "packing": packing,
            "max_gpus_per_trial": max_gpus, "seed": seed, "trial_time_limit": trial_time_limit,
            "trial_max_attempts": trial_attempts, "data": copy.deepcopy(data), "runners": runners,
        }

    @staticmethod
    def _check_trainable(check: Checker, trainable: dict[str, Any], space: dict, iterations_field: str,
                         max_iterations: int, data: dict[str, Any]) -> None:
        """The trial spec must name only parameters of the space, and be valid for its kind with a sample of
        them (the kind's own validation, so every bad field of it is named under ``spec.trainable.spec``)."""
        from components.runtime.contract.registry import get_kind

        try:
            kind = get_kind(trainable["kind"])
        except Exception:  # noqa: BLE001 - an unknown kind is reported like any bad field
            check.errors["spec.trainable.kind"] = f"no job kind {trainable['kind']!r}"
            return
        if kind.kind == TuneSpec.kind:
            check.errors["spec.trainable.kind"] = "a trial cannot itself be a sweep"
            return
        sample = substitute(trainable["spec"], _sample(normalize_space(space)))
        sample[iterations_field] = max_iterations
        if data:
            sample.setdefault("data", copy.deepcopy(data))
        try:
            kind.validate(sample)
        except SpecError as error:
            for field, message in error.errors.items():
                check.errors[field.replace("spec.", "spec.trainable.spec.", 1)] = message

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["space", "trainable"],
            "properties": {
                "space": {"type": "object", "description": "parameter name -> {type: uniform|loguniform|int|choice, "
                                                           "...}; see docs/components/tuning.md"},
                "metric": {"type": "string", "default": DEFAULT_METRIC},
                "mode": {"type": "string", "enum": ["min", "max"], "default": "max"},
                "trials": {"type": "integer", "minimum": 1, "maximum": MAX_TRIALS, "default": 16},
                "max_concurrent": {"type": "integer", "minimum": 1, "maximum": 256, "default": 8},
                "max_iterations": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 4},
                "iterations_field": {"type": "string", "default": "epochs"},
                "packing": {"type": "integer", "minimum": 1, "maximum": 64, "default": 4},
                "max_gpus_per_trial": {"type": "integer", "minimum": 1, "maximum": 64, "default": 1},
                "seed": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1, "default": 0},
                "trial_time_limit": {"type": "integer", "minimum": 10, "maximum": 7 * 86400, "default": 3600},
                "trial_max_attempts": {"type": "integer", "minimum": 1, "maximum": 10, "default": 2},
                "runners": {"type": ["integer", "null"], "minimum": 0, "maximum": 64, "default": None,
                            "description": "Warm trial runners per GPU (trials reuse their processes); 0: every "
                                           "trial is placed as a job of its own; null: 1 per virtual GPU, "
                                           "`packing` per real GPU"},
                "trainable": {"type": "object", "required": ["spec"], "additionalProperties": False,
                              "properties": {"kind": {"type": "string", "default": "train"},
                                             "spec": {"type": "object"}}},
                "searcher": {"type": "object", "additionalProperties": False,
                             "properties": {"name": {"type": "string", "enum": list(SEARCHERS)}}},
                "data": {"type": "object", "default": {},
                         "description": "Data options given to every trial's spec (an installed data provider's: "
                                        "the trials share one preparation of their data)"},
                "scheduler": {"type": "object", "additionalProperties": False,
                              "properties": {"name": {"type": "string", "enum": list(SCHEDULER_OPTIONS)},
                                             "options": {"type": "object"}}},
            },
        }
