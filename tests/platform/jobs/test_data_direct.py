"""Direct uploads of data sets (strata.jobs.data) on a real S3 server (SeaweedFS): the chunks go straight to the
store through URLs signed per chunk with its MD5, an interrupted upload resumes from what the store holds, the
control plane joins and verifies the object (its SHA-256, an archive entry by entry) before it records the data
set, and a lying or refused upload leaves nothing behind."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile

import pytest
import requests

from components.runtime.shared import bundles
from strata.jobs.models import DataSet, DataUpload
from strata.jobs.storage import get_storage

UPLOADS = "/api/v1/uploads/"
MIB = 1 << 20
CHUNK = 5 * MIB

pytestmark = pytest.mark.usefixtures("s3_storage")


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def archive(tmp_path, files: dict[str, bytes]) -> bytes:
    root = tmp_path / "dataset"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    buffer = io.BytesIO()
    bundles.pack(root, buffer, ignore_files=False, compresslevel=1)
    return buffer.getvalue()


def chunks(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


def open_upload(client, name: str, data: bytes, sha256: str | None = None, **extra):
    body = {"name": name, "size": len(data), "sha256": sha256 or hashlib.sha256(data).hexdigest(),
            "chunk_size": CHUNK, **extra}
    return client.post(UPLOADS, body, format="json")


def send(client, upload_id: str, data: bytes, indices) -> dict:
    parts = chunks(data)
    answer = client.post(f"{UPLOADS}{upload_id}/parts/",
                         {"parts": [{"index": i, "md5": md5(parts[i])} for i in indices]}, format="json")
    assert answer.status_code == 200, answer.content
    for item in answer.json()["urls"]:
        assert item["url"].startswith("http://127.0.0.1:") and "Signature" in item["url"]
        assert item["length"] == len(parts[item["index"]])
        stored = requests.put(item["url"], data=parts[item["index"]],
                              headers={"Content-MD5": md5(parts[item["index"]])}, timeout=60)
        assert stored.status_code == 200, stored.text
    return answer.json()


def open_store_uploads() -> list[str]:
    from datetime import timedelta

    from django.utils import timezone

    return [key for key, _ in get_storage().uploads_started_before(timezone.now() + timedelta(hours=1))]


@pytest.fixture
def stored_keys():
    class Stored:
        @staticmethod
        def keys(prefix: str = "") -> list[str]:
            return [item.key for item in get_storage().list(prefix)]

        @staticmethod
        def read(key: str) -> bytes:
            with get_storage().open(key) as stream:
                return stream.read()

    return Stored()


@pytest.fixture
def big(tmp_path) -> bytes:
    """A directory of random files (about 12 MiB packed: three chunks, the last one short)."""
    return archive(tmp_path, {"a.bin": os.urandom(7 * MIB), "sub/b.bin": os.urandom(5 * MIB),
                              "labels.csv": b"a,1\nb,2\n"})


def test_a_data_set_goes_straight_to_the_store_and_is_verified_before_it_is_recorded(alice, big, stored_keys):
    opened = open_upload(alice, "pets", big)
    assert opened.status_code == 201, opened.content
    upload = opened.json()
    assert upload["direct"] is True and upload["chunks"] == 3 and upload["missing"] == [0, 1, 2]
    put = alice.generic("PUT", f"{UPLOADS}{upload['id']}/chunks/0/", data=chunks(big)[0],
                        content_type="application/octet-stream",
                        HTTP_CONTENT_SHA256=hashlib.sha256(chunks(big)[0]).hexdigest())
    assert put.status_code == 409 and "/parts/" in put.json()["detail"]  # its chunks go to the store
    early = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert early.status_code == 409 and "3 chunk(s) still missing" in early.json()["detail"]

    send(alice, upload["id"], big, [2, 0])
    seen = alice.get(f"{UPLOADS}{upload['id']}/").json()
    assert seen["received"] == [0, 2] and seen["missing"] == [1]
    resumed = open_upload(alice, "pets", big)  # the client came back: the same upload, with what the store holds
    assert resumed.status_code == 200 and resumed.json()["id"] == upload["id"] and resumed.json()["missing"] == [1]
    assert not stored_keys.keys("uploads/")  # nothing went through the control plane

    send(alice, upload["id"], big, [1])
    done = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert done.status_code == 201, done.content
    data_set = done.json()
    assert data_set["digest"] == hashlib.sha256(big).hexdigest() and data_set["size"] == len(big)
    assert data_set["file_count"] == 3 and data_set["expanded_size"] == 12 * MIB + 8
    assert not DataUpload.objects.exists()
    key = DataSet.objects.get(name="pets").storage_key
    assert stored_keys.read(key) == big  # the store joined the chunks into the object, byte for byte
    assert stored_keys.keys() == [key] and not open_store_uploads()


def test_bytes_other_than_those_signed_are_refused_by_the_store(alice, big):
    upload = open_upload(alice, "pets", big).json()
    part = chunks(big)[0]
    url = alice.post(f"{UPLOADS}{upload['id']}/parts/", {"parts": [{"index": 0, "md5": md5(part)}]},
                     format="json").json()["urls"][0]["url"]
    other = bytes(len(part))
    refused = requests.put(url, data=other, headers={"Content-MD5": md5(other)}, timeout=60)
    assert refused.status_code == 403, refused.text  # the MD5 is part of the signature
    damaged = requests.put(url, data=other, headers={"Content-MD5": md5(part)}, timeout=60)
    assert damaged.status_code == 400 and "BadDigest" in damaged.text
    assert alice.get(f"{UPLOADS}{upload['id']}/").json()["missing"] == [0, 1, 2]


def test_a_whole_that_does_not_match_its_sha256_is_dropped(alice, big, stored_keys):
    upload = open_upload(alice, "pets", big, sha256="0" * 64).json()
    send(alice, upload["id"], big, [0, 1, 2])
    done = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert done.status_code == 400, done.content
    assert "the chunks assemble to" in done.json()["sha256"][0] and "0" * 64 in done.json()["sha256"][0]
    assert not DataSet.objects.exists() and not DataUpload.objects.exists()
    assert stored_keys.keys() == [] and not open_store_uploads()


def test_an_archive_with_a_path_out_of_its_root_is_dropped(alice, tmp_path, stored_keys):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        payload = os.urandom(6 * MIB)
        info = tarfile.TarInfo("../escape.bin")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    data = buffer.getvalue()
    upload = open_upload(alice, "evil", data).json()
    assert upload["direct"] is True
    send(alice, upload["id"], data, range(upload["chunks"]))
    done = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert done.status_code == 400 and "escape.bin" in done.json()["file"][0], done.content
    assert not DataSet.objects.exists() and stored_keys.keys() == []


def test_a_single_file_data_set(alice, stored_keys):
    data = os.urandom(2 * MIB + 3)
    upload = open_upload(alice, "weights", data, format="file", file="w.bin", chunk_size=4 * MIB).json()
    assert upload["direct"] is True and upload["chunks"] == 1
    send(alice, upload["id"], data, [0])
    done = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert done.status_code == 201, done.content
    assert done.json()["files"] == [{"path": "w.bin", "size": len(data)}]


def test_bad_requests_name_each_field(alice, bob, big):
    small = open_upload(alice, "pets", big, chunk_size=MIB)
    assert small.status_code == 400 and "at least 5.0 MiB" in small.json()["chunk_size"][0], small.content
    upload = open_upload(alice, "pets", big).json()
    bad = alice.post(f"{UPLOADS}{upload['id']}/parts/", {"parts": [{"index": 3, "md5": "x"}, "no"]}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()) == {"parts[0].index", "parts[0].md5", "parts[1].index", "parts[1].md5"}, bad.json()
    assert alice.post(f"{UPLOADS}{upload['id']}/parts/", [1], format="json").status_code == 400
    other = bob.post(f"{UPLOADS}{upload['id']}/parts/", {"parts": []}, format="json")
    assert other.status_code == 404  # another team's upload
    tiny = open_upload(alice, "tiny", b"x" * 2048, chunk_size=1024).json()  # under STRATA_DIRECT_MIN_BYTES
    assert tiny["direct"] is False
    through = alice.post(f"{UPLOADS}{tiny['id']}/parts/", {"parts": []}, format="json")
    assert through.status_code == 409 and "chunks/" in through.json()["detail"]


def test_an_abandoned_upload_is_aborted_in_the_store(alice, big, stored_keys, django_capture_on_commit_callbacks):
    upload = open_upload(alice, "pets", big).json()
    send(alice, upload["id"], big, [0])
    assert open_store_uploads()
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.delete(f"{UPLOADS}{upload['id']}/").status_code == 204
    assert not open_store_uploads() and stored_keys.keys() == []
    gone = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert gone.status_code == 404


def test_local_disk_keeps_the_chunks_going_through_the_control_plane(alice, big, settings, tmp_path):
    settings.STRATA_ARTIFACT_STORAGE = "strata.jobs.storage.LocalArtifactStorage"
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    upload = open_upload(alice, "pets", big).json()
    assert upload["direct"] is False
