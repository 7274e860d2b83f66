"""The compress-embeddings kind's spec (light: what the control plane imports), its sources and its route/verb."""

from __future__ import annotations

import pytest

from components.embeddings.commands import render
from components.embeddings.routes import compression
from components.embeddings.spec import CompressEmbeddingsSpec
from components.runtime.contract.panels import StaticPanelData
from components.runtime.contract.spec import SourceRef, SpecError
from components.runtime.testing.conformance.kinds import KindSpecConformance

JOB = "5b0c3f7e-2a51-4c1e-9d0e-3f6b8f1a2c44"


class TestCompressEmbeddingsSpec(KindSpecConformance):
    spec_path = "components.embeddings.spec:CompressEmbeddingsSpec"
    valid_examples = ({"source": {"job": JOB}},
                      {"source": {"job": JOB, "artifact": "embeddings.pt"}, "ratio": 40, "head": 0.05,
                       "method": "minibatch", "seed": 3},
                      {"source": {"job": JOB}, "finetune": {"steps": 200, "lr": 0.01}})
    invalid_examples = (
        ({}, {"spec.source"}),
        ({"source": {"job": "not-a-uuid", "artifact": "weights.bin"}, "ratio": 0.5, "head": 0, "method": "dbscan",
          "colour": 1},
         {"spec.source.job", "spec.source.artifact", "spec.ratio", "spec.head", "spec.method", "spec.colour"}),
        ({"source": {"job": JOB, "artifact": "embeddings.pt"}, "finetune": {"steps": 10, "lr": -1}},
         {"spec.finetune.steps", "spec.finetune.lr"}),
        ({"source": {"job": JOB}, "finetune": None, "ratio": None, "seed": None},
         {"spec.finetune", "spec.ratio", "spec.seed"}),
    )


def test_defaults():
    spec = CompressEmbeddingsSpec().validate({"source": {"job": JOB.upper()}})
    assert spec == {"source": {"job": JOB, "artifact": "model.pt"}, "ratio": 20.0, "head": 0.1, "method": "kmeans",
                    "seed": 0, "finetune": {"steps": 0, "lr": 0.001}}
    assert CompressEmbeddingsSpec().validate(spec) == spec


def test_the_source_is_a_train_job_of_a_dlrm_workload_or_a_user_checkpoint():
    kind = CompressEmbeddingsSpec()
    spec = kind.validate({"source": {"job": JOB}})
    [ref] = kind.sources(spec)
    assert ref == SourceRef(field="spec.source.job", job=JOB, kind="train", artifact="model.pt")
    assert kind.source_problem(ref, {"workload": "dlrm-ctr"}, spec) is None
    problem = kind.source_problem(ref, {"workload": "mlp-digits"}, spec)
    assert "mlp-digits" in problem and "embeddings.pt" in problem
    user = kind.validate({"source": {"job": JOB, "artifact": "embeddings.pt"}})
    [ref] = kind.sources(user)
    assert ref.artifact == "embeddings.pt"
    assert kind.source_problem(ref, {"entrypoint": "mine.train:main"}, user) is None
    assert "model.pt" in kind.products


def test_a_spec_that_is_not_an_object_is_refused():
    with pytest.raises(SpecError):
        CompressEmbeddingsSpec().validate([])


REPORT = {"phase": "done", "source": JOB, "artifact": "model.pt", "workload": "dlrm-ctr", "dataset": "ctr-synthetic",
          "ratio_target": 20.0, "ratio": 20.3, "bytes_before": 12800, "bytes_after": 630, "clustering_s": 0.4,
          "auc_before": 0.87, "auc_after": 0.866, "auc_finetuned": None, "logloss_before": 0.40,
          "logloss_after": 0.41, "logloss_finetuned": None,
          "fields": [{"name": "field0", "features": 100, "seen": 90, "distinct": 90, "clusters": 4, "head": 12,
                      "bytes_before": 12800, "bytes_after": 630, "seconds": 0.4, "lossless": False,
                      "distortion": 0.1, "delta_auc": -0.004}]}


def test_the_route_answers_the_latest_report_and_the_verb_prints_it():
    job = {"id": JOB, "kind": "compress-embeddings", "state": "SUCCEEDED"}
    empty = StaticPanelData(job=job)
    assert compression(empty) == {"phase": None, "fields": []}
    assert render(compression(empty)) == ["no compression reported yet"]
    older = {**REPORT, "phase": "clustering"}
    data = StaticPanelData(job=job, reports={"embeddings": {"attempts": [
        {"attempt": "a1", "number": 1, "job_id": JOB, "time": 1.0, "payload": older},
        {"attempt": "a2", "number": 2, "job_id": JOB, "time": 2.0, "payload": REPORT}]}})
    answer = compression(data)
    assert answer["phase"] == "done" and answer["state"] == "SUCCEEDED" and answer["fields"][0]["clusters"] == 4
    lines = render(answer)
    assert "12.5 KiB -> 630 B: 20.3x smaller (target 20x)" in lines[1]
    assert "AUC 0.8700 -> 0.8660" in lines[2]
    assert lines[-1].split()[:4] == ["field0", "100", "90", "4"] and lines[-1].endswith("-0.0040")


def test_the_example_jobs_are_valid_specs():
    from pathlib import Path

    import yaml

    from components.train.spec import TrainSpec

    root = Path(__file__).parents[3] / "examples" / "jobs"
    train = yaml.safe_load((root / "dlrm-ctr.yaml").read_text())
    assert train["kind"] == "train" and TrainSpec().validate(train["spec"])["workload"] == "dlrm-ctr"
    compress = yaml.safe_load((root / "compress-ctr.yaml").read_text())
    spec = CompressEmbeddingsSpec().validate(compress["spec"])
    assert compress["kind"] == "compress-embeddings" and spec["finetune"]["steps"] == 200
