"""Artifact storage: a small interface, with local disk as the default implementation and S3-compatible object
storage (AWS S3, MinIO, SeaweedFS, Ceph RGW) on boto3.

Everything that stores bytes goes through :func:`get_storage`: artifacts, checkpoints, models, code bundles and
uploaded data sets (their chunks, then the whole). Keys are ``/``-separated relative paths (``code/3/<sha>.tar.gz``).
A backend that can hand out presigned URLs says so in :attr:`ArtifactStorage.presigns`; the control plane's
direct-transfer protocol (:mod:`strata.jobs.transfers`) builds on that: nodes and users move the bytes straight to
and from the store, in parts, through URLs the control plane signs per object and part.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import hashlib
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.utils.module_loading import import_string

COPY = 1 << 20
PART_BYTES = 64 << 20  # a direct upload's part (the last one may be smaller)
MAX_PARTS = 10_000  # S3's limit: an object's parts grow with it past 625 GiB
TEMPORARY = ".saving-"  # the local backend's files of a save in progress (renamed into place when whole)


class StorageUnavailable(OSError):
    """The store did not do what was asked (unreachable, refused the credentials, failed): the API answers 503,
    and nothing was stored or deleted half way."""


@dataclass(frozen=True)
class StoredObject:
    """What a listing returns: a key (as given to ``save``) and its size in bytes."""

    key: str
    size: int


class ArtifactStorage(abc.ABC):
    """Stores artifact bytes under opaque keys. ``save`` is atomic per key: a reader sees the whole object or
    nothing (never a part), also when the save fails or the process dies half way.

    ``tests/platform/jobs/test_storage.py`` (``StorageConformance``) checks a backend: run it on yours."""

    #: Whether :meth:`presign_get` works (object stores); the direct-transfer protocol needs it.
    presigns: bool = False

    @abc.abstractmethod
    def save(self, key: str, source: BinaryIO, max_bytes: int) -> tuple[int, str]:
        """Store ``source`` under ``key``; return (size, sha256). Raise ``ValueError`` past ``max_bytes`` (and
        store nothing). Streams: never holds the whole of ``source`` in memory."""

    @abc.abstractmethod
    def open(self, key: str) -> BinaryIO:
        """The bytes under ``key``, as a stream to read (and close). ``FileNotFoundError`` if there are none."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key`` and, as a directory would be, every key under ``key/``. Nothing there is no error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        """Every stored key under ``prefix`` (a directory: ``uploads/3`` lists ``uploads/3/...``), in key order."""

    def check(self) -> None:  # noqa: B027 - optional: nothing to check on local disk
        """Raise :class:`StorageUnavailable` if the store cannot be used now (``strata check --deploy``)."""

    def presign_get(self, key: str, expires_s: int = 3600) -> str:
        """A URL that reads ``key`` (whole or by ``Range``) without credentials until it expires (only where
        :attr:`presigns`)."""
        raise NotImplementedError(f"{type(self).__name__} does not sign URLs")

    # -- direct (multipart) uploads: only where :attr:`presigns` -------------------------------------------------
    #: The largest object a direct upload may store (S3: 5 TiB); 0 where there are no direct uploads.
    max_object_bytes: int = 0

    @staticmethod
    def part_size(size: int) -> int:
        """The part size of a direct upload of ``size`` bytes: 64 MiB, more when that would take over 10,000
        parts."""
        return max(PART_BYTES, -(-size // MAX_PARTS))

    def upload_start(self, key: str, sha256: str) -> str:
        """Begin a multipart upload to ``key`` (the object appears only at :meth:`upload_complete`); return its
        id. ``sha256`` (hex) is kept as the object's metadata."""
        raise NotImplementedError(f"{type(self).__name__} has no direct uploads")

    def upload_part_url(self, key: str, upload_id: str, number: int, md5: str, expires_s: int) -> str:
        """A URL that PUTs part ``number`` (1-based) of the upload without credentials until it expires. It is
        signed with the part's ``Content-MD5`` (base64): the store refuses other bytes, or a PUT without it."""
        raise NotImplementedError(f"{type(self).__name__} has no direct uploads")

    def upload_parts(self, key: str, upload_id: str) -> dict[int, tuple[int, str]]:
        """The parts stored so far: number → (size, ETag). ``FileNotFoundError`` if the upload is gone."""
        raise NotImplementedError(f"{type(self).__name__} has no direct uploads")

    def upload_complete(self, key: str, upload_id: str, parts: dict[int, str]) -> int:
        """Join ``parts`` (number → ETag) into the object ``key``, atomically; return its size."""
        raise NotImplementedError(f"{type(self).__name__} has no direct uploads")

    def upload_abort(self, key: str, upload_id: str) -> None:
        """Drop the upload and its parts (an upload already gone is no error)."""
        raise NotImplementedError(f"{type(self).__name__} has no direct uploads")

    def uploads_started_before(self, when) -> Iterator[tuple[str, str]]:
        """(key, upload id) of every unfinished upload begun before ``when`` (an aware datetime)."""
        return iter(())


class LocalArtifactStorage(ArtifactStorage):
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root or settings.STRATA_ARTIFACT_ROOT)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"artifact key {key!r} escapes the storage root")
        return path

    def save(self, key: str, source: BinaryIO, max_bytes: int) -> tuple[int, str]:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=TEMPORARY, delete=False) as target:
            try:
                while chunk := source.read(1 << 20):
                    size += len(chunk)
                    if size > max_bytes:
                        raise ValueError(f"artifact is larger than the {max_bytes} byte limit")
                    digest.update(chunk)
                    target.write(chunk)
            except BaseException:
                os.unlink(target.name)
                raise
        os.replace(target.name, path)
        return size, digest.hexdigest()

    def open(self, key: str) -> BinaryIO:
        return self._path(key).open("rb")

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        top = self._path(prefix) if prefix.strip("/") else self.root
        if top.is_file():
            yield StoredObject(prefix.strip("/"), top.stat().st_size)
            return
        found = []
        for directory, _, files in os.walk(top):
            for name in files:
                path = Path(directory) / name
                if name.startswith(TEMPORARY):  # a save in progress is not an object yet
                    continue
                try:
                    found.append(StoredObject(path.relative_to(self.root).as_posix(), path.stat().st_size))
                except FileNotFoundError:
                    continue
        yield from sorted(found, key=lambda item: item.key)


# -- S3-compatible object storage ------------------------------------------------------------------------------

_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()
SHA256_METADATA = "sha256"  # x-amz-meta-sha256: the whole object's SHA-256, hex


def new_s3_client(endpoint: str, region: str, access_key: str, secret_key: str, addressing: str, *,
                  attempts: int = 5, timeout_s: float = 10.0):
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint or None, region_name=region or None,
        aws_access_key_id=access_key or None, aws_secret_access_key=secret_key or None,
        config=Config(s3={"addressing_style": addressing}, retries={"mode": "standard", "max_attempts": attempts},
                      max_pool_connections=32, connect_timeout=timeout_s, read_timeout=max(timeout_s, 60.0),
                      request_checksum_calculation="when_required", response_checksum_validation="when_required"))


def s3_client(endpoint: str, region: str, access_key: str, secret_key: str, addressing: str):
    """One boto3 S3 client per configuration, shared by every thread of the process (boto3 clients are
    thread-safe; making one costs tens of milliseconds, too much per request)."""
    config_key = (endpoint, region, access_key, secret_key, addressing)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(config_key)
        if client is None:
            client = _CLIENTS[config_key] = new_s3_client(*config_key)
        return client


@contextlib.contextmanager
def _store_errors(what: str):
    """botocore's errors as :class:`StorageUnavailable` (a missing key is dealt with before: FileNotFoundError)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "") or "error"
        raise StorageUnavailable(f"the object store refused to {what}: {code}") from error
    except BotoCoreError as error:
        raise StorageUnavailable(f"the object store could not {what}: {type(error).__name__}") from error


def _headers(key: str) -> dict[str, str]:
    """What a presigned GET of the object answers with: bytes to save, whatever the name says (never a page a
    browser would render)."""
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in key.rsplit("/", 1)[-1]) or "download"
    # binary/octet-stream (S3's own default): some stores guess a type for application/octet-stream by the name.
    return {"ContentType": "binary/octet-stream", "ContentDisposition": f'attachment; filename="{name}"'}


def _missing(error: Exception) -> bool:
    response = getattr(error, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("NoSuchKey", "404", "NotFound") or status == 404


class S3ObjectReader(io.RawIOBase):
    """A stored object as a seekable stream: reads stream the GET's body; a seek away from where the body is
    starts a ranged GET there on the next read (so ``FileResponse`` can learn the size, and ranges work)."""

    def __init__(self, client, bucket: str, key: str):
        super().__init__()
        self._client, self._bucket, self._key = client, bucket, key
        self._body, self._body_at, self._at = None, 0, 0
        self._open(0)  # FileNotFoundError now, not at the first read
        self.name = key

    def _open(self, at: int) -> None:
        from botocore.exceptions import ClientError

        if self._body is not None:
            self._body.close()
        self._body = None
        with _store_errors("read an object"):
            try:
                extra = {"Range": f"bytes={at}-"} if at else {}
                response = self._client.get_object(Bucket=self._bucket, Key=self._key, **extra)
            except ClientError as error:
                if _missing(error):
                    raise FileNotFoundError(f"no stored object {self._key!r}") from None
                raise
        if not at:
            self.size = int(response["ContentLength"])
            self.sha256 = response.get("Metadata", {}).get(SHA256_METADATA)
        self._body, self._body_at = response["Body"], at

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self.size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer) -> int:
        if self._at >= self.size:
            return 0
        if self._body is None or self._body_at != self._at:
            self._open(self._at)
        with _store_errors("read an object"):
            data = self._body.read(len(buffer))
        buffer[:len(data)] = data
        self._at += len(data)
        self._body_at = self._at
        return len(data)

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None
        super().close()


class S3ArtifactStorage(ArtifactStorage):
    """Objects in an S3-compatible bucket (``STRATA_S3_*``), each under ``STRATA_S3_PREFIX`` + key.

    A save is atomic: a single PUT, or a multipart upload that only becomes the object when it completes (aborted
    on a failure; a bucket lifecycle rule cleans up what a dead process left). The object's
    SHA-256 is stored as its ``sha256`` metadata. S3 takes metadata when an upload starts, so the digest is known
    first: a seekable source is read twice (a hashing pass, then the upload); another one is spooled to a temporary
    file on the way. Memory stays at ``parts_in_flight`` parts whatever the size."""

    presigns = True
    part_bytes = 8 << 20  # the smallest part (S3's minimum is 5 MiB), and the largest single PUT
    parts_in_flight = 4

    def __init__(self, bucket: str | None = None, prefix: str | None = None, *, endpoint: str | None = None,
                 region: str | None = None, access_key: str | None = None, secret_key: str | None = None,
                 addressing: str | None = None):
        def pick(value, name):
            return getattr(settings, name, "") if value is None else value

        self.bucket = pick(bucket, "STRATA_S3_BUCKET")
        if not self.bucket:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured("S3ArtifactStorage needs STRATA_S3_BUCKET")
        self.prefix = pick(prefix, "STRATA_S3_PREFIX").lstrip("/")
        if self.prefix and not self.prefix.endswith("/"):
            self.prefix += "/"
        self._config = (pick(endpoint, "STRATA_S3_ENDPOINT"), pick(region, "STRATA_S3_REGION"),
                        pick(access_key, "STRATA_S3_ACCESS_KEY_ID"), pick(secret_key, "STRATA_S3_SECRET_ACCESS_KEY"),
                        pick(addressing, "STRATA_S3_ADDRESSING") or "path")
        self.client = s3_client(*self._config)

    def _key(self, key: str) -> str:
        parts = key.strip("/").split("/")
        if not key.strip("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"artifact key {key!r} is not a clean relative path")
        return self.prefix + "/".join(parts)

    def _part_size(self, size: int) -> int:
        # S3 allows 10,000 parts: a part grows with the object (an 80 GB checkpoint: 9 MiB parts; 5 TiB: 580 MiB).
        return max(self.part_bytes, -(-size // 9000))

    def save(self, key: str, source: BinaryIO, max_bytes: int) -> tuple[int, str]:
        name = self._key(key)
        seekable = getattr(source, "seekable", lambda: False)()
        with tempfile.TemporaryFile() if not seekable else contextlib.nullcontext() as spool:
            start = source.tell() if seekable else 0
            digest, size = hashlib.sha256(), 0
            while chunk := source.read(COPY):
                size += len(chunk)
                if size > max_bytes:
                    raise ValueError(f"artifact is larger than the {max_bytes} byte limit")
                digest.update(chunk)
                if spool is not None:
                    spool.write(chunk)
            body = spool if spool is not None else source
            body.seek(start if spool is None else 0)
            sha = digest.hexdigest()
            with _store_errors("store an object"):
                self._upload(name, body, size, {SHA256_METADATA: sha})
        return size, sha

    def _upload(self, name: str, body: BinaryIO, size: int, metadata: dict[str, str]) -> None:
        """``size`` bytes of ``body`` to ``name``: one PUT up to a part's size, else a multipart upload with a few
        parts in flight at once (the memory it holds), aborted on any failure so no part is left behind."""
        part = self._part_size(size)

        def exactly(n: int) -> bytes:
            data = body.read(n)
            if len(data) != n:
                raise ValueError(f"the artifact's source ended {n - len(data)} bytes short of what was hashed")
            return data

        if size <= part:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=exactly(size), Metadata=metadata,
                                   **_headers(name))
            return
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=name, Metadata=metadata,
                                                     **_headers(name))["UploadId"]
        try:
            done: dict[int, str] = {}
            in_flight: set = set()

            def send(number: int, data: bytes) -> None:
                reply = self.client.upload_part(Bucket=self.bucket, Key=name, UploadId=upload, PartNumber=number,
                                                Body=data)
                done[number] = reply["ETag"]

            with concurrent.futures.ThreadPoolExecutor(self.parts_in_flight) as pool:
                for number, offset in enumerate(range(0, size, part), start=1):
                    if len(in_flight) >= self.parts_in_flight:
                        finished, in_flight = concurrent.futures.wait(
                            in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
                        for future in finished:
                            future.result()
                    in_flight.add(pool.submit(send, number, exactly(min(part, size - offset))))
                for future in concurrent.futures.as_completed(in_flight):
                    future.result()
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=name, UploadId=upload,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": done[n]} for n in sorted(done)]})
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=name, UploadId=upload)
            raise

    def open(self, key: str) -> BinaryIO:
        return S3ObjectReader(self.client, self.bucket, self._key(key))

    def stat(self, key: str) -> tuple[int, str | None]:
        """(size, sha256) of a stored object; ``FileNotFoundError`` if there is none."""
        from botocore.exceptions import ClientError

        with _store_errors("describe an object"):
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as error:
                if _missing(error):
                    raise FileNotFoundError(f"no stored object {key!r}") from None
                raise
        return int(head["ContentLength"]), head.get("Metadata", {}).get(SHA256_METADATA)

    def _names(self, prefix: str) -> Iterator[tuple[str, int]]:
        paginator = self.client.get_paginator("list_objects_v2")
        with _store_errors("list objects"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    yield item["Key"], int(item["Size"])

    def delete(self, key: str) -> None:
        with _store_errors("delete an object"):
            self._delete(self._key(key))

    def _delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=name)
        batch: list[dict] = []
        for found, _ in self._names(name + "/"):
            batch.append({"Key": found})
            if len(batch) == 1000:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
                batch = []
        if batch:
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        if prefix.strip("/"):
            name = self._key(prefix)
            found = list(self._names(name + "/"))
            try:
                size, _ = self.stat(prefix)
                found.append((name, size))
            except FileNotFoundError:
                pass
        else:
            found = list(self._names(self.prefix))
        for name, size in sorted(found):
            yield StoredObject(name[len(self.prefix):], size)

    def check(self, timeout_s: float = 2.0) -> None:
        """One HEAD of the bucket with these credentials, without retries."""
        quick = new_s3_client(*self._config, attempts=1, timeout_s=timeout_s)
        with _store_errors(f"answer for bucket {self.bucket}"):
            quick.head_bucket(Bucket=self.bucket)

    def presign_get(self, key: str, expires_s: int = 3600) -> str:
        # Every object is stored as an attachment of type application/octet-stream (``_headers``): no
        # response-* overrides, which some S3-compatible stores (SeaweedFS) do not sign alike.
        return self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": self._key(key)},
                                                  ExpiresIn=int(expires_s))

    # -- direct uploads: S3's multipart upload, each part PUT to a presigned URL ---------------------------------
    max_object_bytes = 5 << 40

    def upload_start(self, key: str, sha256: str) -> str:
        with _store_errors("begin an upload"):
            answer = self.client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key),
                                                         Metadata={SHA256_METADATA: sha256}, **_headers(key))
        return str(answer["UploadId"])

    def upload_part_url(self, key: str, upload_id: str, number: int, md5: str, expires_s: int) -> str:
        return self.client.generate_presigned_url(
            "upload_part", ExpiresIn=int(expires_s),
            Params={"Bucket": self.bucket, "Key": self._key(key), "UploadId": upload_id, "PartNumber": int(number),
                    "ContentMD5": md5})

    def upload_parts(self, key: str, upload_id: str) -> dict[int, tuple[int, str]]:
        from botocore.exceptions import ClientError

        found: dict[int, tuple[int, str]] = {}
        paginator = self.client.get_paginator("list_parts")
        with _store_errors("list an upload's parts"):
            try:
                for page in paginator.paginate(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id):
                    for part in page.get("Parts", ()):
                        found[int(part["PartNumber"])] = (int(part["Size"]), str(part["ETag"]))
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") in ("NoSuchUpload", "NoSuchKey", "404"):
                    raise FileNotFoundError(f"no upload {upload_id!r} of {key!r}") from None
                raise
        return found

    def upload_complete(self, key: str, upload_id: str, parts: dict[int, str]) -> int:
        with _store_errors("complete an upload"):
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=self._key(key), UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": parts[n]} for n in sorted(parts)]})
        return self.stat(key)[0]

    def upload_abort(self, key: str, upload_id: str) -> None:
        from botocore.exceptions import ClientError

        with _store_errors("abort an upload"):
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") not in ("NoSuchUpload", "NoSuchKey", "404"):
                    raise

    def uploads_started_before(self, when) -> Iterator[tuple[str, str]]:
        paginator = self.client.get_paginator("list_multipart_uploads")
        with _store_errors("list unfinished uploads"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for upload in page.get("Uploads", ()):
                    if upload["Initiated"] < when:
                        yield upload["Key"][len(self.prefix):], str(upload["UploadId"])


def get_storage() -> ArtifactStorage:
    return import_string(settings.STRATA_ARTIFACT_STORAGE)()


# -- where to read an object: the base of direct transfers (strata.jobs.transfers) --------------------------------

def direct() -> bool:
    """Whether bytes move directly between nodes or users and the store (an object store that signs URLs, and
    ``STRATA_DIRECT_TRANSFERS`` not turned off)."""
    return settings.STRATA_DIRECT_TRANSFERS and get_storage().presigns


def download_link(key: str, size: int, sha256: str | None) -> dict:
    """Where to read a stored object: a presigned URL (``url``) with its size and SHA-256, or ``url: None`` where
    the bytes come through the control plane's own route (local disk, or an object under
    ``STRATA_DIRECT_MIN_BYTES``)."""
    if not direct() or size < settings.STRATA_DIRECT_MIN_BYTES:
        return {"url": None, "size": size, "sha256": sha256}
    url = get_storage().presign_get(key, settings.STRATA_PRESIGN_EXPIRY_S)
    return {"url": url, "size": size, "sha256": sha256, "expires_s": settings.STRATA_PRESIGN_EXPIRY_S}
