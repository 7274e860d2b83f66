"""A compress-embeddings attempt end to end (LocalContext): a trained DLRM's model.pt in, a compressed model.pt out,
served over gRPC with the same predictions; a user's embeddings.pt; bad checkpoints; stopping."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from components.embeddings.component import USER_FORMAT, CompressComponent, read_user_checkpoint
from components.embeddings.spec import CompressEmbeddingsSpec
from components.runtime.contract.context import LocalContext

SOURCE = "5b0c3f7e-2a51-4c1e-9d0e-3f6b8f1a2c44"


@pytest.fixture(scope="module")
def movielens_model(tmp_path_factory):
    """A real model.pt: dlrm-movielens trained for one epoch by a TrainLoop, as a train job saves it."""
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    spec = TrainSpec().validate({"workload": "dlrm-movielens", "epochs": 1, "checkpoint_every": 1000})
    ctx = LocalContext(job_id="train-job", attempt_id="attempt", spec=dict(spec),
                       workdir=tmp_path_factory.mktemp("train"))
    TrainLoop(builtin_workload("dlrm-movielens"), spec, ctx, owns_process=False).run()
    return ctx.artifacts["model.pt"]


def run_job(tmp_path, sources, **spec):
    spec = CompressEmbeddingsSpec().validate({"source": {"job": SOURCE, **spec.pop("source", {})}, **spec})
    ctx = LocalContext(job_id="compress-job", attempt_id="attempt", spec=spec, workdir=tmp_path, sources=sources)
    CompressComponent().run(ctx)
    return ctx


@pytest.fixture(scope="module")
def compressed(movielens_model, tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("compress"), {"model.pt": movielens_model}, ratio=4,
                   finetune={"steps": 20})


def test_a_trained_model_is_compressed_evaluated_and_stored(compressed, movielens_model):
    from components.train.model_format import load_model

    ctx = compressed
    assert sorted(ctx.artifacts) == ["compression.json", "model.pt"]
    report = ctx.reports["embeddings"]
    assert report["phase"] == "done" and report["workload"] == "dlrm-movielens"
    assert report["ratio"] >= 4 * 0.99 and report["bytes_after"] * report["ratio"] == pytest.approx(
        report["bytes_before"])
    assert 0.6 < report["auc_before"] < 1 and abs(report["auc_after"] - report["auc_before"]) < 0.05
    assert report["auc_finetuned"] is not None
    names = [field["name"] for field in report["fields"]]
    assert names == ["user", "movie", "age", "gender", "occupation", "zip", "genre", "year"]
    for field in report["fields"]:
        assert field["bytes_after"] <= field["bytes_before"]
        assert field["delta_auc"] is not None and abs(field["delta_auc"]) < 0.05
    assert sum(field["bytes_after"] for field in report["fields"]) == report["bytes_after"]
    assert {"user", "movie"} <= {field["name"] for field in report["fields"] if field["clusters"] is not None}
    metrics = {name: value for name, value, _ in ctx.metric_points}
    assert metrics["compression_ratio"] == pytest.approx(report["ratio"])
    saved = json.loads(ctx.artifacts["compression.json"].read_text())
    assert saved["report"]["ratio"] == report["ratio"]
    # The stored model describes itself: the same workload, clusters per field, rebuilt by the train format.
    module, description = load_model(ctx.artifacts["model.pt"])
    assert description["workload"] == "dlrm-movielens" and description["spec"]["compressed"]["source"] == SOURCE
    assert module.embedding_bytes() == report["bytes_after"]
    _, source = load_model(movielens_model)
    assert [f["clusters"] for f in description["config"]["fields"]] == [f["clusters"] for f in report["fields"]]
    assert all(f["clusters"] is None for f in source["config"]["fields"])
    assert any("clusters in" in message for _, _, message in ctx.logs)  # one progress line per field


def test_the_compressed_model_served_over_grpc_predicts_what_it_predicts_in_memory(compressed):
    from components.embeddings.datasets import movielens_100k
    from components.gpushare.executor import DeviceExecutor
    from components.serving.client import close_channels, describe, predict
    from components.serving.endpoint import start_serving
    from components.serving.model import load_served_model

    served = load_served_model(compressed.artifacts["model.pt"])
    assert served.input_shape == (8,) and served.input_dtype == "int64" and served.output_shape == (1,)
    rows = movielens_100k(0).x_test[:96].clone()
    rows[0, 0] = 10**9  # a user the model never knew: the fallback vector
    rows[1, 1] = -5
    with torch.inference_mode():
        expected = served.module(rows).numpy()
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        handle = start_serving(executor, "ctr", served, max_rows=32, source_job=SOURCE, request_timeout_s=5)
        try:
            assert describe(handle.address)["input_dtype"] == "int64"
            answers = np.concatenate([predict(handle.address, rows[start:start + 32].numpy())
                                      for start in range(0, len(rows), 32)])
        finally:
            handle.stop(grace=0.5)
            close_channels()  # no gRPC channel left open in this process: later tests fork node services
    assert answers.shape == (96, 1) and answers.dtype == np.float32
    np.testing.assert_allclose(answers, expected, rtol=1e-5, atol=1e-6)
    assert np.isfinite(answers).all() and ((answers > 0) & (answers < 1)).all()


def user_checkpoint(path, duplicates=True):
    generator = torch.Generator().manual_seed(0)
    distinct = torch.randn(5, 8, generator=generator)
    tables = {"city": distinct[torch.randint(0, 5, (400,), generator=generator)],
              "item": torch.randn(3000, 8, generator=generator)}
    frequencies = {"city": torch.randint(1, 100, (400,), generator=generator),
                   "item": torch.randint(0, 20, (3000,), generator=generator)}
    torch.save({"tables": tables, "frequencies": frequencies}, path)
    return tables, frequencies


def test_a_user_checkpoint_is_compressed_table_by_table(tmp_path):
    source = tmp_path / "embeddings.pt"
    tables, frequencies = user_checkpoint(source)
    ctx = run_job(tmp_path / "job", {"embeddings.pt": source}, source={"artifact": "embeddings.pt"}, ratio=8)
    assert sorted(ctx.artifacts) == ["compression.json", "embeddings.pt"]
    saved = torch.load(ctx.artifacts["embeddings.pt"], weights_only=True)
    assert saved["format"] == USER_FORMAT
    city = saved["fields"]["city"]
    assert len(city["centroids"]) == city["fallback"] + 1 == 6  # 5 distinct vectors and the fallback
    assert torch.equal(city["centroids"][city["index"].long()], tables["city"])  # lossless: exact duplicates
    item = saved["fields"]["item"]
    assert len(item["index"]) == 3000 and int(item["index"].long().max()) == item["fallback"]
    unseen = frequencies["item"] == 0
    assert bool((item["index"][unseen].long() == item["fallback"]).all())
    report = ctx.reports["embeddings"]
    assert report["phase"] == "done" and report["auc_before"] is None and report["ratio"] >= 8 * 0.99
    fields = {field["name"]: field for field in report["fields"]}
    assert fields["city"]["lossless"] and fields["city"]["distortion"] == 0
    assert not fields["item"]["lossless"] and 0 < fields["item"]["distortion"] < 1


def test_a_bad_user_checkpoint_fails_with_every_problem_named(tmp_path):
    path = tmp_path / "embeddings.pt"
    torch.save({"tables": {"a": torch.randn(10), "b": torch.full((4, 2), float("nan")), "c": torch.randn(5, 2)},
                "frequencies": {"c": torch.tensor([1, 2, -1, 0, 0])}}, path)
    with pytest.raises(ValueError) as caught:
        read_user_checkpoint(path)
    message = str(caught.value)
    assert "tables['a']" in message and "tables['b']" in message and "frequencies['c']" in message
    assert "\n" not in message
    path.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a readable torch file"):
        read_user_checkpoint(path)
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match="must hold"):
        read_user_checkpoint(path)


def test_a_model_that_is_not_a_dlrm_is_refused(tmp_path):
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    spec = TrainSpec().validate({"workload": "mlp-digits", "epochs": 1, "max_steps": 2})
    train = LocalContext(job_id="t", attempt_id="a", spec=dict(spec), workdir=tmp_path / "train")
    TrainLoop(builtin_workload("mlp-digits"), spec, train, owns_process=False).run()
    with pytest.raises(ValueError, match="no embedding tables"):
        run_job(tmp_path / "job", {"model.pt": train.artifacts["model.pt"]})


def test_a_stop_request_ends_the_attempt_without_results(tmp_path, movielens_model):
    spec = CompressEmbeddingsSpec().validate({"source": {"job": SOURCE}})
    ctx = LocalContext(job_id="c", attempt_id="a", spec=spec, workdir=tmp_path, sources={"model.pt": movielens_model})
    ctx._stop.set()
    CompressComponent().run(ctx)
    assert ctx.artifacts == {} and ctx.reports["embeddings"]["phase"] != "done"
    assert any("nothing was stored" in message for _, _, message in ctx.logs)
