"""Abandoned data uploads expire, and a team's open uploads are bounded: the beat's task deletes every upload not
completed within ``STRATA_UPLOAD_EXPIRY_HOURS`` of its start with the chunks it received (rows and bytes on disk),
a chunk or a ``complete`` for an expired one is refused, and one open upload past ``STRATA_MAX_OPEN_UPLOADS`` is a
409 naming the limit."""

from __future__ import annotations

import hashlib
import random
from datetime import timedelta

import pytest
from django.utils import timezone

from strata.jobs.data import uploads_expire
from strata.jobs.models import DataSet, DataUpload

UPLOADS = "/api/v1/uploads/"
CHUNK = 1024

pytestmark = pytest.mark.usefixtures("artifact_root")  # alice, bob, artifact_root: conftest.py


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def open_upload(client, name: str, data: bytes):
    return client.post(UPLOADS, {"name": name, "size": len(data), "sha256": sha(data), "chunk_size": CHUNK},
                       format="json")


def put_chunk(client, upload_id: str, index: int, data: bytes):
    part = data[index * CHUNK:(index + 1) * CHUNK]
    return client.generic("PUT", f"{UPLOADS}{upload_id}/chunks/{index}/", data=part,
                          content_type="application/octet-stream", HTTP_CONTENT_SHA256=sha(part))


def age(upload_id: str, hours: float) -> None:
    """Make the upload look started ``hours`` ago."""
    DataUpload.objects.filter(pk=upload_id).update(created_at=timezone.now() - timedelta(hours=hours))


def stored(artifact_root) -> list[str]:
    root = artifact_root / "uploads"
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else []


@pytest.fixture
def data() -> bytes:
    return random.Random(3).randbytes(3 * CHUNK + 100)  # four chunks


def test_the_beat_deletes_uploads_not_completed_in_time_with_their_chunks(alice, bob, data, artifact_root, settings,
                                                                          django_capture_on_commit_callbacks):
    from strata.scheduling.tasks import expire_uploads_task

    settings.STRATA_UPLOAD_EXPIRY_HOURS = 24
    old = open_upload(alice, "old", data).json()
    fresh = open_upload(alice, "fresh", data).json()
    theirs = open_upload(bob, "theirs", data).json()
    for upload, client in ((old, alice), (fresh, alice), (theirs, bob)):
        for index in (0, 2):
            assert put_chunk(client, upload["id"], index, data).status_code == 200
    team = DataUpload.objects.get(pk=old["id"]).team_id
    assert f"{team}/{old['id']}/0" in stored(artifact_root) and f"{team}/{old['id']}/2" in stored(artifact_root)
    age(old["id"], 25)
    age(theirs["id"], 24.5)
    age(fresh["id"], 23)  # still within the limit
    with django_capture_on_commit_callbacks(execute=True):  # the bytes go once the deletion commits
        assert expire_uploads_task() == 2
    assert set(DataUpload.objects.values_list("name", flat=True)) == {"fresh"}
    left = stored(artifact_root)
    assert not [path for path in left if old["id"] in path or theirs["id"] in path], left  # the bytes, the folder
    assert f"{team}/{fresh['id']}/0" in left
    assert alice.get(f"{UPLOADS}{old['id']}/").status_code == 404
    assert expire_uploads_task() == 0  # nothing more to do
    # The fresh one goes once it is past its deadline too, and the setting is read at each run.
    settings.STRATA_UPLOAD_EXPIRY_HOURS = 12
    with django_capture_on_commit_callbacks(execute=True):
        assert uploads_expire() == 1 and not DataUpload.objects.exists()
    assert not [path for path in stored(artifact_root) if (artifact_root / "uploads" / path).is_file()]


def test_the_beat_schedules_the_task():
    from strata.celery import EXPIRE_UPLOADS_TASK, app
    from strata.scheduling import tasks

    app.loader.import_default_modules()
    entry = app.conf.beat_schedule["data-uploads-expiry"]
    assert entry["task"] == tasks.expire_uploads_task.name == EXPIRE_UPLOADS_TASK
    assert entry["options"]["queue"] == "control"


def test_an_expired_upload_takes_no_chunk_and_cannot_complete(alice, data, artifact_root,
                                                              django_capture_on_commit_callbacks):
    upload = open_upload(alice, "late", data).json()
    for index in range(4):
        assert put_chunk(alice, upload["id"], index, data).status_code == 200
    age(upload["id"], 30)
    with django_capture_on_commit_callbacks(execute=True):
        refused = alice.post(f"{UPLOADS}{upload['id']}/complete/")
    assert refused.status_code == 410 and "STRATA_UPLOAD_EXPIRY_HOURS" in refused.json()["detail"]
    assert not DataSet.objects.exists() and not DataUpload.objects.exists()
    assert not [path for path in stored(artifact_root) if upload["id"] in path]
    other = open_upload(alice, "later", data).json()
    age(other["id"], 30)
    with django_capture_on_commit_callbacks(execute=True):
        late = put_chunk(alice, other["id"], 1, data)
    assert late.status_code == 410 and "expired" in late.json()["detail"]
    assert not DataUpload.objects.exists()
    assert not [path for path in stored(artifact_root) if other["id"] in path]
    # Opening the same name and contents again starts afresh.
    again = open_upload(alice, "later", data)
    assert again.status_code == 201 and again.json()["id"] != other["id"]
    assert again.json()["expires_at"] > again.json()["created_at"]


def test_a_team_has_at_most_the_limit_of_open_uploads(alice, bob, data, settings):
    settings.STRATA_MAX_OPEN_UPLOADS = 2
    first = open_upload(alice, "one", data)
    assert first.status_code == 201
    assert open_upload(alice, "two", data).status_code == 201
    third = open_upload(alice, "three", data)
    assert third.status_code == 409
    detail = third.json()["detail"]
    assert "STRATA_MAX_OPEN_UPLOADS (2)" in detail and "2 open uploads" in detail and "team alpha" in detail
    # Resuming an open one is no new upload; another team has its own count.
    assert open_upload(alice, "one", data).status_code == 200
    assert open_upload(bob, "three", data).status_code == 201
    # Abandoning one, or its expiry, makes room.
    assert alice.delete(f"{UPLOADS}{first.json()['id']}/").status_code == 204
    assert open_upload(alice, "three", data).status_code == 201
    assert open_upload(alice, "four", data).status_code == 409
    age(DataUpload.objects.get(name="two").pk, 48)
    assert open_upload(alice, "four", data).status_code == 201
    assert set(DataUpload.objects.filter(team__slug="alpha").values_list("name", flat=True)) == {"three", "four"}


def test_a_chunk_arriving_while_its_upload_is_deleted_leaves_nothing(alice, data, artifact_root):
    import io

    from strata.jobs.data import DataRejected, chunk_store

    upload = DataUpload.objects.get(pk=open_upload(alice, "racing", data).json()["id"])
    DataUpload.objects.filter(pk=upload.pk).delete()  # the sweep (or an abandon) won the race
    part = data[:CHUNK]
    with pytest.raises(DataRejected) as refused:
        chunk_store(upload, 0, io.BytesIO(part), sha(part))
    assert refused.value.status == 404 and "start again" in refused.value.errors["detail"]
    assert not [path for path in stored(artifact_root) if (artifact_root / "uploads" / path).is_file()]
