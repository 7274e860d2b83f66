"""Direct transfers (strata.jobs.transfers) on a real S3 server (SeaweedFS): an attempt's upload in presigned,
MD5-checked parts that the control plane records only when whole; downloads through presigned (ranged) URLs; what
a stale attempt, another attempt, another team or an expired URL gets; and local disk, where the bytes keep going
through the control plane."""

from __future__ import annotations

import base64
import hashlib
import time
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from strata.jobs import transfers
from strata.jobs.models import Artifact, Attempt
from strata.jobs.storage import download_link, get_storage

MIB = 1 << 20


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


@pytest.fixture
def running(make_team, make_user, make_node, node_protocol, submit, run_pass):
    """A running attempt of team alpha's job, and how to call its routes."""
    team = make_team("alpha")
    node = make_node("n1", gpus=1)
    user = make_user("alice", team)
    job = submit(user, team)
    run_pass()
    attempt = Attempt.objects.get(job=job)

    class Running:
        pass

    it = Running()
    it.team, it.user, it.job, it.attempt, it.node = team, user, job, attempt, node
    it.protocol = node_protocol(attempt, node, claim=False)
    it.post = it.protocol.post
    return it


def start(running, data: bytes, name="big.ckpt", kind="checkpoint"):
    response = running.post("uploads/", {"name": name, "kind": kind, "size": len(data),
                                         "sha256": hashlib.sha256(data).hexdigest()})
    assert response.status_code == 200, response.content
    return response.json()


def put_parts(running, ticket, data: bytes, numbers):
    part = ticket["part_bytes"]
    chunks = {n: data[(n - 1) * part:n * part] for n in numbers}
    answer = running.post("uploads/parts/", {"upload": ticket["upload"],
                                             "parts": [{"number": n, "md5": md5(chunks[n])} for n in numbers]})
    assert answer.status_code == 200, answer.content
    for item in answer.json()["urls"]:
        assert item["url"].startswith("http://127.0.0.1:") and "Signature" in item["url"]
        stored = requests.put(item["url"], data=chunks[item["number"]],
                              headers={"Content-MD5": md5(chunks[item["number"]])}, timeout=60)
        assert stored.status_code == 200, stored.text


@pytest.fixture
def small_parts(monkeypatch):
    """5 MiB parts (S3's smallest), so a test moves a few parts of a small object, not 64 MiB ones."""
    monkeypatch.setattr("strata.jobs.storage.PART_BYTES", 5 * MIB)


@pytest.mark.usefixtures("s3_storage", "small_parts")
def test_a_direct_upload_is_recorded_only_when_every_part_is_there_and_resumes_with_the_missing_ones(running):
    data = bytes(range(256)) * (48 * 1024)  # 12 MiB: three parts
    ticket = start(running, data)
    assert ticket["direct"] and ticket["parts"] == 3 and ticket["part_bytes"] == 5 * MIB
    put_parts(running, ticket, data, [1, 3])
    incomplete = running.post("uploads/complete/", {"upload": ticket["upload"]})
    assert incomplete.status_code == 400 and "1 part(s) not uploaded: 2" in incomplete.json()["parts"][0]
    assert not Artifact.objects.filter(job=running.job).exists()  # nothing recorded for a partial upload
    listed = running.post("uploads/parts/", {"upload": ticket["upload"], "parts": []}).json()
    assert listed["stored"] == {"1": 5 * MIB, "3": 2 * MIB}  # what a resumed upload skips
    put_parts(running, ticket, data, [2])
    done = running.post("uploads/complete/", {"upload": ticket["upload"]})
    assert done.status_code == 201, done.content
    assert done.json()["size"] == len(data) and done.json()["sha256"] == hashlib.sha256(data).hexdigest()
    artifact = Artifact.objects.get(job=running.job, kind="checkpoint")
    with get_storage().open(artifact.storage_key) as stored:
        assert stored.read() == data
    # Read back: a presigned URL with the object's size and SHA-256; ranges work.
    link = running.protocol.get("checkpoint", link=1).json()
    assert link["size"] == len(data) and link["sha256"] == hashlib.sha256(data).hexdigest()
    ranged = requests.get(link["url"], headers={"Range": "bytes=5242870-5242889"}, timeout=30)
    assert ranged.status_code == 206 and ranged.content == data[5242870:5242890]


@pytest.mark.usefixtures("s3_storage", "small_parts")
def test_a_part_with_other_bytes_than_signed_is_refused_by_the_store(running):
    data = b"x" * (6 * MIB)
    ticket = start(running, data)
    answer = running.post("uploads/parts/", {"upload": ticket["upload"], "parts": [{"number": 1,
                                                                                    "md5": md5(data[:5 * MIB])}]})
    url = answer.json()["urls"][0]["url"]
    tampered = b"y" + data[1:5 * MIB]
    refused = requests.put(url, data=tampered, headers={"Content-MD5": md5(data[:5 * MIB])}, timeout=60)
    assert refused.status_code == 400 and "BadDigest" in refused.text
    unsigned = requests.put(url, data=tampered, timeout=60)  # no Content-MD5: the signature does not match
    assert unsigned.status_code == 403
    assert running.post("uploads/parts/", {"upload": ticket["upload"], "parts": []}).json()["stored"] == {}


@pytest.mark.usefixtures("s3_storage", "small_parts")
def test_bad_requests_name_every_field(running):
    for route in ("uploads/", "uploads/parts/", "uploads/complete/", "uploads/abort/"):
        listed = running.post(route, [None, None])  # found by schemathesis: a list, not an object, was a 500
        assert listed.status_code == 400 and "JSON object" in listed.json()["non_field_errors"][0], listed.content
    bad = running.post("uploads/", {"name": "ok.bin", "kind": "other", "size": -1, "sha256": "xyz"})
    assert bad.status_code == 400 and set(bad.json()) == {"kind", "size", "sha256"}, bad.content
    assert running.post("uploads/", {"name": "../x", "size": 1, "sha256": "0" * 64}).status_code == 400
    ticket = start(running, b"z" * (6 * MIB))
    parts = running.post("uploads/parts/", {"upload": ticket["upload"],
                                            "parts": [{"number": 9, "md5": "nope"}, {"number": 1}]})
    assert parts.status_code == 400
    assert set(parts.json()) == {"parts[0].number", "parts[0].md5", "parts[1].md5"}, parts.content
    forged = running.post("uploads/complete/", {"upload": ticket["upload"] + "x"})
    assert forged.status_code == 400 and "not an upload ticket" in forged.json()["upload"][0]
    assert running.post("uploads/abort/", {"upload": ticket["upload"]}).status_code == 204
    gone = running.post("uploads/complete/", {"upload": ticket["upload"]})
    assert gone.status_code == 400 and "gone" in gone.json()["upload"][0]


@pytest.mark.usefixtures("s3_storage", "small_parts")
def test_nothing_is_signed_for_another_attempt_an_ended_one_or_after_the_ticket_expired(
        running, make_node, submit, run_pass, settings):
    data = b"q" * (6 * MIB)
    ticket = start(running, data)
    # A ticket is bound to its attempt: another running attempt cannot use it.
    other_job = submit(running.user, running.team)
    make_node("n2", gpus=1)
    run_pass()
    other = Attempt.objects.get(job=other_job)
    another = running.protocol.of(other)
    stolen = another.post("uploads/parts/", {"upload": ticket["upload"], "parts": []})
    assert stolen.status_code == 400 and "another attempt" in stolen.json()["upload"][0]
    # A wrong fencing token, or an attempt that ended: 409 before anything is signed.
    wrong = running.post("uploads/", {"name": "a.bin", "size": 2 * MIB, "sha256": "0" * 64}, token="0")
    assert wrong.status_code == 409
    Attempt.objects.filter(pk=running.attempt.pk).update(ended_at=timezone.now())
    assert running.post("uploads/parts/", {"upload": ticket["upload"], "parts": []}).status_code == 409
    assert running.protocol.get("checkpoint", link=1).status_code == 409
    # An expired ticket is refused, and the beat aborts the upload behind it.
    settings.STRATA_UPLOAD_EXPIRY_HOURS = 0.5 / 3600
    time.sleep(1.5)
    late = another.post("uploads/", {"name": "late.bin", "size": 2 * MIB, "sha256": "0" * 64}).json()
    time.sleep(1.5)
    expired = another.post("uploads/parts/", {"upload": late["upload"], "parts": []})
    assert expired.status_code == 400 and "expired" in expired.json()["upload"][0]
    storage = get_storage()
    assert transfers.abandoned_uploads_abort() >= 2
    assert not list(storage.uploads_started_before(timezone.now()))


@pytest.mark.usefixtures("s3_storage")
def test_a_presigned_url_stops_working_when_it_expires(running, settings):
    settings.STRATA_DIRECT_MIN_BYTES = 0
    assert running.protocol.put("artifacts/model.pt", b"weights").status_code == 201
    settings.STRATA_PRESIGN_EXPIRY_S = 1
    link = running.protocol.get("sources/model.pt", link=1)
    # the job reads no source job: 404, whatever the storage
    assert link.status_code == 404
    artifact = Artifact.objects.get(job=running.job, name="model.pt")
    url = download_link(artifact.storage_key, artifact.size, artifact.sha256)["url"]
    assert requests.get(url, timeout=30).content == b"weights"
    time.sleep(2.5)
    assert requests.get(url, timeout=30).status_code == 403


@pytest.mark.usefixtures("s3_storage")
def test_a_users_download_is_a_redirect_to_the_store_and_another_teams_is_a_404(
        running, make_team, make_user, make_token, api, settings):
    settings.STRATA_DIRECT_MIN_BYTES = 0
    assert running.protocol.put("artifacts/report.html", b"<b>hi</b>").status_code == 201
    artifact = Artifact.objects.get(job=running.job, name="report.html")
    route = f"/api/v1/jobs/{running.job.pk}/artifacts/{artifact.pk}/download/"
    answer = api(make_token(running.user, running.team)).get(route)
    assert answer.status_code == 302 and answer["Cache-Control"] == "no-store"
    fetched = requests.get(answer["Location"], timeout=30)
    assert fetched.content == b"<b>hi</b>"
    assert fetched.headers["Content-Type"] == "binary/octet-stream"  # never a page the browser renders
    assert 'attachment; filename="report.html"' in fetched.headers["Content-Disposition"]
    beta = make_team("beta")
    assert api(make_token(make_user("bob", beta), beta)).get(route).status_code == 404


def test_on_local_disk_the_bytes_go_through_the_control_plane(running, settings, tmp_path):
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    answer = start(running, b"w" * (3 * MIB))
    assert answer == {"direct": False, "max_bytes": settings.STRATA_MAX_UPLOAD_BYTES}
    assert running.protocol.put("artifacts/checkpoint.pt", b"w" * (3 * MIB), kind="checkpoint").status_code == 201
    link = running.protocol.get("checkpoint", link=1).json()
    assert link == {"url": None, "size": 3 * MIB, "sha256": hashlib.sha256(b"w" * (3 * MIB)).hexdigest()}


@pytest.mark.usefixtures("s3_storage", "small_parts")
def test_a_direct_upload_past_the_teams_storage_quota_is_a_413_before_anything_is_signed(running):
    from strata.quotas.models import Quota

    Quota.objects.update_or_create(team=running.team, defaults={"max_storage_bytes": 8 * MIB})
    refused = running.post("uploads/", {"name": "big.ckpt", "kind": "checkpoint", "size": 9 * MIB,
                                        "sha256": "0" * 64})
    assert refused.status_code == 413 and "max_storage_bytes" in refused.json()["detail"], refused.content
    assert list(get_storage().uploads_started_before(timezone.now() + timedelta(days=1))) == []
    assert start(running, b"s" * (6 * MIB))["direct"]
