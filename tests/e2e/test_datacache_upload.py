"""End-to-end: cached preprocessing on an uploaded data set, on `strata up`. A team uploads an image folder with
`strata data upload` (no data root granted for it), registers a dataset on it with `strata datasets register
--upload`, and train jobs stream it through the node's cache: the node fetches the data set into its data cache
before the attempt starts, the pipeline reads it there, and the second job reads the preprocessed epochs the
first one cached. The data set is kept while a job reads it."""

from __future__ import annotations

import pytest
from test_datacache import make_images, series

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def job(name: str) -> dict:
    return {"name": name, "kind": "train", "resources": {"gpus": 0.25}, "max_attempts": 1,
            "spec": {"workload": "cnn-dataset", "epochs": 3, "batch_size": 16, "hidden": 4,
                     "data": {"dataset": "pets", "workers": 1, "cache": True}}}


def test_a_dataset_on_an_uploaded_image_folder_trains_through_the_cache(cluster, tmp_path):
    make_images(tmp_path / "pets-images")
    uploaded = cluster.cli("data", "upload", "pets-images", str(tmp_path / "pets-images"), timeout=300)
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    digest = cluster.get("data/pets-images/")["digest"]

    registered = cluster.cli("datasets", "register", "pets", "--upload", "pets-images", "--format", "image-folder",
                             "--size", "16")
    assert registered.returncode == 0, (registered.stdout, registered.stderr)
    assert f"on uploaded data set pets-images ({digest[:12]})" in registered.stdout, registered.stdout
    assert cluster.get("datasets/pets/")["source"]["digest"] == digest
    # A data set the team does not have is a 400 naming the field, never a traceback.
    missing = cluster.cli("datasets", "register", "nothing", "--upload", "no-such-data", "--format", "image-folder")
    assert missing.returncode != 0 and "source.upload" in missing.stderr and "Traceback" not in missing.stderr

    first = cluster.submit(job("upload-reader-1"))
    done = cluster.wait_state(first["id"], {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    assert done["state"] == "SUCCEEDED", (done, "\n".join(cluster.logs(first["id"]))[-3000:], cluster.output())
    assert done["spec"]["data"]["dataset"]["definition"]["source"]["digest"] == digest
    text = "\n".join(cluster.logs(first["id"]))
    assert f"data set pets-images {digest[:12]}: 72 files" in text, text[-3000:]  # fetched by the node
    # A built-in workload over the team's data runs none of its code: still hosted by the GPU-sharing service,
    # which reads the data set where the worker fetched it.
    assert "running in the GPU-sharing service" in text, text[-3000:]
    assert len(series(cluster, first["id"], "test_accuracy")) == 3

    second = cluster.submit(job("upload-reader-2"))
    done = cluster.wait_state(second["id"], {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    assert done["state"] == "SUCCEEDED", (done, cluster.output())
    assert series(cluster, second["id"], "data_cache_hit") == [1, 1, 1]  # every epoch from the first job's cache

    # Both ended: the data set may go (the dataset then names bytes the team no longer has, said at submit).
    deleted = cluster.cli("data", "delete", "pets-images")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    refused = cluster.session.post(f"{cluster.url}/api/v1/jobs/", json=job("upload-reader-3"), timeout=30)
    assert refused.status_code == 400 and "register the dataset again" in refused.json()["spec.data.dataset"][0]
