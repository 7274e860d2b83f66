"""Job credentials, the control plane's side: every job has an Ed25519 key of its own, derived from the control
plane's secret and the job's id (HKDF-SHA256), so nothing is stored and every control-plane process derives the
same key. A credential is a short-lived statement, signed with it, that a worker of the job (an attempt's rank,
or a participant) may act as a ``subject`` (an identity it holds, such as a peer's key); the format and the check
are in :mod:`components.runtime.shared.credentials`, which the job's workers use to check each other."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings

from components.runtime.shared.credentials import public_key_hex, sign_with

SALT = b"strata-job-credentials"


def _job(job_id) -> str:
    return str(uuid.UUID(str(job_id)))


def _seed(job_id) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=SALT,
                info=_job(job_id).encode()).derive(str(settings.SECRET_KEY).encode())


def job_public_key(job_id) -> str:
    """The hex of the raw bytes of the job's public key: what its workers check credentials with."""
    return public_key_hex(_seed(job_id))


def sign(job_id, subject: str, holder: str, ttl_s: float | None = None) -> dict[str, Any]:
    """A credential of job ``job_id`` for ``subject``, held by ``holder`` (who asked: ``attempt <id> ...`` or
    ``participant <id>``), valid ``ttl_s`` seconds (default ``STRATA_CREDENTIAL_TTL_S``): ``{"credential",
    "public_key", "expires", "issued"}``. ValueError for a subject that is not one
    (``components.runtime.shared.credentials.SUBJECT_PATTERN``)."""
    ttl = settings.STRATA_CREDENTIAL_TTL_S if ttl_s is None else float(ttl_s)
    return sign_with(_seed(job_id), job=_job(job_id), subject=subject, holder=holder, ttl_s=ttl)
