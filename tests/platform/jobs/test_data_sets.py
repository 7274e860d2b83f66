"""Data sets over the API: chunked, resumable uploads with a checksum per chunk, the size limit, team scoping,
jobs that mount them (resolved to the digest at submit, kept while an unfinished job mounts them) and the node's
fenced route to their bytes."""

from __future__ import annotations

import hashlib
import io

import pytest

from components.runtime.shared import bundles
from strata.jobs.models import Attempt, DataSet, DataUpload, Job

UPLOADS = "/api/v1/uploads/"
DATA = "/api/v1/data/"
JOBS = "/api/v1/jobs/"
CHUNK = 1024


pytestmark = pytest.mark.usefixtures("storage_backend")  # alice, bob, storage_backend (local disk, then S3): conftest.py


def directory_archive(tmp_path, files: dict[str, bytes]) -> bytes:
    root = tmp_path / "dataset"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    buffer = io.BytesIO()
    bundles.pack(root, buffer, ignore_files=False, compresslevel=1)
    return buffer.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunks_of(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


def open_upload(client, name: str, data: bytes, **extra):
    body = {"name": name, "size": len(data), "sha256": sha(data), "chunk_size": CHUNK, **extra}
    return client.post(UPLOADS, body, format="json")


def put_chunk(client, upload_id: str, index: int, data: bytes, checksum: str | None = None):
    return client.generic("PUT", f"{UPLOADS}{upload_id}/chunks/{index}/", data=data,
                          content_type="application/octet-stream", HTTP_CONTENT_SHA256=checksum or sha(data))


def upload_all(client, name: str, data: bytes, **extra) -> dict:
    opened = open_upload(client, name, data, **extra)
    assert opened.status_code == 201, opened.content
    upload_id = opened.json()["id"]
    for index, chunk in enumerate(chunks_of(data)):
        assert put_chunk(client, upload_id, index, chunk).status_code == 200
    done = client.post(f"{UPLOADS}{upload_id}/complete/")
    assert done.status_code == 201, done.content
    return done.json()


@pytest.fixture
def payload(tmp_path) -> bytes:
    # Random bytes do not compress: the archive spans several chunks.
    import random

    noise = random.Random(7).randbytes(5000)
    return directory_archive(tmp_path, {"images/a.bin": noise, "labels.csv": b"a,1\nb,2\n", ".gitignore": b"*\n"})


def test_a_chunked_upload_is_resumed_by_sending_only_the_missing_chunks(alice, payload):
    parts = chunks_of(payload)
    assert len(parts) >= 4
    first = open_upload(alice, "pets", payload)
    assert first.status_code == 201, first.content
    upload = first.json()
    assert upload["chunks"] == len(parts) and upload["missing"] == list(range(len(parts)))
    for index in (0, 2):  # the first session is interrupted
        assert put_chunk(alice, upload["id"], index, parts[index]).status_code == 200
    # The second session asks which chunks the server has (the same name and contents: the same upload).
    again = open_upload(alice, "pets", payload)
    assert again.status_code == 200 and again.json()["id"] == upload["id"]
    state = alice.get(f"{UPLOADS}{upload['id']}/").json()
    assert state["received"] == [0, 2]
    sent = []
    for index in state["missing"]:
        assert put_chunk(alice, upload["id"], index, parts[index]).status_code == 200
        sent.append(index)
    assert 0 not in sent and 2 not in sent
    done = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert done.status_code == 201, done.content
    body = done.json()
    assert body["name"] == "pets" and body["digest"] == sha(payload) and body["format"] == "archive"
    # Ignore files are data too: nothing is left out.
    assert {f["path"] for f in body["files"]} == {".gitignore", "images/a.bin", "labels.csv"}
    assert not DataUpload.objects.exists()  # the chunks are dropped once assembled
    listed = alice.get(DATA).json()["results"]
    assert [item["name"] for item in listed] == ["pets"]
    assert alice.get(f"{DATA}pets/").json()["file_count"] == 3


def test_a_bad_chunk_checksum_is_a_400_naming_the_chunk_and_nothing_is_kept(alice, payload, storage_backend):
    upload = open_upload(alice, "pets", payload).json()
    part = chunks_of(payload)[1]
    response = put_chunk(alice, upload["id"], 1, part, checksum=sha(b"something else"))
    assert response.status_code == 400
    assert "chunk 1" in response.json()["chunk"][0]
    assert alice.get(f"{UPLOADS}{upload['id']}/").json()["received"] == []
    assert not storage_backend.keys()
    missing = alice.generic("PUT", f"{UPLOADS}{upload['id']}/chunks/1/", data=part,
                            content_type="application/octet-stream")
    assert missing.status_code == 400 and "Content-SHA256" in missing.json()
    short = put_chunk(alice, upload["id"], 1, part[:-1])
    assert short.status_code == 400 and "chunk 1" in short.json()["chunk"][0]
    beyond = put_chunk(alice, upload["id"], 99, part)
    assert beyond.status_code == 400 and "chunk 99" in beyond.json()["chunk"][0]


def test_a_bad_whole_checksum_at_complete_drops_the_upload(alice, payload):
    upload = open_upload(alice, "pets", payload, sha256="0" * 64).json()
    for index, chunk in enumerate(chunks_of(payload)):
        assert put_chunk(alice, upload["id"], index, chunk).status_code == 200
    response = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert response.status_code == 400 and "sha256" in response.json()
    assert not DataSet.objects.exists() and not DataUpload.objects.exists()


def test_complete_with_chunks_missing_is_a_409_naming_them(alice, payload):
    upload = open_upload(alice, "pets", payload).json()
    response = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert response.status_code == 409 and "chunks" in response.json()["detail"]


def test_limits_names_and_bad_fields_are_named(alice, settings, payload):
    settings.STRATA_MAX_DATA_BYTES = 2048
    over = open_upload(alice, "pets", payload)
    assert over.status_code == 400 and "limit" in over.json()["size"][0]
    bad = alice.post(UPLOADS, {"name": "Bad Name", "size": -1, "sha256": "x", "chunk_size": 1, "format": "zip",
                               "extra": 1}, format="json")
    assert bad.status_code == 400
    assert {"name", "size", "sha256", "chunk_size", "format", "extra"} <= set(bad.json())
    no_file = alice.post(UPLOADS, {"name": "one", "size": 3, "sha256": sha(b"abc"), "chunk_size": CHUNK,
                                   "format": "file"}, format="json")
    assert no_file.status_code == 400 and "file" in no_file.json()


def test_an_archive_that_expands_past_the_limit_is_refused_at_complete(alice, settings, tmp_path):
    data = directory_archive(tmp_path, {"zeros.bin": b"\0" * 200_000})
    settings.STRATA_MAX_DATA_BYTES = 100_000
    assert len(data) < 100_000
    upload = open_upload(alice, "zeros", data).json()
    for index, chunk in enumerate(chunks_of(data)):
        assert put_chunk(alice, upload["id"], index, chunk).status_code == 200
    response = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert response.status_code == 400 and "limit" in response.json()["file"][0]
    assert not DataSet.objects.exists()


def test_a_file_upload_and_a_taken_name(alice):
    data = b"x,y\n1,2\n" * 300
    created = upload_all(alice, "table", data, format="file", file="table.csv")
    assert created["format"] == "file" and created["files"] == [{"path": "table.csv", "size": len(data)}]
    taken = open_upload(alice, "table", data, format="file", file="table.csv")
    assert taken.status_code == 409 and "name" in taken.json()["detail"]


def test_another_teams_data_set_and_upload_are_404(alice, bob, payload):
    upload_all(alice, "pets", payload)
    pending = open_upload(alice, "other", payload).json()
    assert bob.get(f"{DATA}pets/").status_code == 404
    assert bob.delete(f"{DATA}pets/").status_code == 404
    assert bob.get(DATA).json()["results"] == []
    assert bob.get(f"{UPLOADS}{pending['id']}/").status_code == 404
    assert put_chunk(bob, pending["id"], 0, chunks_of(payload)[0]).status_code == 404
    assert bob.post(f"{UPLOADS}{pending['id']}/complete/").status_code == 404
    assert bob.delete(f"{UPLOADS}{pending['id']}/").status_code == 404
    # Bob's own data set may have the same name: names are unique per team.
    upload_all(bob, "pets", payload)
    assert DataSet.objects.filter(name="pets").count() == 2


def test_a_job_mounts_a_data_set_by_name_resolved_to_its_digest(alice, bob, payload):
    digest = upload_all(alice, "pets", payload)["digest"]
    body = {"kind": "train", "spec": {"command": ["python", "-c", "print(1)"], "data": {"mount": {"images": "pets"}}}}
    response = alice.post(JOBS, body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    mount = job.spec["data"]["mount"]["images"]
    assert mount["digest"] == digest and mount["name"] == "pets" and mount["format"] == "archive"
    assert [ds.name for ds in job.data_sets.all()] == ["pets"]
    # Delete is refused while an unfinished job mounts it, allowed once it ended.
    refused = alice.delete(f"{DATA}pets/")
    assert refused.status_code == 409 and str(job.pk) in refused.json()["detail"]
    assert alice.get(f"{DATA}pets/").json()["jobs"] == 1
    assert alice.post(f"{JOBS}{job.pk}/cancel/").status_code == 200
    # Another team's name is unknown: a 400 naming the mount.
    foreign = bob.post(JOBS, body, format="json")
    assert foreign.status_code == 400 and "spec.data.mount.images" in foreign.json()
    assert alice.delete(f"{DATA}pets/").status_code == 204
    # The job's stored spec names a data set that is gone: a resubmit says so.
    again = alice.post(f"{JOBS}{job.pk}/resubmit/")
    assert again.status_code == 400 and "spec.data.mount.images" in again.json()


def test_a_bad_mount_is_a_400_naming_the_alias(alice):
    body = {"kind": "train", "spec": {"command": ["true"], "data": {"mount": {"../x": "pets", "ok": "nothing"}}}}
    response = alice.post(JOBS, body, format="json")
    assert response.status_code == 400 and "spec.data.mount.../x" in response.json()
    body["spec"]["data"]["mount"] = {"ok": "nothing"}
    response = alice.post(JOBS, body, format="json")
    assert response.status_code == 400 and "spec.data.mount.ok" in response.json()


def test_the_node_fetches_only_what_the_attempt_mounts(alice, payload, make_node, node_protocol, run_pass):
    node = make_node("n1", gpus=1)
    digest = upload_all(alice, "pets", payload)["digest"]
    other = upload_all(alice, "other", b"0123456789" * 10, format="file", file="f.txt")["digest"]
    body = {"kind": "train", "resources": {"gpus": 1},
            "spec": {"command": ["python", "-c", "print(1)"], "data": {"mount": {"images": "pets"}}}}
    job_id = alice.post(JOBS, body, format="json").json()["id"]
    run_pass()
    attempt = Attempt.objects.get(job_id=job_id)
    protocol = node_protocol(attempt, node, claim=False)
    assert protocol.claim().status_code == 200
    response = protocol.get(f"data/{digest}")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == payload
    assert protocol.get(f"data/{other}").status_code == 404  # the team's, but not mounted by the job
    assert protocol.get(f"data/{digest}", token="wrong").status_code == 409
    assert protocol.through(alice).get(f"data/{digest}").status_code == 403  # a user token is no node
