"""The ``compress-embeddings`` job kind (light: the control plane imports it; no torch, no scikit-learn).

Compress the embedding tables of a trained recommendation model with Saec (see ``compress.py``)::

    kind: compress-embeddings
    spec:
      source: {job: <id of a SUCCEEDED train job>, artifact: model.pt}
      ratio: 20            # the embedding bytes shrink this many times (centroids and index counted)
      head: 0.1            # the fraction of each field's seen features, by frequency, that KMeans clusters
      method: kmeans       # kmeans | minibatch: how the head is clustered
      finetune: {steps: 0, lr: 0.001}   # optionally train the centroids briefly afterwards
      seed: 0

The source is the ``model.pt`` of a ``dlrm-ctr`` or ``dlrm-movielens`` train job (the job writes a compressed
``model.pt`` that the ``serve`` kind serves like any other, and evaluates AUC and log loss before and after), or
``artifact: embeddings.pt``, a user checkpoint that a train job of your own code stored: ``{"tables": {field:
(features, dim) float tensor}, "frequencies": {field: (features,) counts}}`` (the job writes the compressed
tables and index as ``embeddings.pt``, and measures how far each feature's vector moved, since there is no model
to evaluate).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from components.runtime.contract.spec import Checker, KindSpec, SourceRef

KIND = "compress-embeddings"
PLUGIN = "embeddings"
FIELDS = {"source", "ratio", "head", "method", "finetune", "seed"}
METHODS = ("kmeans", "minibatch")  # components.embeddings.compress.METHODS
ARTIFACTS = ("model.pt", "embeddings.pt")
# The train workloads whose model.pt holds embedding tables with their feature counts
# (components.embeddings.workload.WORKLOADS).
DLRM_WORKLOADS = ("dlrm-ctr", "dlrm-movielens")
MAX_RATIO = 10_000
MAX_FINETUNE_STEPS = 100_000
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


class CompressEmbeddingsSpec(KindSpec):
    """Saec: cluster each field's features (KMeans on the frequent head, nearest centroid for the tail)."""

    kind: ClassVar[str] = KIND
    component: ClassVar[str] = "components.embeddings.component:CompressComponent"
    description: ClassVar[str] = (
        "Compress a recommendation model's embedding tables (Saec): per field, KMeans on the frequent features, "
        "the long tail assigned to the nearest centroid; a centroid table plus an index, evaluated before and after.")
    products: ClassVar[tuple[str, ...]] = ("model.pt",)  # the compressed model, when the source was a model.pt

    def validate(self, spec: dict[str, Any]) -> dict[str, Any]:
        check = Checker(spec)
        check.unknown(FIELDS)
        check.not_null("ratio", "head", "method", "finetune", "seed")
        job, artifact = None, "model.pt"
        source = spec.get("source")
        if not isinstance(source, dict):
            check.errors["spec.source"] = "required: an object {job: <id of a SUCCEEDED train job>, artifact}"
        else:
            inner = Checker(source, prefix="spec.source")
            inner.unknown({"job", "artifact"})
            inner.not_null("artifact")
            job = inner.string("job", None, max_length=64)
            if job is None and "spec.source.job" not in inner.errors:
                inner.errors["spec.source.job"] = "required: the id of a SUCCEEDED train job"
            elif job is not None and "spec.source.job" not in inner.errors and not _UUID.match(job):
                inner.errors["spec.source.job"] = "must be a job id (a UUID)"
            artifact = inner.string("artifact", "model.pt", choices=ARTIFACTS) or "model.pt"
            check.errors.update(inner.errors)
        ratio = check.number("ratio", 20.0, minimum=1, maximum=MAX_RATIO)
        head = check.number("head", 0.1, maximum=1.0)
        if isinstance(head, int | float) and not isinstance(head, bool) and head <= 0 \
                and "spec.head" not in check.errors:
            check.errors["spec.head"] = "must be > 0 (a fraction of each field's features)"
        method = check.string("method", "kmeans", choices=METHODS)
        seed = check.number("seed", 0, kind=int, minimum=0, maximum=2**31 - 1)
        finetune = {"steps": 0, "lr": 0.001}
        raw = spec.get("finetune", {})
        if raw is not None and not isinstance(raw, dict):
            check.errors["spec.finetune"] = "must be an object {steps, lr}"
        elif isinstance(raw, dict):
            inner = Checker(raw, prefix="spec.finetune")
            inner.unknown({"steps", "lr"})
            inner.not_null("steps", "lr")
            steps = inner.number("steps", 0, kind=int, minimum=0, maximum=MAX_FINETUNE_STEPS)
            lr = inner.number("lr", 0.001, maximum=10.0)
            if isinstance(lr, int | float) and not isinstance(lr, bool) and lr <= 0 \
                    and "spec.finetune.lr" not in inner.errors:
                inner.errors["spec.finetune.lr"] = "must be > 0"
            if artifact == "embeddings.pt" and isinstance(steps, int) and steps > 0 \
                    and "spec.finetune.steps" not in inner.errors:
                inner.errors["spec.finetune.steps"] = ("fine-tuning needs a model and its data: only with "
                                                       "artifact model.pt")
            check.errors.update(inner.errors)
            finetune = {"steps": steps, "lr": lr}
        check.raise_if_errors()
        return {"source": {"job": str(job).lower(), "artifact": artifact}, "ratio": float(ratio),
                "head": float(head), "method": method, "seed": int(seed),
                "finetune": {"steps": int(finetune["steps"]), "lr": float(finetune["lr"])}}

    def sources(self, spec: dict[str, Any]) -> list[SourceRef]:
        return [SourceRef(field="spec.source.job", job=spec["source"]["job"], kind="train",
                          artifact=spec["source"]["artifact"])]

    def source_problem(self, ref: SourceRef, source_spec: dict[str, Any], spec: dict[str, Any] | None = None
                       ) -> str | None:
        if ref.artifact == "model.pt" and source_spec.get("workload") not in DLRM_WORKLOADS:
            trained = source_spec.get("workload") or source_spec.get("entrypoint") or "another model"
            return (f"job {ref.job} trained {trained}: only the model.pt of {', '.join(DLRM_WORKLOADS)} holds "
                    "embedding tables with their feature counts (for your own model, store an embeddings.pt "
                    "checkpoint and give artifact: embeddings.pt)")
        return None

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["source"],
            "properties": {
                "source": {
                    "type": "object", "additionalProperties": False, "required": ["job"],
                    "description": "The trained model to compress.",
                    "properties": {
                        "job": {"type": "string", "format": "uuid",
                                "description": "A SUCCEEDED train job of your team (dlrm-ctr, dlrm-movielens, or "
                                               "your own code that stored embeddings.pt)."},
                        "artifact": {"type": "string", "enum": list(ARTIFACTS), "default": "model.pt",
                                     "description": "model.pt of a DLRM workload, or embeddings.pt: {tables: "
                                                    "{field: (features, dim)}, frequencies: {field: (features,)}}."},
                    },
                },
                "ratio": {"type": "number", "minimum": 1, "maximum": MAX_RATIO, "default": 20.0,
                          "description": "How many times smaller the embedding bytes become (centroids and the "
                                         "feature-to-cluster index counted)."},
                "head": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.1,
                         "description": "The fraction of each field's seen features, most frequent first, that "
                                        "KMeans clusters; the rest go to the nearest centroid."},
                "method": {"type": "string", "enum": list(METHODS), "default": "kmeans",
                           "description": "KMeans (Lloyd) or MiniBatchKMeans for the head (scikit-learn)."},
                "finetune": {
                    "type": "object", "additionalProperties": False,
                    "description": "Train the centroids briefly on the training data after clustering.",
                    "properties": {
                        "steps": {"type": "integer", "minimum": 0, "maximum": MAX_FINETUNE_STEPS, "default": 0},
                        "lr": {"type": "number", "exclusiveMinimum": 0, "maximum": 10, "default": 0.001},
                    },
                },
                "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "default": 0},
            },
        }


__all__ = ["ARTIFACTS", "CompressEmbeddingsSpec", "DLRM_WORKLOADS", "KIND", "METHODS", "PLUGIN"]
