"""Direct transfers: with an object store (:attr:`ArtifactStorage.presigns`), bytes move between nodes or users and
the store without passing through the control plane. The control plane only checks and signs.

An upload (an attempt's artifact or checkpoint):

1. ``start``: the attempt names the object (name, kind), its size and its SHA-256. The control plane checks the
   attempt (fencing token: a stale or ended attempt is a 409 before anything is signed), the size limit (S3's 5 TiB)
   and the team's storage, begins a multipart upload and answers an *upload ticket*: a signed, expiring token that
   ties the upload to this attempt and object. With local disk (or an object smaller than
   ``STRATA_DIRECT_MIN_BYTES``) the answer is ``direct: false`` and the bytes stream through the control plane as
   before (``PUT .../artifacts/NAME/``).
2. ``parts``: for the parts it still has to send, the attempt gets one presigned PUT URL each, signed with that
   part's ``Content-MD5``: the store refuses other bytes. The answer lists the parts already stored, so an upload
   that was cut off resumes with the missing ones only. Parts are 64 MiB and go up in parallel.
3. ``complete``: the control plane lists the stored parts, checks that they add up to the size declared at the
   start, part by part, has the store join them, and only then records the artifact. An incomplete upload is a
   400 naming the missing parts (and stays resumable); nothing is recorded for it. ``abort`` drops it; the beat
   aborts uploads older than ``STRATA_UPLOAD_EXPIRY_HOURS`` (and a bucket lifecycle rule can do the same).

A download answers a presigned GET URL (ranges work) with the object's size and SHA-256, which the reader checks.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core import signing
from django.utils import timezone

from strata.jobs.models import Artifact, Attempt
from strata.jobs.storage import direct, get_storage

SALT = "strata.jobs.transfers.upload"
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class TransferRejected(ValueError):
    """A bad request: ``errors`` maps each field to its message (a 400), ``status`` says otherwise (413)."""

    def __init__(self, errors: dict[str, str], status: int = 400):
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors, self.status = errors, status


@dataclass(frozen=True)
class Ticket:
    attempt: str
    key: str
    upload_id: str
    size: int
    sha256: str
    name: str
    kind: str
    part_bytes: int

    @property
    def parts(self) -> int:
        return max(1, -(-self.size // self.part_bytes))

    def part_length(self, number: int) -> int:
        return min(self.part_bytes, self.size - (number - 1) * self.part_bytes)


def upload_start(attempt: Attempt, name: str, kind: str, size: int, sha256: str) -> dict:
    from strata.jobs import services

    errors = {}
    if kind not in Artifact.Kind.values:
        errors["kind"] = f"one of {', '.join(Artifact.Kind.values)}"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        errors["size"] = "a number of bytes, 0 or more"
    if not isinstance(sha256, str) or not SHA256.match(sha256):
        errors["sha256"] = "the object's SHA-256, 64 lowercase hex digits"
    if errors:
        raise TransferRejected(errors)
    storage = get_storage()
    if not direct() or size < settings.STRATA_DIRECT_MIN_BYTES:
        return {"direct": False, "max_bytes": settings.STRATA_MAX_UPLOAD_BYTES}
    if size > storage.max_object_bytes:
        raise TransferRejected({"size": f"{size} bytes is over the store's {storage.max_object_bytes} byte limit"},
                               status=413)
    key = services.artifact_key(attempt, name, kind)
    replaced = Artifact.objects.filter(job_id=attempt.job_id, kind=kind, name=name).values_list("size", flat=True)
    services.storage_admission(attempt.job.team_id, size, replaces=replaced.first() or 0)  # a 413 over the quota
    upload_id = storage.upload_start(key, sha256)
    ticket = Ticket(str(attempt.pk), key, upload_id, size, sha256, name, kind, storage.part_size(size))
    token = signing.dumps(ticket.__dict__, salt=SALT, compress=True)
    return {"direct": True, "upload": token, "part_bytes": ticket.part_bytes, "parts": ticket.parts,
            "expires_s": int(settings.STRATA_UPLOAD_EXPIRY_HOURS * 3600)}


def ticket_for(attempt: Attempt, token: str) -> Ticket:
    """The upload ``token`` stands for, if it was issued to ``attempt`` and has not expired."""
    try:
        data = signing.loads(str(token), salt=SALT, max_age=timedelta(hours=settings.STRATA_UPLOAD_EXPIRY_HOURS))
    except signing.SignatureExpired:
        raise TransferRejected({"upload": "the upload expired: start it again"}) from None
    except signing.BadSignature:
        raise TransferRejected({"upload": "not an upload ticket of this control plane"}) from None
    ticket = Ticket(**data)
    if ticket.attempt != str(attempt.pk):
        raise TransferRejected({"upload": "the upload belongs to another attempt"})
    return ticket


def content_md5(value) -> str | None:
    try:
        raw = base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        return None
    return str(value) if len(raw) == 16 else None


def upload_parts(attempt: Attempt, token: str, wanted: list) -> dict:
    """Presigned PUT URLs for the ``wanted`` parts (``[{"number": n, "md5": base64}]``), and the parts already
    stored (``{"stored": {n: size}}``)."""
    ticket = ticket_for(attempt, token)
    storage = get_storage()
    errors = {}
    if not isinstance(wanted, list) or len(wanted) > 1000:
        errors["parts"] = "a list of at most 1000 {number, md5}"
        wanted = []
    for index, part in enumerate(wanted):
        number = part.get("number") if isinstance(part, dict) else None
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= ticket.parts:
            errors[f"parts[{index}].number"] = f"a part number from 1 to {ticket.parts}"
        if not isinstance(part, dict) or content_md5(part.get("md5")) is None:
            errors[f"parts[{index}].md5"] = "the part's MD5, base64 (Content-MD5)"
    if errors:
        raise TransferRejected(errors)
    try:
        stored = storage.upload_parts(ticket.key, ticket.upload_id)
    except FileNotFoundError:
        raise TransferRejected({"upload": "the upload is gone (aborted or expired): start it again"}) from None
    expires = settings.STRATA_PRESIGN_EXPIRY_S
    urls = [{"number": part["number"], "length": ticket.part_length(part["number"]),
             "url": storage.upload_part_url(ticket.key, ticket.upload_id, part["number"], part["md5"], expires)}
            for part in wanted]
    return {"urls": urls, "stored": {str(n): size for n, (size, _) in sorted(stored.items())},
            "expires_s": expires}


def upload_complete(attempt: Attempt, token: str) -> Artifact:
    """Join the parts into the object and record it, once every part is there with the right length."""
    from strata.jobs import services

    ticket = ticket_for(attempt, token)
    storage = get_storage()
    try:
        stored = storage.upload_parts(ticket.key, ticket.upload_id)
    except FileNotFoundError:
        raise TransferRejected({"upload": "the upload is gone (aborted or expired): start it again"}) from None
    missing = [n for n in range(1, ticket.parts + 1) if n not in stored]
    wrong = [n for n in range(1, ticket.parts + 1) if n in stored and stored[n][0] != ticket.part_length(n)]
    extra = [n for n in stored if n > ticket.parts]
    if missing or wrong or extra:
        errors = {}
        if missing:
            errors["parts"] = f"{len(missing)} part(s) not uploaded: {_numbers(missing)}"
        if wrong or extra:
            errors["sizes"] = f"part(s) of the wrong length: {_numbers(sorted(wrong + extra))}"
        raise TransferRejected(errors)
    size = storage.upload_complete(ticket.key, ticket.upload_id, {n: etag for n, (_, etag) in stored.items()})
    if size != ticket.size:  # the store joined something else: never record it
        storage.delete(ticket.key)
        raise TransferRejected({"size": f"the store holds {size} bytes, {ticket.size} were declared"})
    return services.artifact_record(attempt, ticket.name, ticket.kind, ticket.key, size, ticket.sha256)


def upload_abort(attempt: Attempt, token: str) -> None:
    ticket = ticket_for(attempt, token)
    get_storage().upload_abort(ticket.key, ticket.upload_id)


def _numbers(numbers: list[int], shown: int = 10) -> str:
    text = ", ".join(str(n) for n in numbers[:shown])
    return text + (f" and {len(numbers) - shown} more" if len(numbers) > shown else "")


def download_redirect(key: str, size: int):
    """For a user's download route: a 302 to a presigned URL where transfers are direct, else None (stream it).
    The store answers with the object as an attachment of type application/octet-stream, named as its key ends
    (``strata.jobs.storage._headers``)."""
    from django.http import HttpResponseRedirect

    if not direct() or size < settings.STRATA_DIRECT_MIN_BYTES:
        return None
    url = get_storage().presign_get(key, settings.STRATA_PRESIGN_EXPIRY_S)
    response = HttpResponseRedirect(url)
    response["Cache-Control"] = "no-store"
    return response


def abandoned_uploads_abort() -> int:
    """Abort direct uploads begun more than ``STRATA_UPLOAD_EXPIRY_HOURS`` ago (their tickets have expired, so
    none can complete). Returns how many."""
    if not direct():
        return 0
    storage = get_storage()
    before = timezone.now() - timedelta(hours=settings.STRATA_UPLOAD_EXPIRY_HOURS)
    count = 0
    for key, upload_id in list(storage.uploads_started_before(before)):
        storage.upload_abort(key, upload_id)
        count += 1
    return count
