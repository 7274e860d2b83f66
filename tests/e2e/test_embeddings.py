"""End-to-end through ``strata up``: train a DLRM, compress its embeddings, read the result through the route, the
verb and the job page's panels, then serve the compressed model over gRPC and get what the artifact predicts."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from e2e_support import login, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_train_compress_and_serve_a_recommendation_model(cluster, tmp_path):
    from components.embeddings.datasets import movielens_100k
    from components.serving.client import predict
    from components.train.model_format import load_model

    trained = cluster.submit({"name": "e2e-dlrm", "kind": "train", "resources": {"gpus": 0.5}, "max_attempts": 1,
                              "spec": {"workload": "dlrm-movielens", "epochs": 1}})["id"]
    record = cluster.wait_state(trained, TERMINAL, 180)
    assert record["state"] == "SUCCEEDED", (record, cluster.output())
    assert any(point["name"] == "test_auc" and point["value"] > 0.6 for point in cluster.metrics(trained))

    (tmp_path / "compress.yaml").write_text(
        f"name: e2e-compress\nkind: compress-embeddings\nresources: {{gpus: 0.5}}\nmax_attempts: 1\n"
        f"spec: {{source: {{job: {trained}}}, ratio: 4, finetune: {{steps: 10}}}}\n")
    submitted = cluster.cli("submit", str(tmp_path / "compress.yaml"), "--wait", "--timeout", "400", timeout=450)
    assert submitted.returncode == 0, (submitted.stdout, submitted.stderr, cluster.output())
    compressed = re.search(r"submitted job (\S+) ", submitted.stdout).group(1)
    assert cluster.job(compressed)["state"] == "SUCCEEDED"

    answer = cluster.get(f"jobs/{compressed}/compression/")
    assert answer["phase"] == "done" and answer["source"] == trained and answer["ratio"] >= 4 * 0.99
    assert len(answer["fields"]) == 8 and answer["auc_after"] > 0.6
    shown = cluster.cli("embeddings", compressed)
    assert shown.returncode == 0 and "smaller (target 4x)" in shown.stdout and "movie" in shown.stdout, shown
    missing = cluster.cli("embeddings", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1  # one line, no traceback
    panels = {panel["slug"]: panel for panel in
              login(cluster).get(f"{cluster.url}/jobs/{compressed}/live/?panels=1", timeout=30).json()["panels"]}
    assert {"embeddings-summary", "embeddings-fields"} <= set(panels), panels
    assert "movie" in str(panels["embeddings-fields"])

    artifacts = {item["name"]: item for item in cluster.get(f"jobs/{compressed}/artifacts/")}
    assert {"model.pt", "compression.json"} <= set(artifacts)
    download = cluster.session.get(f"{cluster.url}/api/v1/jobs/{compressed}/artifacts/"
                                   f"{artifacts['model.pt']['id']}/download/", timeout=30)
    module, description = load_model(io.BytesIO(download.content))
    assert description["workload"] == "dlrm-movielens"
    assert any(field["clusters"] is not None for field in description["config"]["fields"])

    served = cluster.submit({"name": "e2e-serve-ctr", "kind": "serve", "resources": {"gpus": 0.25},
                             "spec": {"model": {"job": compressed}, "auth": "none"}})["id"]
    job = cluster.wait_state(served, {"RUNNING", *TERMINAL}, 120)
    assert job["state"] == "RUNNING", (job, cluster.output())
    address = wait_for(lambda: cluster.job(served)["endpoint"], 60, message="the serve job's endpoint")
    rows = movielens_100k(0).x_test[:64].clone()
    rows[0, 1] = 10**7  # a movie nobody has seen: the field's fallback vector
    scores = np.concatenate([predict(address, rows[start:start + 16].numpy(), timeout=10)
                             for start in range(0, 64, 16)])
    with torch.inference_mode():
        expected = module(rows).numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    cluster.api("POST", f"jobs/{served}/cancel/")
    assert cluster.wait_state(served, TERMINAL, 60)["state"] == "CANCELLED"

