"""The node side of ``compress-embeddings``: one attempt compresses a source job's embedding tables (Saec).

Source ``model.pt`` (a ``dlrm-*`` train job):

1. Rebuild the trained DLRM (:func:`components.train.model_format.load_model`) and regenerate its dataset from the
   source spec's seed (the same rows it trained on: the data is seeded or bundled).
2. Evaluate AUC and log loss on the held-out rows.
3. Plan clusters per field for the target ratio and cluster each field: KMeans on the frequent head, the tail to
   the nearest centroid (:mod:`components.embeddings.compress`); per field, the ΔAUC with only that field
   compressed.
4. Evaluate the compressed model; optionally fine-tune its centroids for ``finetune.steps`` steps and evaluate
   again.
5. Store the compressed ``model.pt`` (the same workload, each field's ``clusters`` in its config: the serving
   plugin rebuilds it like any other) after checking that the file, loaded back, predicts what the model in
   memory predicts; and ``compression.json``, the report.

Source ``embeddings.pt`` (a user checkpoint, ``{"tables": {field: (features, dim)}, "frequencies": {field:
(features,)}}``): the same clustering per field, stored as ``embeddings.pt`` ``{"format":
"strata-clustered-embeddings/1", "fields": {field: {"centroids": (clusters + 1, dim), "index": (features,),
"fallback": clusters}}}``; with no model to evaluate, each field reports its distortion (the count-weighted mean
squared distance from a feature's vector to its centroid, over the count-weighted variance).

The job reports its progress (``ctx.report("embeddings", ...)``: the panels' source), its metrics and one log
line per field. A stop request (cancel, preemption) ends it between fields; compression is deterministic, so a
retried attempt starts over and gets the same result.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from components.embeddings.spec import KIND, PLUGIN, CompressEmbeddingsSpec
from components.runtime.contract.component import Component
from components.runtime.contract.context import Context

USER_FORMAT = "strata-clustered-embeddings/1"
MAX_FINETUNE_EPOCHS = 1000


class Stopped(Exception):
    """A stop request arrived: the attempt ends without results."""


class Compression:
    """One attempt's work and its running report."""

    def __init__(self, ctx: Context, spec: dict[str, Any]):
        self.ctx, self.spec = ctx, spec
        source = spec["source"]
        self.report: dict[str, Any] = {
            "phase": "loading", "source": source["job"], "artifact": source["artifact"], "workload": None,
            "dataset": None, "ratio_target": spec["ratio"], "ratio": None, "bytes_before": None,
            "bytes_after": None, "clustering_s": None, "auc_before": None, "auc_after": None,
            "auc_finetuned": None, "logloss_before": None, "logloss_after": None, "logloss_finetuned": None,
            "fields": []}

    def publish(self, **changes: Any) -> None:
        self.report.update(changes)
        self.ctx.report(PLUGIN, self.report)

    def check_stop(self) -> None:
        if self.ctx.should_stop():
            raise Stopped

    def settings(self):
        from components.embeddings.compress import Settings

        return Settings(ratio=self.spec["ratio"], head=self.spec["head"], method=self.spec["method"],
                        seed=self.spec["seed"])

    # -- a DLRM's model.pt -------------------------------------------------------------------------------
    def model(self, path: Path) -> dict[str, Any]:
        from components.embeddings.compress import centroid_parameters, compress_model, hybrid
        from components.embeddings.model import evaluate, fit
        from components.embeddings.workload import WORKLOADS
        from components.train.model_format import load_model

        module, description = load_model(path)
        workload = WORKLOADS.get(description["workload"])
        if workload is None:
            raise ValueError(f"the source model.pt is a {description['workload']} model, not one of "
                             f"{', '.join(WORKLOADS)}: it has no embedding tables to compress")
        source_spec = description["spec"]
        self.publish(workload=description["workload"], dataset=workload.dataset, phase="loading")
        self.ctx.log(f"loading {workload.dataset} (seed {source_spec.get('seed', 0)}) to evaluate the model")
        data = workload().load({"seed": int(source_spec.get("seed", 0)), "data": {}})
        before = evaluate(module, data.x_test, data.y_test)
        self.ctx.log(f"before: AUC {before['auc']:.4f}, log loss {before['logloss']:.4f}, "
                     f"embeddings {module.embedding_bytes():,} bytes")
        self.publish(phase="clustering", auc_before=before["auc"], logloss_before=before["logloss"],
                     bytes_before=module.embedding_bytes())
        self.check_stop()
        result = compress_model(module, description["config"], self.settings(), progress=self.field_done)
        self.check_stop()
        self.publish(phase="evaluating", ratio=result.ratio, bytes_after=result.bytes_after,
                     clustering_s=result.seconds)
        after = evaluate(result.model, data.x_test, data.y_test)
        for position, field in enumerate(result.fields):
            if field.clusters is not None:
                field.delta_auc = evaluate(hybrid(module, result.model, position), data.x_test,
                                           data.y_test)["auc"] - before["auc"]
            else:
                field.delta_auc = 0.0
            self.check_stop()
        self.ctx.log(f"after: AUC {after['auc']:.4f} ({after['auc'] - before['auc']:+.4f}), log loss "
                     f"{after['logloss']:.4f}, embeddings {result.bytes_after:,} bytes ({result.ratio:.1f}x smaller)")
        self.publish(auc_after=after["auc"], logloss_after=after["logloss"],
                     fields=[field.as_dict() for field in result.fields])
        steps = self.spec["finetune"]["steps"]
        finetuned = None
        if steps:
            self.publish(phase="finetuning")
            self.ctx.log(f"fine-tuning the centroids for {steps} steps")
            fit(result.model, data.x_train, data.y_train, epochs=MAX_FINETUNE_EPOCHS, max_steps=steps,
                lr=self.spec["finetune"]["lr"], seed=self.spec["seed"],
                parameters=centroid_parameters(result.model))
            result.model.eval()
            finetuned = evaluate(result.model, data.x_test, data.y_test)
            self.ctx.log(f"fine-tuned: AUC {finetuned['auc']:.4f} ({finetuned['auc'] - before['auc']:+.4f}), "
                         f"log loss {finetuned['logloss']:.4f}")
            self.publish(auc_finetuned=finetuned["auc"], logloss_finetuned=finetuned["logloss"])
        self.check_stop()
        compressed = {"source": self.spec["source"]["job"], "ratio": result.ratio, "method": self.spec["method"],
                      "head": self.spec["head"], "finetune_steps": steps}
        self.store_model(workload, description, result, compressed, data.x_test[:256])
        metrics = {"auc_before": before["auc"], "auc_after": after["auc"], "logloss_before": before["logloss"],
                   "logloss_after": after["logloss"], "compression_ratio": result.ratio,
                   "embedding_bytes_before": float(result.bytes_before),
                   "embedding_bytes_after": float(result.bytes_after), "clustering_s": result.seconds}
        if finetuned is not None:
            metrics.update(auc_finetuned=finetuned["auc"], logloss_finetuned=finetuned["logloss"])
        return metrics

    def field_done(self, line: str) -> None:
        self.ctx.log(line)
        self.check_stop()

    def store_model(self, workload, description: dict[str, Any], result, compressed: dict[str, Any],
                    sample: torch.Tensor) -> None:
        """Write the compressed model.pt, and check that the file predicts what the model in memory does."""
        from components.embeddings.model import predict
        from components.train.model_format import MODEL_FORMAT, load_model, save_model

        inputs, outputs = workload.describe_io(result.config)
        spec = {**description["spec"], "compressed": compressed}
        payload = {"format": MODEL_FORMAT, "workload": description["workload"], "config": result.config,
                   "input": inputs, "output": outputs, "spec": spec}
        buffer = io.BytesIO()
        save_model(buffer, payload, result.model.state_dict())
        reloaded, _ = load_model(buffer.getvalue())
        expected, got = predict(result.model, sample), predict(reloaded, sample)
        if not torch.equal(expected, got):
            raise RuntimeError("the compressed model.pt does not predict what the compressed model does "
                               f"(max difference {float((expected - got).abs().max()):.3g})")
        with tempfile.TemporaryDirectory(prefix="strata-embeddings-") as directory:
            target = Path(directory) / "model.pt"
            target.write_bytes(buffer.getvalue())
            self.ctx.artifact(target, "model.pt")

    # -- a user's embeddings.pt -------------------------------------------------------------------------------
    def tables(self, path: Path) -> dict[str, Any]:
        from components.embeddings.compress import cluster_field, compressed_bytes, plan_clusters

        names, tables, frequencies = read_user_checkpoint(path)
        bytes_before = sum(table.numel() * table.element_size() for table in tables)
        self.publish(phase="clustering", bytes_before=bytes_before)
        distinct = [max(1, int(torch.unique(table[counts > 0], dim=0).shape[0])) if bool((counts > 0).any()) else 1
                    for table, counts in zip(tables, frequencies, strict=True)]
        plan = plan_clusters([len(table) for table in tables], distinct, [table.shape[1] for table in tables],
                             self.spec["ratio"], 4)
        fields, out, started = [], {}, time.perf_counter()
        for name, table, counts, clusters in zip(names, tables, frequencies, plan, strict=True):
            before = table.numel() * table.element_size()
            tick = time.perf_counter()
            if clusters is None:
                out[name] = {"table": table}
                fields.append({"name": name, "features": len(table), "seen": int((counts > 0).sum()),
                               "distinct": 0, "clusters": None, "head": 0, "bytes_before": before,
                               "bytes_after": before, "seconds": 0.0, "lossless": True, "distortion": 0.0,
                               "delta_auc": None})
                continue
            clustering, facts = cluster_field(table, counts, clusters, head=self.spec["head"],
                                              method=self.spec["method"], seed=self.spec["seed"])
            seconds = time.perf_counter() - tick
            after = compressed_bytes(len(table), clustering.clusters, table.shape[1], 4)
            out[name] = {"centroids": clustering.centroids, "index": clustering.index,
                         "fallback": clustering.clusters}
            fields.append({"name": name, "features": len(table), **facts, "clusters": clustering.clusters,
                           "bytes_before": before, "bytes_after": after, "seconds": seconds, "delta_auc": None})
            self.ctx.log(f"{name}: {len(table)} features ({facts['seen']} seen) -> {clustering.clusters} clusters "
                         f"in {seconds:.2f}s, distortion {facts['distortion']:.4f}")
            self.check_stop()
        seconds = time.perf_counter() - started
        bytes_after = sum(field["bytes_after"] for field in fields)
        ratio = bytes_before / max(1, bytes_after)
        self.publish(phase="evaluating", ratio=ratio, bytes_after=bytes_after, clustering_s=seconds, fields=fields)
        with tempfile.TemporaryDirectory(prefix="strata-embeddings-") as directory:
            target = Path(directory) / "embeddings.pt"
            torch.save({"format": USER_FORMAT, "fields": out}, target)
            self.ctx.artifact(target, "embeddings.pt")
        return {"compression_ratio": ratio, "embedding_bytes_before": float(bytes_before),
                "embedding_bytes_after": float(bytes_after), "clustering_s": seconds}

    def run(self) -> None:
        source = self.spec["source"]
        self.ctx.log(f"compressing the embeddings of job {source['job']} ({source['artifact']}) "
                     f"{self.spec['ratio']:g}x, head {self.spec['head']:g}, {self.spec['method']}")
        path = self.ctx.source_artifact(source["artifact"])
        try:
            metrics = self.model(path) if source["artifact"] == "model.pt" else self.tables(path)
        except Stopped:
            self.ctx.log("stopped before the compression finished; nothing was stored")
            return
        self.ctx.metrics(metrics, step=1)
        self.publish(phase="done")
        with tempfile.TemporaryDirectory(prefix="strata-embeddings-") as directory:
            target = Path(directory) / "compression.json"
            target.write_text(json.dumps({"metrics": metrics, "report": self.report}, indent=2, sort_keys=True))
            self.ctx.artifact(target, "compression.json")


def read_user_checkpoint(path: Path) -> tuple[list[str], list[torch.Tensor], list[torch.Tensor]]:
    """``(names, tables, frequencies)`` of a user's ``embeddings.pt``; ValueError naming what is wrong."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"embeddings.pt is not a readable torch file: {type(error).__name__}: {error}") from error
    if not isinstance(saved, dict) or not isinstance(saved.get("tables"), dict) \
            or not isinstance(saved.get("frequencies"), dict):
        raise ValueError("embeddings.pt must hold {'tables': {field: (features, dim) tensor}, "
                         "'frequencies': {field: (features,) tensor}}")
    problems, names, tables, frequencies = [], [], [], []
    if not saved["tables"]:
        problems.append("it has no tables")
    for name, table in saved["tables"].items():
        counts = saved["frequencies"].get(name)
        if not isinstance(table, torch.Tensor) or table.dim() != 2 or not table.is_floating_point() \
                or min(table.shape) < 1:
            problems.append(f"tables[{name!r}] is not a (features, dim) float tensor")
            continue
        if not bool(torch.isfinite(table).all()):
            problems.append(f"tables[{name!r}] holds NaN or infinite values")
            continue
        if not isinstance(counts, torch.Tensor) or counts.shape != (table.shape[0],) or counts.is_floating_point() \
                and not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
            problems.append(f"frequencies[{name!r}] is not a ({table.shape[0]},) tensor of non-negative counts")
            continue
        names.append(str(name))
        tables.append(table.detach().to(torch.float32))
        frequencies.append(counts.detach().to(torch.float64))
    if problems:
        raise ValueError("embeddings.pt: " + "; ".join(problems))
    return names, tables, frequencies


class CompressComponent(Component):
    kind: ClassVar[str] = KIND

    def run(self, ctx: Context) -> None:
        spec = CompressEmbeddingsSpec().validate(ctx.spec)
        Compression(ctx, spec).run()


__all__ = ["CompressComponent", "Compression", "USER_FORMAT", "read_user_checkpoint"]
