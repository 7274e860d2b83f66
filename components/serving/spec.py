"""The light spec of the ``serve`` kind (control plane side: no torch, no grpc)."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from components.runtime.contract.spec import ENTRYPOINT_PATTERN, Checker, KindSpec, SourceRef, SpecError

FIELDS = {"model", "port", "request_timeout_s", "slo_ms", "max_rows", "batching", "auth", "replicas", "autoscale",
          "emoe"}
EMOE_MISS = ("load", "reroute")  # components.serving.emoe.MISS_POLICIES
AUTOSCALE_FIELDS = {"min", "max", "target_attainment", "queue_per_replica", "period_s"}
AUTOSCALE_DEFAULTS = {"target_attainment": 0.95, "queue_per_replica": 16.0, "period_s": 10.0}
MAX_REPLICAS = 64
AUTH_MODES = ("token", "none")
BATCHING_FIELDS = {"policy", "max_batch", "max_queue_delay_ms", "max_queue", "preempt"}
POLICIES = ("orloj", "fifo", "edf")  # components.serving.endpoint.Batching.POLICIES
BATCHING_DEFAULTS = {"policy": "orloj", "max_batch": 8, "max_queue_delay_ms": 2.0, "max_queue": 128, "preempt": True}
SERVABLE_WORKLOADS = ("cnn-dataset", "cnn-fc", "cnn-synthetic", "dlrm-ctr", "dlrm-movielens", "early-exit-digits",
                      "mlp-digits", "moe-gpt", "tiny-gpt")  # components.serving.model.servable_workloads()
_ENTRYPOINT = re.compile(ENTRYPOINT_PATTERN)
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


class ServeSpec(KindSpec):
    """Serve the ``model.pt`` of a finished ``train`` job over gRPC until the job is cancelled.

    On a shared device (``resources: {gpus: 0.25}``) the model runs inside the device's GPU-sharing service:
    its requests go before training work, and a co-located staged training job yields to them (SwitchFlow).
    """

    kind: ClassVar[str] = "serve"
    component: ClassVar[str] = "components.serving.component:ServeComponent"
    accepts_tokens: ClassVar[bool] = True  # the gRPC endpoint checks callers' deployment tokens (auth: token)
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
            inner.unknown({"job", "entrypoint"})
            job = inner.string("job", None, max_length=64)
            if job is None and "spec.model.job" not in inner.errors:
                inner.errors["spec.model.job"] = "required: the id of a finished train job"
            elif job is not None and "spec.model.job" not in inner.errors and not _UUID.match(job):
                inner.errors["spec.model.job"] = "must be a job id (a UUID)"
            entrypoint = inner.string("entrypoint", None, max_length=300)
            if entrypoint is not None and "spec.model.entrypoint" not in inner.errors and not _ENTRYPOINT.match(
                    entrypoint):
                inner.errors["spec.model.entrypoint"] = "must be 'package.module:Name' (a class with load and predict)"
            check.errors.update(inner.errors)
        check.not_null("port", "request_timeout_s", "max_rows", "batching", "auth")  # none is nullable
        auth = check.string("auth", "token", choices=AUTH_MODES)
        port = check.number("port", 0, kind=int, minimum=0, maximum=65535)
        timeout = check.number("request_timeout_s", 10.0, minimum=0.01, maximum=600)
        slo_ms = check.number("slo_ms", None, minimum=0.1, maximum=600_000)
        max_rows = check.number("max_rows", 1024, kind=int, minimum=1, maximum=65536)
        batching = dict(BATCHING_DEFAULTS)
        raw = spec.get("batching", {})
        if raw is None:
            pass  # "must not be null", from not_null
        elif not isinstance(raw, dict):
            check.errors["spec.batching"] = "must be an object {policy, max_batch, max_queue_delay_ms, max_queue}"
        else:
            inner = Checker(raw, prefix="spec.batching")
            inner.unknown(BATCHING_FIELDS)
            inner.not_null(*BATCHING_FIELDS)
            batching = {
                "policy": inner.string("policy", "orloj", choices=POLICIES),
                "max_batch": inner.number("max_batch", 8, kind=int, minimum=1, maximum=1024),
                "max_queue_delay_ms": inner.number("max_queue_delay_ms", 2.0, minimum=0, maximum=10_000),
                "max_queue": inner.number("max_queue", 128, kind=int, minimum=1, maximum=4096),
                "preempt": inner.boolean("preempt", True),
            }
            check.errors.update(inner.errors)
        emoe = spec.get("emoe")
        if emoe is not None:
            if not isinstance(emoe, dict):
                check.errors["spec.emoe"] = "must be an object {budget, miss} or null"
                emoe = None
            else:
                inner = Checker(emoe, prefix="spec.emoe")
                inner.unknown({"budget", "miss"})
                inner.not_null("budget", "miss")
                budget = inner.number("budget", 0.4, minimum=0.01, maximum=1.0)
                miss = inner.string("miss", "load", choices=EMOE_MISS)
                check.errors.update(inner.errors)
                emoe = {"budget": float(budget if budget is not None else 0.4), "miss": miss or "load"}
        replicas = check.number("replicas", 1, kind=int, minimum=1, maximum=MAX_REPLICAS)
        autoscale = self._autoscale(spec.get("autoscale"), replicas, check)
        check.raise_if_errors()
        return {"model": {"job": str(job).lower(), "entrypoint": entrypoint}, "port": port, "request_timeout_s": float(timeout),
                "replicas": replicas, "autoscale": autoscale, "emoe": emoe,
                "slo_ms": None if slo_ms is None else float(slo_ms), "max_rows": max_rows, "auth": auth,
                "batching": {**batching, "max_queue_delay_ms": float(batching["max_queue_delay_ms"])}}

    @staticmethod
    def _autoscale(raw: Any, replicas: Any, check: Checker) -> dict[str, Any] | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            check.errors["spec.autoscale"] = "must be an object {min, max, target_attainment, queue_per_replica, period_s}"
            return None
        inner = Checker(raw, prefix="spec.autoscale")
        inner.unknown(AUTOSCALE_FIELDS)
        inner.not_null(*AUTOSCALE_FIELDS)
        def value(found: Any, default: Any) -> Any:  # a null is reported by not_null; keep the default then
            return default if found is None else found

        low = value(inner.number("min", 1, kind=int, minimum=1, maximum=MAX_REPLICAS), 1)
        high = value(inner.number("max", max(low, 2), kind=int, minimum=1, maximum=MAX_REPLICAS), max(low, 2))
        result = {
            "min": low, "max": high,
            "target_attainment": float(value(inner.number("target_attainment", 0.95, minimum=0.01, maximum=1.0), 0.95)),
            "queue_per_replica": float(value(inner.number("queue_per_replica", 16.0, minimum=0.5, maximum=4096), 16.0)),
            "period_s": float(value(inner.number("period_s", 10.0, minimum=1.0, maximum=3600), 10.0)),
        }
        if not inner.errors:
            if low > high:
                inner.errors["spec.autoscale.min"] = f"must be at most max ({high})"
            elif isinstance(replicas, int) and not low <= replicas <= high:
                check.errors["spec.replicas"] = f"must lie within autoscale's [{low}, {high}]"
        check.errors.update(inner.errors)
        return result

    @staticmethod
    def replica_spec(spec: dict[str, Any]) -> dict[str, Any]:
        """The spec of one more replica of a deployment: the same model and settings, one replica, no autoscaling
        (the deployment's own attempt runs the controller)."""
        return {**spec, "replicas": 1, "autoscale": None, "port": 0}

    @staticmethod
    def default_deadline_s(spec: dict[str, Any]) -> float:
        """How long a call without a deadline may take: the SLO when one is set, else ``request_timeout_s``."""
        return spec["slo_ms"] / 1000.0 if spec.get("slo_ms") is not None else spec["request_timeout_s"]

    def sources(self, spec: dict[str, Any]) -> list[SourceRef]:
        # Any kind whose jobs write a self-describing model.pt (KindSpec.products): train, and kinds that derive a
        # model from a trained one (a compressed copy of it, say). A job that trained a team's own code is served
        # from the program its model.pt holds (components.train.model_format.export_program), or through
        # model.entrypoint; the node finds out which when it loads the file (a model.pt with neither fails the
        # attempt once, naming model.entrypoint).
        return [SourceRef(field="spec.model.job", job=spec["model"]["job"], kind=None, artifact="model.pt")]

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
                                           "description": "A SUCCEEDED train job of your team; its model.pt is served."},
                                   "entrypoint": {"type": ["string", "null"], "pattern": ENTRYPOINT_PATTERN,
                                                  "default": None,
                                                  "description": "A user model: 'package.module:Name', a class with "
                                                                 "load(path) and predict(batch) (see "
                                                                 "docs/components/serving.md)."}},
                },
                "port": {"type": "integer", "minimum": 0, "maximum": 65535, "default": 0,
                         "description": "TCP port of the gRPC endpoint on the node; 0 picks a free one."},
                "request_timeout_s": {"type": "number", "minimum": 0.01, "maximum": 600, "default": 10.0,
                                      "description": "Longest a request may wait and run when it sets no deadline "
                                                     "(and slo_ms is not set)."},
                "replicas": {"type": "integer", "minimum": 1, "maximum": MAX_REPLICAS, "default": 1,
                             "description": "Endpoints serving the model, each placed by the scheduler on a "
                                            "device of its own (this job is the first; the others are its "
                                            "child jobs). GET /api/v1/jobs/{id}/replicas/ lists them."},
                "autoscale": {
                    "type": ["object", "null"], "additionalProperties": False, "default": None,
                    "description": "Scale the replicas between min and max from measured SLO attainment and "
                                   "queue depth (docs/components/serving.md#autoscaling).",
                    "properties": {
                        "min": {"type": "integer", "minimum": 1, "maximum": MAX_REPLICAS, "default": 1},
                        "max": {"type": "integer", "minimum": 1, "maximum": MAX_REPLICAS, "default": 2},
                        "target_attainment": {"type": "number", "minimum": 0.01, "maximum": 1.0, "default": 0.95},
                        "queue_per_replica": {"type": "number", "minimum": 0.5, "maximum": 4096, "default": 16.0},
                        "period_s": {"type": "number", "minimum": 1.0, "maximum": 3600, "default": 10.0},
                    },
                },
                "emoe": {
                    "type": ["object", "null"], "additionalProperties": False, "default": None,
                    "description": "moe-gpt models only: keep only the experts upcoming requests are predicted to "
                                   "need on the device (eMoE).",
                    "properties": {
                        "budget": {"type": "number", "minimum": 0.01, "maximum": 1.0, "default": 0.4,
                                   "description": "Share of all experts' bytes that may be on the device."},
                        "miss": {"type": "string", "enum": list(EMOE_MISS), "default": "load",
                                 "description": "load: fetch a missing expert (exact outputs); reroute: send the "
                                                "token to its best resident expert (no load, approximate)."},
                    },
                },
                "auth": {"type": "string", "enum": list(AUTH_MODES), "default": "token",
                         "description": "token: every call carries one of the job's deployment tokens "
                                        "(authorization: Bearer; POST /api/v1/jobs/{id}/tokens/). none: no "
                                        "authentication, and the endpoint binds a loopback address only."},
                "slo_ms": {"type": ["number", "null"], "minimum": 0.1, "maximum": 600000, "default": None,
                           "description": "Per-request SLO: the deadline of a call that sets none (a call's own "
                                          "gRPC deadline wins). Unset: request_timeout_s."},
                "batching": {
                    "type": "object", "additionalProperties": False,
                    "description": "How queued requests are batched on the device.",
                    "properties": {
                        "policy": {"type": "string", "enum": list(POLICIES), "default": "orloj",
                                   "description": "orloj: deadline-aware (most requests on time); fifo: Triton's "
                                                  "dynamic batcher; edf: earliest deadline first."},
                        "max_batch": {"type": "integer", "minimum": 1, "maximum": 1024, "default": 8,
                                      "description": "Most requests run as one forward pass (1: no batching)."},
                        "max_queue_delay_ms": {"type": "number", "minimum": 0, "maximum": 10000, "default": 2.0,
                                               "description": "fifo only: longest the oldest request waits for a "
                                                              "fuller batch."},
                        "max_queue": {"type": "integer", "minimum": 1, "maximum": 4096, "default": 128,
                                      "description": "Most requests waiting; more are RESOURCE_EXHAUSTED."},
                        "preempt": {"type": "boolean", "default": True,
                                    "description": "orloj only: requests that would miss their deadlines waiting "
                                                   "for a running batch run between two of its layers (Irina)."},
                    },
                },
                "max_rows": {"type": "integer", "minimum": 1, "maximum": 65536, "default": 1024,
                             "description": "Largest batch (first dimension) one request may carry, and the "
                                            "most rows one forward pass runs."},
            },
        }


__all__ = ["ServeSpec", "SpecError"]
