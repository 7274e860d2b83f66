"""Data sets: a team's files or directories, uploaded in checked chunks and mounted read-only into jobs.

An upload is chunked and resumable: :func:`upload_open` starts one (or finds the team's open upload of the same
name and contents, so an interrupted client sends only the chunks still missing), :func:`chunk_store` keeps one
chunk after checking its SHA-256, and :func:`upload_complete` assembles the chunks, verifies the SHA-256 of the
whole, checks a directory's archive entry by entry (``components.runtime.shared.bundles``: no absolute paths, ``..``,
links or devices; within ``STRATA_MAX_DATA_BYTES`` unpacked) and creates the :class:`DataSet`.

Jobs mount data sets by name (``spec.data.mount: {alias: name}``, the core's data option in
``components.runtime.contract.data``); the name is resolved at submit to the data set's digest (:func:`data_lookup`) and
the job is linked to it (:func:`data_link`), so a data set is not deleted while an unfinished job mounts it.

Bytes go through the artifact storage behind the functions of :class:`DataBytes`. With an object store that signs
URLs (``strata.jobs.storage.direct``) an upload of ``STRATA_DIRECT_MIN_BYTES`` or more is *direct*: it is a
multipart upload to the data set's own key, chunk ``n`` being part ``n + 1``; the client asks
:func:`direct_parts` for a presigned PUT URL per chunk (signed with the chunk's ``Content-MD5``: the store refuses
other bytes) and sends the chunks to the store, and :func:`upload_complete` has the store join them, then reads the
object once (never writing it) to verify its SHA-256 and check a directory's archive, as for an upload through
the control plane.

Uploads are bounded: a team has at most ``STRATA_MAX_OPEN_UPLOADS`` open at once (one more is a 409 naming the
limit), and an upload not completed within ``STRATA_UPLOAD_EXPIRY_HOURS`` of its start is abandoned: the beat's
:func:`uploads_expire` deletes it with the chunks it received, and a chunk or a ``complete`` for it is refused.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import tempfile
from datetime import datetime, timedelta
from typing import Any, BinaryIO

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from components.runtime.contract.data import DATA_NAME, data_sets_of
from components.runtime.shared import bundles
from strata.jobs.models import TERMINAL_STATES, DataSet, DataUpload, Job
from strata.jobs.storage import direct, get_storage
from strata.jobs.transfers import content_md5

log = logging.getLogger(__name__)
MAX_DATA_FILES = 1_000_000
MIN_CHUNK_BYTES = 1024
SHA256 = re.compile(r"^[0-9a-f]{64}$")
COPY = 1 << 20
STORE_MIN_PART = 5 << 20  # S3's smallest part (but the last): a direct upload's chunks are at least this
MAX_STORE_PARTS = 10_000  # S3's most parts in one upload


class DataRejected(ValueError):
    """A request about data sets that cannot be done: ``errors`` names each field; ``status`` is the answer's."""

    def __init__(self, errors: dict[str, str], status: int = 400):
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors
        self.status = status


class DataBytes:
    """Where a data set's bytes and an upload's chunks are kept: the artifact storage, for now."""

    @staticmethod
    def save(key: str, source: BinaryIO, max_bytes: int) -> tuple[int, str]:
        return get_storage().save(key, source, max_bytes)

    @staticmethod
    def open(key: str) -> BinaryIO:
        return get_storage().open(key)

    @staticmethod
    def delete(key: str) -> None:
        get_storage().delete(key)

    @staticmethod
    def direct(size: int) -> bool:
        """Whether an upload of ``size`` bytes goes straight to the object store."""
        return direct() and size >= settings.STRATA_DIRECT_MIN_BYTES


def _storage_admission(team_id: int, extra_bytes: int, *, replaces: int = 0) -> None:
    from strata.jobs.services import storage_admission  # services imports this module

    storage_admission(team_id, extra_bytes, replaces=replaces)


def chunk_key(upload: DataUpload, index: int) -> str:
    return f"uploads/{upload.team_id}/{upload.pk}/{index}"


def upload_prefix(upload: DataUpload) -> str:
    """The key under which an upload's chunks are kept (a directory in the local artifact storage)."""
    return f"uploads/{upload.team_id}/{upload.pk}"


def data_key(team_id: int, upload: DataUpload) -> str:
    return f"data/{team_id}/{upload.pk}"


def _sha(value: Any) -> str | None:
    text = str(value or "").strip().lower().removeprefix("sha256:")
    return text if SHA256.match(text) else None


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def upload_fields(body: Any) -> dict[str, Any]:
    """The checked fields of ``POST /api/v1/uploads/``; raises :class:`DataRejected` naming every bad one."""
    if not isinstance(body, dict):
        raise DataRejected({"non_field_errors": "the body must be a JSON object"})
    errors: dict[str, str] = {}
    allowed = {"name", "size", "sha256", "chunk_size", "format", "file", "team"}
    for key in body:
        if key not in allowed:
            errors[str(key)[:64]] = f"unknown field; allowed: {', '.join(sorted(allowed))}"
    name = body.get("name")
    if not isinstance(name, str) or not DATA_NAME.match(name):
        errors["name"] = "required: 1 to 64 lower case letters, digits, '.', '_' or '-', starting with a letter or digit"
    limit = settings.STRATA_MAX_DATA_BYTES
    size = _integer(body.get("size"))
    if size is None or size < 1:
        errors["size"] = "required: the number of bytes uploaded (at least 1)"
    elif size > limit:
        errors["size"] = (f"{bundles.human_size(size)} is over the {bundles.human_size(limit)} limit for a data set "
                          "(STRATA_MAX_DATA_BYTES)")
    sha = _sha(body.get("sha256"))
    if sha is None:
        errors["sha256"] = "required: the SHA-256 of the whole upload (64 hex digits)"
    most = settings.STRATA_MAX_DATA_CHUNK_BYTES
    chunk_size = _integer(body.get("chunk_size"))
    if chunk_size is None or not MIN_CHUNK_BYTES <= chunk_size <= most:
        errors["chunk_size"] = f"required: bytes per chunk, from {MIN_CHUNK_BYTES} to {most}"
    fmt = body.get("format", DataSet.Format.ARCHIVE)
    file_name = body.get("file") or ""
    if fmt not in DataSet.Format.values:
        errors["format"] = "must be archive (a directory as a tar.gz: strata data upload packs one) or file"
    elif fmt == DataSet.Format.FILE:
        if not isinstance(file_name, str) or not file_name or "/" in file_name or "\\" in file_name \
                or file_name in (".", "..") or "\x00" in file_name or len(file_name.encode()) > 255:
            errors["file"] = "required with format file: the file's name (no directories)"
    elif file_name:
        errors["file"] = "only with format file"
    if errors:
        raise DataRejected(errors)
    return {"name": name, "size": size, "sha256": sha, "chunk_size": chunk_size, "format": fmt,
            "file_name": file_name if fmt == DataSet.Format.FILE else ""}


def upload_deadline(upload: DataUpload) -> datetime:
    """When ``upload`` expires if it is not completed by then (``STRATA_UPLOAD_EXPIRY_HOURS`` after it started)."""
    return upload.created_at + timedelta(hours=settings.STRATA_UPLOAD_EXPIRY_HOURS)


def _expired(upload: DataUpload) -> DataRejected:
    """Forget an upload past its deadline and say so (410)."""
    upload_abort(upload)
    hours = f"{settings.STRATA_UPLOAD_EXPIRY_HOURS:g}"
    return DataRejected({"detail": f"upload {upload.pk} of {upload.name} expired: it was not completed within {hours} "
                                   "h of its start (STRATA_UPLOAD_EXPIRY_HOURS), and its chunks were dropped; start "
                                   "again"}, status=410)


def uploads_expire(now: datetime | None = None, team=None) -> int:
    """Delete every upload (of ``team``, or of all teams) not completed within ``STRATA_UPLOAD_EXPIRY_HOURS`` of
    its start, with the chunks it received (their bytes in the artifact storage go once the deletion commits).
    Returns how many. Run by the beat (``strata.scheduling.expire_uploads``), and for a team when it opens one."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.STRATA_UPLOAD_EXPIRY_HOURS)
    stale = DataUpload.objects.filter(created_at__lt=cutoff)
    if team is not None:
        stale = stale.filter(team=team)
    count = 0
    for pk in list(stale.values_list("pk", flat=True)[:10_000]):
        with transaction.atomic():
            upload = DataUpload.objects.select_for_update().filter(pk=pk, created_at__lt=cutoff).first()
            if upload is None:  # completed or abandoned meanwhile
                continue
            upload_abort(upload)
        count += 1
    if count:
        log.info("expired %d data upload(s) not completed within %g h", count, settings.STRATA_UPLOAD_EXPIRY_HOURS)
    return count


def upload_open(*, team, user, fields: dict[str, Any]) -> tuple[DataUpload, bool]:
    """The team's open upload of the same name and contents (a client resuming), or a new one. Returns (upload,
    created). A name the team already has is a 409 naming ``name``; a new upload past the team's
    ``STRATA_MAX_OPEN_UPLOADS`` open ones is a 409 naming the limit (expired ones are dropped first)."""
    from strata.accounts.models import Team

    if DataSet.objects.filter(team=team, name=fields["name"]).exists():
        raise DataRejected({"name": f"team {team.slug} already has a data set named {fields['name']} (delete it "
                                    "first, or choose another name)"}, status=409)
    uploads_expire(team=team)
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()  # one opening at a time per team: the count holds
        existing = DataUpload.objects.filter(team=team, **fields).order_by("-created_at").first()
        if existing is not None:
            return (direct_sync(existing) if existing.store_upload else existing), False
        _storage_admission(team.pk, fields["size"])  # the whole data set must fit the team's storage quota
        limit = settings.STRATA_MAX_OPEN_UPLOADS
        count = DataUpload.objects.filter(team=team).count()
        if count >= limit:
            hours = f"{settings.STRATA_UPLOAD_EXPIRY_HOURS:g}"
            raise DataRejected({"detail": f"team {team.slug} has {count} open uploads, the most "
                                          f"STRATA_MAX_OPEN_UPLOADS ({limit}) allows: complete or abandon one first "
                                          "(GET /api/v1/uploads/ lists them, DELETE /api/v1/uploads/{id}/ abandons "
                                          f"one), or wait: an upload not completed within {hours} h expires"},
                               status=409)
        upload = DataUpload(team=team, owner=user, **fields)
        if DataBytes.direct(upload.size):
            if upload.chunk_count > MAX_STORE_PARTS:
                raise DataRejected({"chunk_size": f"{upload.chunk_count} chunks: a direct upload to the object store "
                                                  f"has at most {MAX_STORE_PARTS} (S3's limit); choose chunks of at "
                                                  f"least {bundles.human_size(-(-upload.size // MAX_STORE_PARTS))}"})
            if upload.chunk_count > 1 and upload.chunk_size < STORE_MIN_PART:
                raise DataRejected({"chunk_size": f"a direct upload to the object store needs chunks of at least "
                                                  f"{bundles.human_size(STORE_MIN_PART)} (S3's smallest part)"})
            upload.store_upload = get_storage().upload_start(data_key(team.pk, upload), upload.sha256)
        upload.save(force_insert=True)
        return upload, True


def chunk_length(upload: DataUpload, index: int) -> int:
    """How many bytes chunk ``index`` has (the last one may be shorter)."""
    return min(upload.chunk_size, upload.size - index * upload.chunk_size)


def chunk_store(upload: DataUpload, index: int, source: BinaryIO, checksum: Any) -> DataUpload:
    """Check chunk ``index`` (its length, its SHA-256 against ``checksum``) and keep it; a bad chunk is a 400
    naming it, and nothing of it is kept. Sending a chunk again replaces it."""
    if timezone.now() >= upload_deadline(upload):
        raise _expired(upload)
    if upload.store_upload:
        raise DataRejected({"detail": f"upload {upload.pk} is direct: its chunks go to the object store (POST "
                                      f"/api/v1/uploads/{upload.pk}/parts/ signs a URL per chunk)"}, status=409)
    count = upload.chunk_count
    if not 0 <= index < count:
        raise DataRejected({"chunk": f"chunk {index}: no such chunk (this upload has chunks 0 to {count - 1})"})
    expected = _sha(checksum)
    if expected is None:
        raise DataRejected({"Content-SHA256": f"chunk {index}: required, the SHA-256 of the chunk (64 hex digits)"})
    length = chunk_length(upload, index)
    _storage_admission(upload.team_id, length, replaces=length if str(index) in upload.received else 0)
    digest, size = hashlib.sha256(), 0
    with tempfile.TemporaryFile() as spooled:
        while data := source.read(COPY):
            size += len(data)
            if size > length:
                break
            digest.update(data)
            spooled.write(data)
        if size != length:
            raise DataRejected({"chunk": f"chunk {index}: {'more than' if size > length else 'only'} "
                                         f"{min(size, length)} bytes, where it must hold {length}"})
        if digest.hexdigest() != expected:
            raise DataRejected({"chunk": f"chunk {index}: its SHA-256 is {digest.hexdigest()}, not {expected} "
                                         "(damaged on the way: send it again)"})
        spooled.seek(0)
        DataBytes.save(chunk_key(upload, index), spooled, length)
    with transaction.atomic():
        found = DataUpload.objects.select_for_update().filter(pk=upload.pk).first()
        if found is not None:
            found.received = {**found.received, str(index): expected}
            found.updated_at = timezone.now()
            found.save(update_fields=["received", "updated_at"])
    if found is None:  # expired or abandoned while the chunk arrived: nothing of it is kept
        DataBytes.delete(chunk_key(upload, index))
        raise DataRejected({"detail": f"upload {upload.pk} is gone (abandoned, or expired: not completed within "
                                      f"{settings.STRATA_UPLOAD_EXPIRY_HOURS:g} h); start again"}, status=404)
    return found


def missing_chunks(upload: DataUpload) -> list[int]:
    return [index for index in range(upload.chunk_count) if str(index) not in upload.received]


def upload_abort(upload: DataUpload) -> None:
    """Forget an upload and its chunks (each chunk received, then what is left under its key: a chunk stored while
    the upload was being forgotten)."""
    if upload.store_upload:
        key, store_upload = data_key(upload.team_id, upload), upload.store_upload
        upload.delete()
        transaction.on_commit(lambda: get_storage().upload_abort(key, store_upload))
        return
    keys = [chunk_key(upload, int(index)) for index in upload.received] + [upload_prefix(upload)]
    upload.delete()
    transaction.on_commit(lambda: [DataBytes.delete(key) for key in keys])


def _gone(upload: DataUpload) -> DataRejected:
    return DataRejected({"detail": f"upload {upload.pk} of {upload.name} is gone (abandoned, or expired: not "
                                   f"completed within {settings.STRATA_UPLOAD_EXPIRY_HOURS:g} h); start again"},
                        status=410)


def _store_parts(upload: DataUpload) -> dict[int, tuple[int, str]]:
    """The chunks of a direct upload the store holds: {index: (bytes, ETag)}."""
    try:
        parts = get_storage().upload_parts(data_key(upload.team_id, upload), upload.store_upload)
    except FileNotFoundError:
        raise _gone(upload) from None
    return {number - 1: part for number, part in parts.items()}


def direct_sync(upload: DataUpload) -> DataUpload:
    """Bring a direct upload's ``received`` up to what the store holds (chunks of the right length)."""
    parts = _store_parts(upload)
    received = {str(index): etag.strip('"') for index, (size, etag) in parts.items()
                if 0 <= index < upload.chunk_count and size == chunk_length(upload, index)}
    if received != upload.received:
        DataUpload.objects.filter(pk=upload.pk).update(received=received, updated_at=timezone.now())
        upload.received = received
    return upload


def direct_parts(upload: DataUpload, wanted: Any) -> dict[str, Any]:
    """Presigned PUT URLs for the chunks ``wanted`` (``[{"index": n, "md5": base64}]``) of a direct upload, each
    signed with the chunk's ``Content-MD5``, and the upload as the store now has it. A bad entry is a 400 naming
    it; an upload through the control plane is a 409."""
    if timezone.now() >= upload_deadline(upload):
        raise _expired(upload)
    if not upload.store_upload:
        raise DataRejected({"detail": f"upload {upload.pk} goes through the control plane: PUT each chunk to "
                                      f"/api/v1/uploads/{upload.pk}/chunks/{{index}}/"}, status=409)
    errors: dict[str, str] = {}
    if not isinstance(wanted, list) or len(wanted) > 1000:
        errors["parts"] = "a list of at most 1000 {index, md5}"
        wanted = []
    last = upload.chunk_count - 1
    for position, part in enumerate(wanted):
        index = part.get("index") if isinstance(part, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= last:
            errors[f"parts[{position}].index"] = f"a chunk index from 0 to {last}"
        if not isinstance(part, dict) or content_md5(part.get("md5")) is None:
            errors[f"parts[{position}].md5"] = "the chunk's MD5, base64 (what it is sent with as Content-MD5)"
    if errors:
        raise DataRejected(errors)
    upload = direct_sync(upload)
    storage, expires = get_storage(), settings.STRATA_PRESIGN_EXPIRY_S
    key = data_key(upload.team_id, upload)
    urls = [{"index": part["index"], "length": chunk_length(upload, part["index"]),
             "url": storage.upload_part_url(key, upload.store_upload, part["index"] + 1, part["md5"], expires)}
            for part in wanted]
    return {"urls": urls, "expires_s": expires, "upload": upload}


class _Hashing(io.RawIOBase):
    """A reader that hashes what it reads, in order, once: a rewind to a place already hashed (an archive's
    sniffing of its first bytes) is allowed; a skip forward marks the hash incomplete."""

    def __init__(self, source: BinaryIO):
        super().__init__()
        self._source, self._at, self.hashed, self.complete = source, 0, 0, True
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = self._source.seek(offset, whence)
        if self._at > self.hashed:
            self.complete = False
        return self._at

    def readinto(self, buffer) -> int:
        data = self._source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        if self._at <= self.hashed < self._at + n:
            self.digest.update(memoryview(data)[self.hashed - self._at:])
            self.hashed = self._at + n
        self._at += n
        return n

    def drain(self) -> None:
        """Read to the end (what the archive's reader left: its padding)."""
        self.seek(self.hashed)
        while self.read(COPY):
            pass


def _direct_complete(upload: DataUpload) -> tuple[str, int, str, bundles.Manifest]:
    """Join a direct upload's parts in the store and check the object as :func:`upload_complete` checks assembled
    chunks: its length, its SHA-256 and (an archive) every entry. Returns (key, size, sha256, manifest); the object
    is deleted when it fails a check."""
    parts = _store_parts(upload)
    missing = [index for index in range(upload.chunk_count) if index not in parts]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise DataRejected({"chunks": f"{len(missing)} chunk(s) still missing: {shown}"}, status=409)
    wrong = [index for index, (size, _) in parts.items()
             if index >= upload.chunk_count or size != chunk_length(upload, index)]
    if wrong:
        raise DataRejected({"chunks": f"chunk(s) of the wrong length: {', '.join(map(str, sorted(wrong)[:20]))} "
                                      "(send them again)"})
    storage, key = get_storage(), data_key(upload.team_id, upload)
    size = storage.upload_complete(key, upload.store_upload, {index + 1: etag for index, (_, etag) in parts.items()})
    try:
        with storage.open(key) as stored:
            reader = _Hashing(stored)
            manifest = None
            if upload.format == DataSet.Format.ARCHIVE:
                try:
                    manifest = bundles.inspect(reader, max_bytes=settings.STRATA_MAX_DATA_BYTES,
                                               max_files=MAX_DATA_FILES)
                except bundles.BundleError as error:
                    raise DataRejected({"file": f"{error}; the upload was dropped"}) from None
            reader.drain()
            sha = reader.digest.hexdigest()
            if not reader.complete:  # the archive's reader skipped ahead (a zip): hash it in one more pass
                stored.seek(0)
                digest = hashlib.sha256()
                while data := stored.read(COPY):
                    digest.update(data)
                sha = digest.hexdigest()
        if size != upload.size or sha != upload.sha256:
            raise DataRejected({"sha256": f"the chunks assemble to {size} bytes with SHA-256 {sha}, not "
                                          f"{upload.size} bytes with {upload.sha256}; the upload was dropped: start "
                                          "again"})
    except DataRejected:
        storage.delete(key)
        upload.delete()
        raise
    if manifest is None:
        manifest = bundles.Manifest([bundles.BundleFile(upload.file_name, upload.size)])
    return key, size, sha, manifest


def upload_complete(upload: DataUpload) -> DataSet:
    """Assemble the chunks, verify the whole SHA-256 (a mismatch: 400 naming ``sha256``, and the upload is
    forgotten), check a directory's archive and create the data set. The chunks are then dropped."""
    if timezone.now() >= upload_deadline(upload):
        raise _expired(upload)
    if upload.store_upload:
        if DataSet.objects.filter(team=upload.team_id, name=upload.name).exists():
            raise DataRejected({"name": f"the team already has a data set named {upload.name}"}, status=409)
        key, _size, _sha, manifest = _direct_complete(upload)
        return _data_set_create(upload, key, manifest)
    missing = missing_chunks(upload)
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise DataRejected({"chunks": f"{len(missing)} chunk(s) still missing: {shown}"}, status=409)
    if DataSet.objects.filter(team=upload.team_id, name=upload.name).exists():
        raise DataRejected({"name": f"the team already has a data set named {upload.name}"}, status=409)
    limit = settings.STRATA_MAX_DATA_BYTES
    with tempfile.TemporaryFile() as whole:
        digest = hashlib.sha256()
        try:
            for index in range(upload.chunk_count):
                with DataBytes.open(chunk_key(upload, index)) as chunk:
                    while data := chunk.read(COPY):
                        digest.update(data)
                        whole.write(data)
        except FileNotFoundError:  # expired (or abandoned) under us: its chunks are gone
            raise DataRejected({"detail": f"upload {upload.pk} of {upload.name} is gone (abandoned, or expired: not "
                                          f"completed within {settings.STRATA_UPLOAD_EXPIRY_HOURS:g} h); start "
                                          "again"}, status=410) from None
        if whole.tell() != upload.size or digest.hexdigest() != upload.sha256:
            upload_abort(upload)
            raise DataRejected({"sha256": f"the chunks assemble to {whole.tell()} bytes with SHA-256 "
                                          f"{digest.hexdigest()}, not {upload.size} bytes with {upload.sha256}; "
                                          "the upload was dropped: start again"})
        whole.seek(0)
        if upload.format == DataSet.Format.ARCHIVE:
            try:
                manifest = bundles.inspect(whole, max_bytes=limit, max_files=MAX_DATA_FILES)
            except bundles.BundleError as error:
                upload_abort(upload)
                raise DataRejected({"file": f"{error}; the upload was dropped"}) from None
        else:
            manifest = bundles.Manifest([bundles.BundleFile(upload.file_name, upload.size)])
        whole.seek(0)
        key = data_key(upload.team_id, upload)
        DataBytes.save(key, whole, upload.size)
    return _data_set_create(upload, key, manifest)


def _data_set_create(upload: DataUpload, key: str, manifest: bundles.Manifest) -> DataSet:
    """Record the data set whose verified bytes are at ``key`` and forget the upload."""
    try:
        with transaction.atomic():
            data_set = DataSet.objects.create(
                team_id=upload.team_id, name=upload.name, digest=upload.sha256, format=upload.format,
                owner_id=upload.owner_id, size=upload.size, expanded_size=manifest.size,
                file_count=len(manifest.files), files=manifest.as_list(), storage_key=key)
            if upload.store_upload:  # completed in the store: nothing there to drop
                upload.delete()
            else:
                upload_abort(upload)
    except IntegrityError:  # the same name completed at the same time
        DataBytes.delete(key)
        raise DataRejected({"name": f"the team already has a data set named {upload.name}"}, status=409) from None
    return data_set


def data_in_use(data_set: DataSet) -> list[str]:
    """The unfinished jobs that read ``data_set`` (mount it, or read it through a data option)."""
    return [str(pk) for pk in data_set.jobs.exclude(state__in=TERMINAL_STATES).values_list("pk", flat=True)[:10]]


def data_delete(data_set: DataSet) -> None:
    """Delete a data set no unfinished job reads (409 naming the jobs otherwise)."""
    using = data_in_use(data_set)
    if using:
        raise DataRejected({"detail": f"unfinished jobs read data set {data_set.name}: {', '.join(using)}; it is "
                                      "kept until they end"}, status=409)
    key = data_set.storage_key
    data_set.delete()
    transaction.on_commit(lambda: DataBytes.delete(key))


def data_lookup(team, name: str) -> dict[str, Any] | None:
    """What a job's mount of ``name`` resolves to (``components.runtime.contract.data.Mounts``), or None."""
    found = DataSet.objects.filter(team=team, name=name).first()
    if found is None:
        return None
    answer = {"name": found.name, "digest": found.digest, "format": found.format, "size": found.size,
              "expanded_size": found.expanded_size}
    if found.format == DataSet.Format.FILE:
        answer["file"] = found.files[0]["path"]
    return answer


def data_link(job: Job) -> None:
    """Link ``job`` to the data sets its resolved spec reads (its mounts and its data providers' data sets:
    ``data_sets_of``), of its own team, name and digest alike: they are kept while it is unfinished."""
    wanted = {(mount["name"], digest) for digest, mount in data_sets_of(job.spec).items()}
    if not wanted:
        return
    names = {name for name, _digest in wanted}
    found = [ds for ds in DataSet.objects.filter(team_id=job.team_id, name__in=names) if (ds.name, ds.digest) in wanted]
    job.data_sets.set(found)


def data_for_attempt(job: Job, digest: str) -> DataSet | None:
    """The data set ``digest`` if ``job`` reads it and it is of the job's team (what a node may fetch)."""
    if digest not in data_sets_of(job.spec):
        return None
    return job.data_sets.filter(team_id=job.team_id, digest=digest).first()
