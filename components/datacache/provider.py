"""The datacache plugin's data provider: the ``data`` options a job opts in with, checked at submit.

``data: {dataset: NAME, cache: true, perfect: {...}, workers: 2}``:

- ``dataset``: the dataset a streaming workload (train's ``cnn-dataset``) reads, by name (a built-in or one the
  team registered: ``GET /api/v1/datasets/``); resolved at submit to the pipeline definition it names then. One
  registered on an uploaded data set names it to the core (:meth:`DataCacheProvider.data_sets`), which has the
  node fetch it before the attempt starts;
- ``cache`` (default false): keep preprocessed data in the node's cache, shared by every job on the node. Also
  caches what the other built-in workloads prepare (their whole prepared tensors);
- ``perfect``: PerFect's two phases (see :mod:`components.datacache.source`): ``{reuse: "auto" | n,
  switch: "auto" | fraction of the epochs, target: a value of metric | null, metric: "test_accuracy"}``;
  ``{}`` or ``true`` is all automatic;
- ``workers`` (default 2): loader processes that preprocess.

Light: imported by the control plane. The heavy parts are imported inside the methods that run on a node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from components.datacache.datasets import BUILTINS, resolve_dataset, uploaded_mount
from components.runtime.contract.data import DataProvider, EpochSource
from components.runtime.contract.spec import SpecError

PERFECT_FIELDS = {"reuse", "switch", "target", "metric", "fine_tune_lr"}
DEFAULT_FINE_TUNE_LR = "auto"
MAX_WORKERS = 32


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def normalize_perfect(value: Any) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """``(normalized perfect options or None when off, {field: message})``."""
    if value is None or value is False:
        return None, {}
    if value is True:
        value = {}
    if not isinstance(value, dict):
        return None, {"perfect": "must be an object ({reuse, switch, target, metric, fine_tune_lr}), true or null"}
    errors = {}
    for name in value:
        if name not in PERFECT_FIELDS:
            errors[f"perfect.{name}"] = f"unknown field; allowed: {', '.join(sorted(PERFECT_FIELDS))}"
    reuse = value.get("reuse", "auto")
    if reuse != "auto" and not (isinstance(reuse, int) and not isinstance(reuse, bool) and 1 <= reuse <= 64):
        errors["perfect.reuse"] = "must be \"auto\" or a whole number of times from 1 to 64"
    switch = value.get("switch", "auto")
    if switch not in ("auto", "gain") and not (_number(switch) and 0 <= switch <= 1):
        errors["perfect.switch"] = ("must be \"auto\", \"gain\" (moved by the measured reuse gain) or the fraction "
                                    "of the epochs trained on reused data (0 to 1)")
    target = value.get("target")
    if target is not None and not _number(target):
        errors["perfect.target"] = "must be a number (the metric's value that ends training) or null"
    metric = value.get("metric", "test_accuracy")
    if not isinstance(metric, str) or not metric or len(metric) > 100:
        errors["perfect.metric"] = "must be a metric name, e.g. test_accuracy"
    fine_tune_lr = value.get("fine_tune_lr", DEFAULT_FINE_TUNE_LR)
    if fine_tune_lr != "auto" and not (_number(fine_tune_lr) and 0 < fine_tune_lr <= 1):
        errors["perfect.fine_tune_lr"] = ("must be \"auto\" (phase 2's share of the epochs) or the learning rate's "
                                          "factor at the start of the fine-tune phase, above 0 and at most 1 (it then "
                                          "decays along a cosine to the last epoch)")
    if errors:
        return None, errors
    return {"reuse": reuse, "switch": switch, "target": target, "metric": metric,
            "fine_tune_lr": fine_tune_lr if fine_tune_lr == "auto" else float(fine_tune_lr)}, {}


class DataCacheProvider(DataProvider):
    """``dataset``, ``cache``, ``perfect`` and ``workers`` (see the module docstring)."""

    options: ClassVar[frozenset[str]] = frozenset({"dataset", "cache", "perfect", "workers"})

    def validate(self, data: dict[str, Any]) -> dict[str, str]:
        errors: dict[str, str] = {}
        if "cache" in data and not isinstance(data["cache"], bool):
            errors["cache"] = "must be true or false"
        workers = data.get("workers", 2)
        if not (isinstance(workers, int) and not isinstance(workers, bool) and 0 <= workers <= MAX_WORKERS):
            errors["workers"] = f"must be a whole number of loader processes from 0 to {MAX_WORKERS}"
        dataset = data.get("dataset")
        if "dataset" in data:
            if isinstance(dataset, str):
                if not dataset or len(dataset) > 64:
                    errors["dataset"] = "must name a dataset (GET /api/v1/datasets/ lists them)"
                elif dataset in BUILTINS and BUILTINS[dataset].get("task") != "classification":
                    errors["dataset"] = f"{dataset!r} is a {BUILTINS[dataset]['task']} dataset: it has no " \
                                        "image pipeline to stream"
            elif not (isinstance(dataset, dict) and set(dataset) == {"name", "definition"}):
                errors["dataset"] = "must name a dataset (GET /api/v1/datasets/ lists them)"
        _, problems = normalize_perfect(data.get("perfect"))
        errors.update(problems)
        if data.get("perfect") not in (None, False) and "dataset" not in data and "perfect" not in errors:
            errors["perfect"] = "needs data.dataset: PerFect reuses a dataset pipeline's augmented epochs"
        return errors

    def resolve(self, data: dict[str, Any], lookup: Callable[[str, str], dict[str, Any] | None]) -> dict[str, Any]:
        if "dataset" not in data:
            return data
        try:
            return {**data, "dataset": resolve_dataset(data["dataset"], lookup)}
        except ValueError as error:
            raise SpecError({"dataset": str(error)}) from None

    def data_sets(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The team's uploaded data set a resolved ``dataset`` reads (``source: {upload}``), for the node to fetch."""
        dataset = data.get("dataset")
        definition = dataset.get("definition") if isinstance(dataset, dict) else None
        mount = uploaded_mount(definition.get("source")) if isinstance(definition, dict) else None
        return [mount] if mount is not None else []

    def epochs(self, data: dict[str, Any], job: dict[str, Any]) -> EpochSource | None:
        if "dataset" not in data:
            return None
        from components.datacache.datasets import definition
        from components.datacache.source import DatasetEpochs

        dataset = data["dataset"]
        if isinstance(dataset, str):  # a built-in named in a spec that was never submitted (a local run)
            if dataset not in BUILTINS:
                raise LookupError(f"dataset {dataset!r} is not resolved: submit the job to the control plane")
            dataset = {"name": dataset, "definition": definition({"name": dataset, **BUILTINS[dataset]})}
        perfect, errors = normalize_perfect(data.get("perfect"))
        if errors:
            raise ValueError("; ".join(f"data.{k}: {v}" for k, v in errors.items()))
        return DatasetEpochs(dataset["definition"], epochs=int(job.get("epochs") or 1),
                             cache=bool(data.get("cache", False)), perfect=perfect,
                             workers=int(data.get("workers", 2)), log_line=job.get("log"))

    def fetch(self, key: str, recipe: dict[str, Any], build: Callable[[], Any], data: dict[str, Any]) -> Any:
        """What the other workloads prepare (whole tensors), from the node's cache when ``cache`` is true."""
        if not data.get("cache"):
            return None
        from components.datacache.tensors import cached_prepare

        return cached_prepare(key, recipe, build)
