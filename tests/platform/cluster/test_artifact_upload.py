"""PUT /api/v1/node/attempts/{id}/artifacts/{name}/: an empty body is an empty file (it was a 500: DRF gives no
stream for an empty body). Found by tests/platform/api/test_fuzz_schemathesis.py."""

from __future__ import annotations

import hashlib

import pytest

from strata.jobs.models import Artifact, Attempt


def test_an_empty_upload_stores_an_empty_artifact(make_team, make_user, make_node, node_protocol, submit, run_pass):
    team = make_team("alpha")
    node = make_node("n1", gpus=1)
    job = submit(make_user("alice", team), team)
    run_pass()
    response = node_protocol(Attempt.objects.get(job=job), node, claim=False).put("artifacts/empty.bin", b"")
    assert response.status_code == 201, response.content
    assert response.json()["size"] == 0 and response.json()["sha256"] == hashlib.sha256(b"").hexdigest()
    assert Artifact.objects.get(job=job, name="empty.bin").size == 0


@pytest.mark.usefixtures("storage_backend")  # local disk, then S3 (SeaweedFS): tests/conftest.py
def test_a_checkpoint_and_an_artifact_go_in_and_out_on_every_backend(make_team, make_user, make_node, node_protocol,
                                                                     make_token, api, submit, run_pass):
    team = make_team("alpha")
    node = make_node("n1", gpus=1)
    user = make_user("alice", team)
    job = submit(user, team)
    run_pass()
    node_api = node_protocol(Attempt.objects.get(job=job), node, claim=False)
    checkpoint = bytes(range(256)) * 40_000  # 10 MiB: a multipart upload on S3
    response = node_api.put("artifacts/step-7.pt", checkpoint, kind="checkpoint")
    assert response.status_code == 201, response.content
    assert response.json()["sha256"] == hashlib.sha256(checkpoint).hexdigest()
    assert node_api.put("artifacts/model.pt", b"weights").status_code == 201
    back = node_api.get("checkpoint")
    assert back.status_code == 200 and b"".join(back.streaming_content) == checkpoint
    artifact = Artifact.objects.get(job=job, name="model.pt")
    download = api(make_token(user, team)).get(f"/api/v1/jobs/{job.pk}/artifacts/{artifact.pk}/download/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"weights"


def test_an_upload_while_the_object_store_is_down_is_a_503_and_records_nothing(
        make_team, make_user, make_node, node_protocol, submit, run_pass, settings):
    from support import free_port

    settings.STRATA_ARTIFACT_STORAGE = "strata.jobs.storage.S3ArtifactStorage"
    settings.STRATA_S3_ENDPOINT = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings.STRATA_S3_BUCKET, settings.STRATA_S3_REGION = "strata-down", "us-east-1"
    settings.STRATA_S3_ACCESS_KEY_ID, settings.STRATA_S3_SECRET_ACCESS_KEY = "key", "secret"
    team = make_team("alpha")
    node = make_node("n1", gpus=1)
    job = submit(make_user("alice", team), team)
    run_pass()
    response = node_protocol(Attempt.objects.get(job=job), node, claim=False).put("artifacts/model.pt", b"weights")
    assert response.status_code == 503, response.content
    assert "artifact storage is unavailable" in response.json()["detail"] and response["Retry-After"]
    assert "secret" not in response.content.decode()
    assert not Artifact.objects.filter(job=job).exists()
