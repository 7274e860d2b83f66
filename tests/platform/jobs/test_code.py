"""Code bundles over the API: upload (raw or multipart, tar or zip), dedup per team, limits, hostile archives,
team scoping, and jobs that run a bundle."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest

from components.runtime.shared import bundles
from strata.jobs.models import CodeBundle, Job

CODE = "/api/v1/code/"
JOBS = "/api/v1/jobs/"


pytestmark = pytest.mark.usefixtures("storage_backend")  # alice, bob, storage_backend (local disk, then S3): conftest.py


def project_archive(tmp_path, files=None) -> bytes:
    root = tmp_path / "project"
    root.mkdir(exist_ok=True)
    for name, text in (files or {"train.py": "print('hi')\n", "requirements.txt": "tqdm\n"}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    buffer = io.BytesIO()
    bundles.pack(root, buffer)
    return buffer.getvalue()


def upload(client, data: bytes, content_type="application/gzip", **params):
    query = "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
    return client.generic("POST", CODE + query, data=data, content_type=content_type)


def test_upload_is_content_addressed_and_deduplicated_per_team(alice, bob, tmp_path, storage_backend):
    data = project_archive(tmp_path)
    first = upload(alice, data)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["digest"] == bundles.digest_of(io.BytesIO(data)) and body["file_count"] == 2
    assert body["team"] == "alpha" and body["size"] == len(data)
    again = upload(alice, data)
    assert again.status_code == 200 and again.json()["digest"] == body["digest"]
    assert CodeBundle.objects.filter(team__slug="alpha").count() == 1
    stored = [key for key in storage_backend.keys() if key.endswith(".tar.gz")]
    assert len(stored) == 1 and storage_backend.read(stored[0]) == data
    # Another team uploading the same bytes gets its own bundle; neither sees the other's.
    assert upload(bob, data).status_code == 201
    assert bob.get(f"{CODE}{body['digest']}/").json()["team"] == "beta"
    assert [b["team"] for b in alice.get(CODE).json()["results"]] == ["alpha"]


def test_detail_lists_files_and_download_returns_the_bytes(alice, tmp_path):
    data = project_archive(tmp_path)
    digest = upload(alice, data).json()["digest"]
    detail = alice.get(f"{CODE}{digest[:16]}/")
    assert detail.status_code == 200
    assert detail.json()["files"] == [{"path": "requirements.txt", "size": 5}, {"path": "train.py", "size": 12}]
    download = alice.get(f"{CODE}{digest}/download/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == data


def test_a_zip_from_the_browser_is_stored_canonically(alice):
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        archive.writestr("project/train.py", "print('hi')\n")
    upload_file = io.BytesIO(raw.getvalue())
    upload_file.name = "project.zip"
    response = alice.post(CODE, {"file": upload_file}, format="multipart")
    assert response.status_code == 201, response.content
    assert response.json()["file_count"] == 1
    assert alice.get(f"{CODE}{response.json()['digest']}/").json()["files"] == [{"path": "train.py", "size": 12}]


def _tar_with(info, data=None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _member(name, kind=tarfile.REGTYPE, linkname="", data=b"x"):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return _tar_with(info, data if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize("archive, problem", [
    (_member("../../etc/cron.d/evil"), "'..'"),
    (_member("/abs/path"), "absolute"),
    (_member("link", tarfile.SYMTYPE, "/etc/passwd"), "links"),
    (_member("dev", tarfile.CHRTYPE), "devices"),
    (b"not an archive" * 20, "not a tar"),
], ids=["dotdot", "absolute", "link", "device", "not-a-tar"])  # not the bytes: gzip stamps the time in them
def test_hostile_uploads_get_a_400_naming_the_problem(alice, storage_backend, archive, problem):
    response = upload(alice, archive)
    assert response.status_code == 400, response.content
    assert problem in " ".join(response.json()["file"])
    assert CodeBundle.objects.count() == 0
    assert not storage_backend.keys()


def test_over_the_limit_names_the_largest_files(alice, settings, tmp_path):
    settings.STRATA_MAX_CODE_BYTES = 4096
    data = project_archive(tmp_path, {"weights.bin": "w" * 6000, "train.py": "x\n"})
    response = upload(alice, data)
    assert response.status_code == 400
    assert "weights.bin" in " ".join(response.json()["file"])


def test_a_job_records_its_bundle_which_is_kept_while_the_job_exists(alice, bob, tmp_path):
    digest = upload(alice, project_archive(tmp_path)).json()["digest"]
    body = {"kind": "train", "code": digest, "spec": {"command": ["python", "train.py"]}}
    response = alice.post(JOBS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["code"]["digest"] == digest
    job = Job.objects.get(pk=response.json()["id"])
    assert job.code.digest == digest
    assert alice.delete(f"{CODE}{digest}/").status_code == 409  # a job uses it
    assert CodeBundle.objects.filter(digest=digest).exists()
    # Another team cannot run (or even see) it: the error names the field.
    refused = bob.post(JOBS, body, format="json")
    assert refused.status_code == 400 and "code" in refused.json()
    assert bob.get(f"{CODE}{digest}/").status_code == 404


def test_an_unused_bundle_can_be_deleted(alice, tmp_path, storage_backend, django_capture_on_commit_callbacks):
    digest = upload(alice, project_archive(tmp_path)).json()["digest"]
    assert storage_backend.keys("code")
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.delete(f"{CODE}{digest}/").status_code == 204
    assert not CodeBundle.objects.exists() and not storage_backend.keys("code")


def test_a_bad_code_field_is_named_with_the_other_bad_fields(alice):
    body = {"kind": "train", "code": "zz", "spec": {"command": "python train.py"}, "priority": 999}
    response = alice.post(JOBS, body, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert {"code", "spec.command", "priority"} <= set(errors)
