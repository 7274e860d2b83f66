"""Cached-preprocessing datasets on an uploaded data set, over the API: ``POST /api/v1/datasets/`` with
``source: {upload: NAME}`` needs one of the team's own data sets (another team's is a 400 on ``source.upload``
worded as for a missing one, never a 404) and no data root; the record is pinned to the digest; a job naming the
dataset is linked to the data set (kept while it is unfinished) and its node may fetch exactly it; a re-upload
or a definition the spec brings itself is refused at submit."""

from __future__ import annotations

import hashlib
import io

import pytest
from PIL import Image

from components.runtime.shared import bundles
from strata.jobs.models import Attempt, Job, PluginRecord

UPLOADS = "/api/v1/uploads/"
DATASETS = "/api/v1/datasets/"
JOBS = "/api/v1/jobs/"
CHUNK = 4096

pytestmark = pytest.mark.usefixtures("artifact_root")  # alice, bob, artifact_root: conftest.py


def image_archive(tmp_path, shade: int = 0) -> bytes:
    root = tmp_path / f"images-{shade}"
    for label, colour in enumerate(((220, 30, 30), (30, 200, 40))):
        (root / f"class-{label}").mkdir(parents=True)
        for n in range(4):
            Image.new("RGB", (8, 8), (colour[0], colour[1], n * 20 + shade)).save(root / f"class-{label}" / f"{n}.png")
    buffer = io.BytesIO()
    bundles.pack(root, buffer, ignore_files=False, compresslevel=1)
    return buffer.getvalue()


def upload(client, name: str, data: bytes, **extra) -> dict:
    opened = client.post(UPLOADS, {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                   "chunk_size": CHUNK, **extra}, format="json")
    assert opened.status_code == 201, opened.content
    for index in range(0, len(data), CHUNK):
        part = data[index:index + CHUNK]
        sent = client.generic("PUT", f"{UPLOADS}{opened.json()['id']}/chunks/{index // CHUNK}/", data=part,
                              content_type="application/octet-stream",
                              HTTP_CONTENT_SHA256=hashlib.sha256(part).hexdigest())
        assert sent.status_code == 200, sent.content
    done = client.post(f"{UPLOADS}{opened.json()['id']}/complete/")
    assert done.status_code == 201, done.content
    return done.json()


def cnn_job(dataset="pets") -> dict:
    return {"kind": "train", "resources": {"gpus": 0.5},
            "spec": {"workload": "cnn-dataset", "epochs": 1, "data": {"dataset": dataset, "cache": True}}}


def test_a_dataset_on_the_teams_upload_is_pinned_and_needs_no_data_root(alice, bob, tmp_path):
    data_set = upload(alice, "pets-images", image_archive(tmp_path))
    body = {"name": "pets", "source": {"upload": "pets-images"}, "format": "image-folder", "size": 8}
    created = alice.post(DATASETS, body, format="json")  # team alpha was granted no data root
    assert created.status_code == 201, created.content
    source = created.json()["source"]
    assert source["upload"] == "pets-images" and source["digest"] == data_set["digest"]
    assert source["format"] == "archive" and source["expanded_size"] == data_set["expanded_size"]
    assert created.json()["pipelines"][0]["definition"]["source"]["digest"] == data_set["digest"]
    # Bob's team has no data set of that name: alice's is as unknown as one that does not exist, on the field.
    foreign = bob.post(DATASETS, body, format="json")
    nowhere = bob.post(DATASETS, {**body, "source": {"upload": "no-such-data"}}, format="json")
    assert foreign.status_code == nowhere.status_code == 400
    assert foreign.json()["source.upload"][0] == nowhere.json()["source.upload"][0].replace("no-such-data",
                                                                                               "pets-images")
    assert "team beta has no uploaded data set named 'pets-images'" in foreign.json()["source.upload"][0]
    # A file is no image folder.
    upload(alice, "table", b"x,y\n" * 400, format="file", file="t.csv")
    wrong = alice.post(DATASETS, {**body, "name": "table-images", "source": {"upload": "table"}}, format="json")
    assert wrong.status_code == 400 and "is one file" in wrong.json()["source.upload"][0]
    assert list(PluginRecord.objects.values_list("name", flat=True)) == ["pets"]


def test_a_job_on_it_links_the_data_set_and_its_node_fetches_exactly_it(alice, tmp_path, make_node, node_protocol,
                                                                         run_pass):
    node = make_node("n1", gpus=1)
    archive = image_archive(tmp_path)
    digest = upload(alice, "pets-images", archive)["digest"]
    other = upload(alice, "other", b"0123456789" * 10, format="file", file="f.txt")["digest"]
    assert alice.post(DATASETS, {"name": "pets", "source": {"upload": "pets-images"}, "format": "image-folder",
                                 "size": 8}, format="json").status_code == 201
    response = alice.post(JOBS, cnn_job(), format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.spec["data"]["dataset"]["definition"]["source"]["digest"] == digest
    assert [ds.name for ds in job.data_sets.all()] == ["pets-images"]
    refused = alice.delete("/api/v1/data/pets-images/")  # kept while an unfinished job reads it
    assert refused.status_code == 409 and str(job.pk) in refused.json()["detail"]

    run_pass()
    attempt = Attempt.objects.get(job_id=job.pk)
    protocol = node_protocol(attempt, node, claim=False)
    assert protocol.claim().status_code == 200
    fetched = protocol.get(f"data/{digest}")
    assert fetched.status_code == 200 and b"".join(fetched.streaming_content) == archive
    assert protocol.get(f"data/{other}").status_code == 404  # the team's, but not read by the job


def test_a_reupload_or_a_forged_definition_is_refused_at_submit(alice, bob, tmp_path):
    upload(alice, "pets-images", image_archive(tmp_path))
    assert alice.post(DATASETS, {"name": "pets", "source": {"upload": "pets-images"}, "format": "image-folder",
                                 "size": 8}, format="json").status_code == 201
    first = alice.post(JOBS, cnn_job(), format="json")
    assert first.status_code == 201, first.content
    resolved = Job.objects.get(pk=first.json()["id"]).spec["data"]["dataset"]
    # Bob brings alice's resolved definition (her digest) under a name of his own: refused, nothing linked.
    assert bob.post(DATASETS, {"name": "pets", "source": {"path": "/srv/nothing"}, "format": "image-folder"},
                    format="json").status_code == 400
    forged = bob.post(JOBS, cnn_job(dataset=resolved), format="json")
    assert forged.status_code == 400 and "spec.data.dataset" in forged.json(), forged.content
    path = {"name": "pets", "definition": {**resolved["definition"], "source": {"path": "/etc"}}}
    assert alice.post(JOBS, cnn_job(dataset=path), format="json").status_code == 400
    # The same resolved dataset again (a resubmit, a sweep's trial) is accepted while nothing changed.
    assert alice.post(JOBS, cnn_job(dataset=resolved), format="json").status_code == 201
    # Uploaded again with other bytes: the registration no longer names what the team has.
    for job in Job.objects.filter(team__slug="alpha"):
        assert alice.post(f"{JOBS}{job.pk}/cancel/").status_code == 200
    assert alice.delete("/api/v1/data/pets-images/").status_code == 204
    upload(alice, "pets-images", image_archive(tmp_path, shade=3))
    again = alice.post(JOBS, cnn_job(), format="json")
    assert again.status_code == 400 and "register the dataset again" in again.json()["spec.data.dataset"][0]
