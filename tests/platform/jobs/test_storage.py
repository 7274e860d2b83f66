"""The artifact storage conformance suite (``strata.jobs.storage.ArtifactStorage``), run on every backend: local
disk, and S3 against a real SeaweedFS (tests/seaweedfs.py). A new backend gets a subclass of
:class:`StorageConformance` with a ``storage`` fixture.

It checks: a save returns the size and SHA-256 and reads back whole; a save is atomic (a failed one leaves
nothing, and the previous object is kept whole); over the limit stores nothing; a missing key raises
``FileNotFoundError``; delete (an object, a "directory" of them, nothing at all); listing by prefix; and a large
save (96 MiB, generated on the fly, never whole in memory) streams in and out.
"""

from __future__ import annotations

import hashlib
import io
import threading
import tracemalloc
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from strata.jobs.storage import (
    ArtifactStorage,
    LocalArtifactStorage,
    S3ArtifactStorage,
    StorageUnavailable,
    StoredObject,
)

MiB = 1 << 20


class Generated(io.RawIOBase):
    """``size`` bytes made on the fly (a counter pattern), never held whole; optionally failing at ``fail_at``."""

    def __init__(self, size: int, fail_at: int | None = None):
        super().__init__()
        self.size, self.at, self.fail_at = size, 0, fail_at
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.fail_at is not None and self.at >= self.fail_at:
            raise OSError("the client went away")
        n = min(len(buffer), self.size - self.at, MiB)
        if n <= 0:
            return 0
        block = (self.at // MiB).to_bytes(8, "big") * (MiB // 8)
        data = block[self.at % MiB:][:n]
        n = len(data)
        buffer[:n] = data
        self.digest.update(data)
        self.at += n
        return n


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read(storage: ArtifactStorage, key: str) -> bytes:
    with storage.open(key) as stream:
        return stream.read()


class StorageConformance:
    """Subclass with a ``storage`` fixture returning a fresh, empty :class:`ArtifactStorage`."""

    def test_save_returns_size_and_sha256_and_reads_back(self, storage):
        data = b"weights" * 1000
        assert storage.save("1/checkpoint/step-1", io.BytesIO(data), len(data)) == (len(data), sha(data))
        assert read(storage, "1/checkpoint/step-1") == data
        assert storage.save("1/artifact/empty", io.BytesIO(b""), 10) == (0, sha(b""))
        assert read(storage, "1/artifact/empty") == b""

    def test_a_non_seekable_source_is_stored_whole(self, storage):
        source = Generated(3 * MiB + 17)
        size, digest = storage.save("2/model/m.bin", source, 4 * MiB)
        assert (size, digest) == (3 * MiB + 17, source.digest.hexdigest())
        with storage.open("2/model/m.bin") as stream:
            assert hashlib.sha256(stream.read()).hexdigest() == digest

    def test_save_is_atomic(self, storage):
        old = b"the whole old checkpoint"
        storage.save("3/checkpoint/latest", io.BytesIO(old), 1 << 30)
        with pytest.raises(OSError):
            storage.save("3/checkpoint/latest", Generated(40 * MiB, fail_at=35 * MiB), 1 << 30)
        with pytest.raises(OSError):
            storage.save("3/checkpoint/other", Generated(2 * MiB, fail_at=MiB), 1 << 30)
        assert read(storage, "3/checkpoint/latest") == old
        with pytest.raises(FileNotFoundError):
            storage.open("3/checkpoint/other")
        assert [item.key for item in storage.list("3")] == ["3/checkpoint/latest"]

    def test_a_save_past_the_limit_stores_nothing(self, storage):
        with pytest.raises(ValueError, match="limit"):
            storage.save("4/artifact/big", io.BytesIO(b"x" * 1001), 1000)
        with pytest.raises(FileNotFoundError):
            storage.open("4/artifact/big")
        assert list(storage.list("4")) == []

    def test_a_missing_key_raises_file_not_found(self, storage):
        with pytest.raises(FileNotFoundError):
            storage.open("5/artifact/never-stored")

    def test_delete_an_object_a_directory_and_nothing(self, storage):
        for key in ("6/a", "uploads/6/9/0", "uploads/6/9/1", "uploads/6/10/0"):
            storage.save(key, io.BytesIO(key.encode()), 100)
        storage.delete("6/a")
        with pytest.raises(FileNotFoundError):
            storage.open("6/a")
        storage.delete("uploads/6/9")  # an upload's chunks, as data.upload_abort drops them
        assert [item.key for item in storage.list("uploads/6")] == ["uploads/6/10/0"]
        storage.delete("6/a")
        storage.delete("never/stored")

    def test_listing_by_prefix(self, storage):
        for key, data in (("7/checkpoint/a", b"1"), ("7/checkpoint/b", b"22"), ("7/artifact/c", b"333"),
                          ("70/artifact/d", b"4444")):
            storage.save(key, io.BytesIO(data), 100)
        assert list(storage.list("7/checkpoint")) == [StoredObject("7/checkpoint/a", 1),
                                                      StoredObject("7/checkpoint/b", 2)]
        assert [item.key for item in storage.list("7")] == ["7/artifact/c", "7/checkpoint/a", "7/checkpoint/b"]
        assert list(storage.list("7/artifact/c")) == [StoredObject("7/artifact/c", 3)]
        assert list(storage.list("8")) == []
        assert {item.key for item in storage.list()} >= {"7/artifact/c", "70/artifact/d"}

    def test_keys_cannot_escape(self, storage):
        with pytest.raises(ValueError):
            storage.save("../outside", io.BytesIO(b"x"), 10)

    def test_a_large_save_streams_in_and_out(self, storage, tmp_path):
        size = 96 * MiB + 5
        source = Generated(size)
        tracemalloc.start()
        try:
            assert storage.save("9/checkpoint/large", source, size) == (size, source.digest.hexdigest())
            digest, total = hashlib.sha256(), 0
            with storage.open("9/checkpoint/large") as stream:
                while data := stream.read(MiB):
                    digest.update(data)
                    total += len(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert (total, digest.hexdigest()) == (size, source.digest.hexdigest())
        assert list(storage.list("9")) == [StoredObject("9/checkpoint/large", size)]
        assert peak < size // 2, f"a {size} byte save and read held {peak} bytes at once"
        # A seekable source (a spooled upload on disk) is read as it is, not copied.
        path = tmp_path / "seekable.bin"
        with path.open("wb") as out:
            out.truncate(40 * MiB)
        with path.open("rb") as seekable:
            assert storage.save("9/checkpoint/sparse", seekable, 40 * MiB) == (
                40 * MiB, hashlib.sha256(bytes(40 * MiB)).hexdigest())

    def test_concurrent_saves_of_one_key_leave_one_whole_object(self, storage):
        versions = [bytes([n]) * (2 * MiB) for n in range(4)]
        threads = [threading.Thread(target=storage.save, args=("10/checkpoint/race", io.BytesIO(v), 4 * MiB))
                   for v in versions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert read(storage, "10/checkpoint/race") in versions

    def test_the_stream_seeks(self, storage):
        data = bytes(range(256)) * 4096
        storage.save("11/artifact/seek", io.BytesIO(data), len(data))
        with storage.open("11/artifact/seek") as stream:
            stream.seek(0, io.SEEK_END)
            assert stream.tell() == len(data)
            stream.seek(1000)
            assert stream.read(10) == data[1000:1010]
            stream.seek(0)
            assert stream.read() == data


    def test_the_presigned_protocol_or_none(self, storage):
        """A backend that signs URLs runs the direct-upload protocol (strata.jobs.transfers) whole: parts PUT
        without credentials to signed URLs, listed, joined into one object that appears only then; an abort
        leaves nothing. One that does not sign says so."""
        if not storage.presigns:
            with pytest.raises(NotImplementedError):
                storage.upload_start("30/checkpoint/c", "0" * 64)
            assert list(storage.uploads_started_before(datetime.now(UTC))) == []
            return
        import base64

        import requests

        first, last = b"a" * (5 << 20), b"tail"
        upload = storage.upload_start("30/checkpoint/c", hashlib.sha256(first + last).hexdigest())
        for number, data in ((2, last), (1, first)):
            md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
            url = storage.upload_part_url("30/checkpoint/c", upload, number, md5, 60)
            assert requests.put(url, data=data, headers={"Content-MD5": md5}, timeout=30).status_code == 200
        parts = storage.upload_parts("30/checkpoint/c", upload)
        assert {n: size for n, (size, _) in parts.items()} == {1: len(first), 2: len(last)}
        assert [key for key, _ in storage.uploads_started_before(datetime.now(UTC) + timedelta(minutes=5))] \
            == ["30/checkpoint/c"]
        assert [item.key for item in storage.list("30")] == []  # nothing until it completes
        size = storage.upload_complete("30/checkpoint/c", upload, {n: etag for n, (_, etag) in parts.items()})
        assert size == len(first + last)
        with storage.open("30/checkpoint/c") as stream:
            assert stream.read() == first + last
        ranged = requests.get(storage.presign_get("30/checkpoint/c", 60), headers={"Range": "bytes=5242878-5242881"},
                              timeout=30)
        assert ranged.status_code == 206 and ranged.content == (first + last)[5242878:5242882]
        dropped = storage.upload_start("31/checkpoint/c", "0" * 64)
        storage.upload_abort("31/checkpoint/c", dropped)
        storage.upload_abort("31/checkpoint/c", dropped)  # twice: no error
        with pytest.raises(FileNotFoundError):
            storage.upload_parts("31/checkpoint/c", dropped)
        assert [item.key for item in storage.list("31")] == []


class TestLocalStorage(StorageConformance):
    @pytest.fixture
    def storage(self, tmp_path):
        return LocalArtifactStorage(tmp_path / "artifacts")


class TestS3Storage(StorageConformance):
    @pytest.fixture
    def storage(self, s3_storage):
        return S3ArtifactStorage()

    def test_the_object_carries_its_sha256_and_size(self, storage):
        data = b"checkpoint bytes"
        storage.save("20/checkpoint/x", io.BytesIO(data), 100)
        assert storage.stat("20/checkpoint/x") == (len(data), sha(data))
        with pytest.raises(FileNotFoundError):
            storage.stat("20/checkpoint/missing")

    def test_keys_live_under_the_prefix(self, storage, seaweedfs):
        storage.save("21/a", io.BytesIO(b"a"), 10)
        names = [item["Key"] for item in seaweedfs.client().list_objects_v2(
            Bucket=seaweedfs.bucket, Prefix=storage.prefix).get("Contents", [])]
        assert names == [storage.prefix + "21/a"] and storage.prefix.startswith("tests/")

    def test_a_presigned_get_reads_without_credentials(self, storage):
        assert storage.presigns and not LocalArtifactStorage.presigns
        storage.save("22/model/m", io.BytesIO(b"signed"), 10)
        with urllib.request.urlopen(storage.presign_get("22/model/m", 60), timeout=10) as response:
            assert response.read() == b"signed"

    def test_wrong_credentials_are_refused(self, seaweedfs):
        wrong = S3ArtifactStorage(endpoint=seaweedfs.endpoint, bucket=seaweedfs.bucket, prefix="x/",
                                  access_key=seaweedfs.access_key, secret_key="not-the-secret")
        with pytest.raises(StorageUnavailable, match="refused to store an object: (InvalidAccessKeyId|SignatureDoesNotMatch)"):
            wrong.save("a", io.BytesIO(b"a"), 10)


def test_a_store_restart_loses_nothing_and_a_save_while_it_is_down_leaves_nothing(tmp_path):
    """A store of its own (not the session's), stopped and started again on its directory and ports: what was
    stored is there, a save while it was down failed whole, and the process's pooled client carries on."""
    import seaweedfs as weed
    home = tmp_path / "weed"
    data = bytes(range(256)) * 50_000  # 12.5 MiB: a multipart object
    with weed.started(home) as store:
        storage = S3ArtifactStorage(endpoint=store.endpoint, bucket=store.bucket, prefix="restart/",
                                    access_key=store.access_key, secret_key=store.secret_key, region=store.region)
        storage.save("1/checkpoint/a", io.BytesIO(data), len(data))
        ports = store.ports
    with pytest.raises(StorageUnavailable, match="could not store"):
        storage.save("1/checkpoint/b", io.BytesIO(data), len(data))
    with pytest.raises(StorageUnavailable):
        storage.open("1/checkpoint/a")
    with weed.started(home, ports):
        assert read(storage, "1/checkpoint/a") == data
        with pytest.raises(FileNotFoundError):
            storage.open("1/checkpoint/b")
        storage.save("1/checkpoint/b", io.BytesIO(b"after"), 10)
        assert [item.key for item in storage.list("1")] == ["1/checkpoint/a", "1/checkpoint/b"]
