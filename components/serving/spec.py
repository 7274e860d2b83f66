"""The light spec of the ``serve`` kind (control plane side: no torch, no grpc)."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from components.runtime.spec import Checker, KindSpec, SourceRef, SpecError

FIELDS = {"model", "port", "request_timeout_s", "max_rows"}
SERVABLE_WORKLOADS = ("mlp-digits", "cnn-synthetic", "tiny-gpt")  # components.serving.model.servable_workloads()
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


class ServeSpec(KindSpec):
    """Serve the ``model.pt`` of a finished ``train`` job over gRPC until the job is cancelled.

    On a shared device (``resources: {gpus: 0.25}``) the model runs inside the device's GPU-sharing service:
    its requests go before training work, and a co-located staged training job yields to them (SwitchFlow).
    """

    kind: ClassVar[str] = "serve"
    component: ClassVar[str] = "components.serving.component:ServeComponent"
    panels: ClassVar[tuple[str, ...]] = ("components.serving.panels:ServeEndpointPanel",)
    description: ClassVar[str] = (
        "Serve the model of a finished train job over gRPC (Predict), until cancelled. On a GPU share, its "
        "requests preempt co-located training at the next stage boundary."
    )

    def validate(self, spec: dict[str, Any]) -> dict[str, Any]:
        check = Checker(spec)
        check.unknown(FIELDS)
        model = spec.get("model")
        job = None
        if not isinstance(model, dict):
            check.errors["spec.model"] = "required: an object {job: <id of a finished train job>}"
        else:
            inner = Checker(model, prefix="spec.model")
            inner.unknown({"job"})
            job = inner.string("job", None, max_length=64)
            if job is None and "spec.model.job" not in inner.errors:
                inner.errors["spec.model.job"] = "required: the id of a finished train job"
            elif job is not None and "spec.model.job" not in inner.errors and not _UUID.match(job):
                inner.errors["spec.model.job"] = "must be a job id (a UUID)"
            check.errors.update(inner.errors)
        check.not_null("port", "request_timeout_s", "max_rows")  # none of them is nullable (json_schema)
        port = check.number("port", 0, kind=int, minimum=0, maximum=65535)
        timeout = check.number("request_timeout_s", 10.0, minimum=0.01, maximum=600)
        max_rows = check.number("max_rows", 1024, kind=int, minimum=1, maximum=65536)
        check.raise_if_errors()
        return {"model": {"job": str(job).lower()}, "port": port, "request_timeout_s": float(timeout),
                "max_rows": max_rows}

    def sources(self, spec: dict[str, Any]) -> list[SourceRef]:
        return [SourceRef(field="spec.model.job", job=spec["model"]["job"], kind="train", artifact="model.pt")]

    def source_problem(self, ref: SourceRef, source_spec: dict[str, Any]) -> str | None:
        if source_spec.get("entrypoint"):
            # Its model class is user code that the serving side cannot rebuild (components.serving.model).
            return (f"job {ref.job} trained user code ({source_spec['entrypoint']}); only built-in workloads "
                    f"can be served: {', '.join(SERVABLE_WORKLOADS)}")
        return None

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["model"],
            "properties": {
                "model": {
                    "type": "object", "additionalProperties": False, "required": ["job"],
                    "description": "Which trained model to serve.",
                    "properties": {"job": {"type": "string", "format": "uuid",
                                           "description": "A SUCCEEDED train job of your team; its model.pt is served."}},
                },
                "port": {"type": "integer", "minimum": 0, "maximum": 65535, "default": 0,
                         "description": "TCP port of the gRPC endpoint on the node; 0 picks a free one."},
                "request_timeout_s": {"type": "number", "minimum": 0.01, "maximum": 600, "default": 10.0,
                                      "description": "Longest a request may wait and run when it sets no deadline."},
                "max_rows": {"type": "integer", "minimum": 1, "maximum": 65536, "default": 1024,
                             "description": "Largest batch (first dimension) one request may carry."},
            },
        }


__all__ = ["ServeSpec", "SpecError"]
