"""Code bundles: a team's project, uploaded once per content and run by its jobs (``components.runtime.shared.bundles``).

The control plane checks every upload (a tar, tar.gz or zip: no absolute paths, ``..``, links, devices, and no
more than ``STRATA_MAX_CODE_BYTES`` unpacked), stores it in its canonical form through the artifact storage and
names it by the SHA-256 of those bytes. The same content uploaded again by the team is the same bundle.
"""

from __future__ import annotations

import tempfile
from typing import BinaryIO

from django.conf import settings
from django.db import IntegrityError, transaction

from components.runtime.shared import bundles
from strata.jobs.models import CodeBundle, Job
from strata.jobs.services import storage_admission
from strata.jobs.storage import get_storage


class CodeRejected(ValueError):
    """An upload that is not an acceptable bundle; the message names the problem."""


def code_key(team_id: int, digest: str) -> str:
    return f"code/{team_id}/{digest}.tar.gz"


def code_store(*, team, user, source: BinaryIO) -> tuple[CodeBundle, bool]:
    """Check ``source`` (an uploaded archive, seekable), store its canonical form once per team and digest.
    Returns (bundle, created). Raises :class:`CodeRejected` naming the problem."""
    limit = settings.STRATA_MAX_CODE_BYTES
    with tempfile.TemporaryFile() as canonical:
        try:
            manifest, digest = bundles.canonicalize(source, canonical, max_bytes=limit)
        except bundles.BundleError as error:
            raise CodeRejected(str(error)) from None
        existing = CodeBundle.objects.filter(team=team, digest=digest).first()
        if existing is not None:
            return existing, False
        size = canonical.tell()
        storage_admission(team.pk, size)
        canonical.seek(0)
        key = code_key(team.pk, digest)
        get_storage().save(key, canonical, max(size, 1))
    try:
        with transaction.atomic():
            bundle = CodeBundle.objects.create(team=team, digest=digest, owner=user, size=size,
                                               expanded_size=manifest.size, file_count=len(manifest.files),
                                               files=manifest.as_list(), storage_key=key)
    except IntegrityError:  # the same bundle uploaded at the same time: one row, the same bytes under one key
        return CodeBundle.objects.get(team=team, digest=digest), False
    return bundle, True


def code_of_team(team, value) -> CodeBundle:
    """The team's bundle named by ``value`` (a digest, ``sha256:<digest>`` or a unique prefix of 12+ digits);
    raises CodeRejected."""
    text = str(value or "").strip().lower().removeprefix("sha256:")
    if len(text) < 12 or any(c not in "0123456789abcdef" for c in text):
        raise CodeRejected("must be a code bundle's SHA-256 digest (POST /api/v1/code/ returns it)")
    found = list(CodeBundle.objects.filter(team=team, digest__startswith=text)[:2])
    if not found:
        raise CodeRejected(f"no code bundle {text[:64]} in team {team.slug}; upload it first (strata submit --code "
                           "DIR does both)")
    if len(found) > 1:
        raise CodeRejected(f"{text} names more than one code bundle; give more digits")
    return found[0]


def code_delete(bundle: CodeBundle) -> None:
    """Delete a bundle no job uses (raises CodeRejected otherwise)."""
    if Job.objects.filter(code=bundle).exists():
        raise CodeRejected("jobs still use this code bundle; it is kept while they exist")
    key = bundle.storage_key
    bundle.delete()
    transaction.on_commit(lambda: get_storage().delete(key))
