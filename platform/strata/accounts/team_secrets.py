"""Team secrets: named values a team's jobs ask for (``spec.environment.secrets``) and get as environment variables.

At rest each value is a Fernet token (AES-128-CBC with HMAC-SHA256, from ``cryptography``) under a key derived
from the control plane's secret key (HKDF-SHA256 with a fixed salt and label), so the database holds no value and
no key. Decryption tries the secret key, then each of ``SECRET_KEY_FALLBACKS`` (``STRATA_SECRET_KEY_FALLBACKS``):
after the secret key is rotated, with the old one among the fallbacks, every secret stays readable;
:func:`secrets_rotate` (``strata secrets rotate``) re-encrypts them all under the new key, after which the old
one can leave the fallbacks.

A value leaves the control plane only in the claim answer of an attempt of the team's own job that names it
(:func:`secrets_for_job`), and the control plane replaces each requested value with ``***`` in the log lines and
the finish reason that attempt reports (:func:`redactor`).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from components.runtime.contract.project import requested_secrets, secret_name_problem
from strata.accounts.models import Secret
from strata.audit.services import record

MAX_VALUE_BYTES = 64 * 1024
REDACTED = "***"
MIN_REDACTED = 4  # shorter values are not redacted: "***" for every "a" or "1" would garble the logs
SALT = b"strata-team-secrets"
INFO = b"fernet-key-v1"


class SecretRejected(ValueError):
    """A secret cannot be stored as asked: ``errors`` names each bad field (a 400)."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))


class SecretUnreadable(Exception):
    """A stored secret is not readable under the secret key or any of its fallbacks."""


# -- the key ------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _fernet_key(secret_key: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=SALT, info=INFO).derive(secret_key.encode())
    return base64.urlsafe_b64encode(raw)


def _keys() -> list[str]:
    keys = [str(settings.SECRET_KEY), *(str(key) for key in getattr(settings, "SECRET_KEY_FALLBACKS", []) or [])]
    return list(dict.fromkeys(key for key in keys if key))


def _cipher():
    """A MultiFernet: encrypts under the current secret key, decrypts under it or any fallback."""
    from cryptography.fernet import Fernet, MultiFernet

    return MultiFernet([Fernet(_fernet_key(key)) for key in _keys()])


def encrypt(value: str) -> str:
    return _cipher().encrypt(value.encode("utf-8")).decode("ascii")


def decrypt(ciphertext: str) -> str:
    from cryptography.fernet import InvalidToken

    try:
        return _cipher().decrypt(ciphertext.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError, ValueError):
        raise SecretUnreadable("not readable with the secret key or its fallbacks") from None


# -- checks -------------------------------------------------------------------------------------------------------
def value_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return "required: the secret's value, a string"
    if not value:
        return "must not be empty"
    if "\x00" in value:
        return "must not contain NUL characters (an environment variable cannot hold them)"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeError:
        return "must be text (UTF-8)"
    if size > MAX_VALUE_BYTES:
        return f"must be at most {MAX_VALUE_BYTES // 1024} KiB ({size} bytes given)"
    return None


# -- writes -------------------------------------------------------------------------------------------------------
def secret_set(team, name: str, value: str, *, user=None, request=None) -> tuple[Secret, bool]:
    """Create or replace ``team``'s secret ``name``; returns (secret, created). :class:`SecretRejected` names each
    bad field. The audit log gets a ``secret.set`` entry (never the value)."""
    errors = {field: problem for field, problem in (("name", secret_name_problem(name)), ("value", value_problem(value)))
              if problem}
    if errors:
        raise SecretRejected(errors)
    ciphertext = encrypt(value)
    now = timezone.now()
    before = None
    with transaction.atomic():
        secret, created = Secret.objects.select_for_update().get_or_create(
            team=team, name=name, defaults={"ciphertext": ciphertext, "created_by": user, "updated_by": user,
                                            "created_at": now, "updated_at": now})
        if not created:
            before = {"name": name, "updated_at": secret.updated_at,
                      "updated_by": secret.updated_by.get_username() if secret.updated_by else None}
            secret.ciphertext, secret.updated_by, secret.updated_at = ciphertext, user, now
            secret.save(update_fields=["ciphertext", "updated_by", "updated_at"])
        record("secret.set", request=request, actor=None if request is not None else user, team=team,
               target=f"secret {name}", before=before,
               after={"name": name, "created": created, "updated_at": now})
    return secret, created


def secret_delete(secret: Secret, *, request=None, user=None) -> None:
    """Delete ``secret``; the audit log gets a ``secret.delete`` entry."""
    with transaction.atomic():
        record("secret.delete", request=request, actor=None if request is not None else user, team=secret.team,
               target=f"secret {secret.name}", before={"name": secret.name, "updated_at": secret.updated_at})
        secret.delete()


def secrets_rotate() -> int:
    """Re-encrypt every secret under the current secret key (readable before under it or a fallback). Returns
    how many were re-encrypted; :class:`SecretUnreadable` (nothing changed) when one is readable under no key."""
    from cryptography.fernet import InvalidToken

    cipher = _cipher()
    rotated = 0
    with transaction.atomic():
        for secret in Secret.objects.select_for_update().order_by("pk"):
            try:
                ciphertext = cipher.rotate(secret.ciphertext.encode("ascii")).decode("ascii")
            except (InvalidToken, ValueError):
                raise SecretUnreadable(f"secret {secret.name} of team {secret.team.slug} is not readable with the "
                                       "secret key or its fallbacks; nothing was re-encrypted") from None
            Secret.objects.filter(pk=secret.pk).update(ciphertext=ciphertext)
            rotated += 1
    return rotated


# -- reads --------------------------------------------------------------------------------------------------------
def secrets_missing(team_id: int, names: Iterable[str]) -> list[str]:
    """The names of ``names`` that the team has no secret of, in order."""
    names = list(dict.fromkeys(names))
    present = set(Secret.objects.filter(team_id=team_id, name__in=names).values_list("name", flat=True))
    return [name for name in names if name not in present]


def secret_values(team_id: int, names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """({name: value} of the team's secrets among ``names``, [names missing or unreadable])."""
    names = list(dict.fromkeys(names))
    if not names:
        return {}, []
    values, problems = {}, []
    rows = dict(Secret.objects.filter(team_id=team_id, name__in=names).values_list("name", "ciphertext"))
    for name in names:
        if name not in rows:
            problems.append(name)
            continue
        try:
            values[name] = decrypt(rows[name])
        except SecretUnreadable:
            problems.append(name)
    return values, problems


def secrets_for_job(job) -> tuple[dict[str, str], list[str]]:
    """The secrets ``job``'s spec asks for, of its own team: ({name: value}, [names missing or unreadable])."""
    return secret_values(job.team_id, requested_secrets(job.spec))


def redact(text: str, values: Iterable[str]) -> str:
    """``text`` with each of ``values`` (in order: see :func:`redaction_values`) replaced by ``***``."""
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redaction_values(values: Iterable[str]) -> list[str]:
    """What to redact for secret ``values``: each value of ``MIN_REDACTED`` characters or more, and each such
    line of a multi-line value (a log line holds one line of a printed key file), longest first."""
    found = set()
    for value in values:
        if len(value) >= MIN_REDACTED:
            found.add(value)
        for line in value.splitlines():
            line = line.strip()
            if len(line) >= MIN_REDACTED:
                found.add(line)
    return sorted(found, key=lambda item: (-len(item), item))


def redactor(job) -> Callable[[str], str] | None:
    """A function that redacts the values of the secrets ``job`` asks for (their current values), or None when
    it asks for none."""
    names = requested_secrets(job.spec)
    if not names:
        return None
    values, _ = secret_values(job.team_id, names)
    targets = redaction_values(values.values())
    if not targets:
        return None
    return lambda text: redact(text, targets) if isinstance(text, str) else text
