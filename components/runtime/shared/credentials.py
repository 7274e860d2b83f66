"""Job credentials: short-lived statements the control plane signs for a job's workers (light: the standard library
and ``cryptography`` only).

A credential says "``holder`` may act as ``subject`` in job ``job`` until ``exp``", signed with the job's Ed25519
key. The control plane derives that key from its secret and the job's id (``strata.jobs.credentials``), so it
stores nothing; it hands out the public key (hex of its 32 raw bytes) with every credential and to every
participant that joins. Anyone who has the public key can then check a credential with :func:`verify` without
asking the control plane: the peers of a job check each other this way (a volunteer's peer presents the
credential it got for its own identity, ``subject``).

A credential is two base64url parts (no padding) joined by a dot: the claims as canonical JSON (sorted keys,
no spaces) ``{"exp": unix seconds, "holder": str, "job": str, "subject": str}``, and the Ed25519 signature of
exactly those bytes. What issues one answers ``{"credential", "public_key", "expires", "issued"}``
(:func:`sign_with`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from typing import Any

# What a subject may be: an identity a worker proves it holds, e.g. ``rsa:<hash of a public key>`` or
# ``p2p:<peer id>``; 1 to 256 characters of letters, digits and ``:._/+=-``.
SUBJECT_PATTERN = r"^[A-Za-z0-9:._/+=-]{1,256}$"
MAX_CREDENTIAL_CHARS = 4096  # longer presented values are refused without decoding them
CLAIMS = ("exp", "holder", "job", "subject")
SEED_BYTES = 32


def subject_problem(subject: Any) -> str | None:
    """Why ``subject`` cannot be a credential's subject (one line), or None."""
    if not isinstance(subject, str) or not re.match(SUBJECT_PATTERN, subject):
        return "must be 1 to 256 characters of letters, digits and :._/+=-"
    return None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def canonical(claims: dict[str, Any]) -> bytes:
    """The bytes that are signed: ``claims`` as JSON with sorted keys and no spaces."""
    return json.dumps(claims, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def private_key(seed: bytes):
    """The Ed25519 private key of a 32-byte ``seed``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if len(seed) != SEED_BYTES:
        raise ValueError(f"an Ed25519 seed is {SEED_BYTES} bytes, not {len(seed)}")
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_key_hex(seed: bytes) -> str:
    """The hex of the raw public key of ``seed``'s private key (what :func:`verify` takes)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return private_key(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def sign_with(seed: bytes, *, job: str, subject: str, holder: str, ttl_s: float,
              now: float | None = None) -> dict[str, Any]:
    """A credential for ``subject`` in ``job``, held by ``holder``, valid ``ttl_s`` seconds from ``now``, signed with
    ``seed``'s key: ``{"credential": str, "public_key": hex, "expires": unix s, "issued": unix s}``. ValueError for
    a bad subject or a TTL that is not positive."""
    if problem := subject_problem(subject):
        raise ValueError(f"subject {str(subject)[:40]!r} {problem}")
    if not ttl_s > 0:
        raise ValueError("a credential's ttl_s must be positive")
    issued = time.time() if now is None else float(now)
    claims = {"exp": round(issued + float(ttl_s), 3), "holder": str(holder)[:300], "job": str(job),
              "subject": subject}
    payload = canonical(claims)
    signature = private_key(seed).sign(payload)
    return {"credential": f"{_b64(payload)}.{_b64(signature)}", "public_key": public_key_hex(seed),
            "expires": claims["exp"], "issued": round(issued, 3)}


def parse(credential: str) -> tuple[dict[str, Any], bytes, bytes] | None:
    """``(claims, signed bytes, signature)`` of a well-formed credential, or None. The claims are NOT checked:
    read them with :func:`verify`, unless only showing them."""
    if not isinstance(credential, str) or not 0 < len(credential) <= MAX_CREDENTIAL_CHARS:
        return None
    payload_text, dot, signature_text = credential.partition(".")
    if not dot or "." in signature_text:
        return None
    try:
        payload, signature = _unb64(payload_text), _unb64(signature_text)
        claims = json.loads(payload.decode())
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(claims, dict) or set(claims) != set(CLAIMS):
        return None
    if not all(isinstance(claims[name], str) for name in ("holder", "job", "subject")):
        return None
    if isinstance(claims["exp"], bool) or not isinstance(claims["exp"], int | float):
        return None
    return claims, payload, signature


def verify(credential: str, public_key_hex: str, *, job: str, subject: str | None = None,
           now: float | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """Check ``credential`` against the job's public key (hex). ``(claims, None)`` when it is well formed, signed
    by that key, for ``job`` (and ``subject``, when given) and not expired at ``now`` (default: the clock);
    otherwise ``(None, reason)``, one line that never repeats the credential."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    parsed = parse(credential)
    if parsed is None:
        return None, "not a credential (bad format)"
    claims, payload, signature = parsed
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))
    except (TypeError, ValueError):
        return None, "the job's public key is not a 32-byte Ed25519 key in hex"
    try:
        key.verify(signature, payload)
    except InvalidSignature:
        return None, "bad signature: not signed by this job's key"
    if claims["job"] != str(job):
        return None, "the credential is for another job"
    if subject is not None and claims["subject"] != subject:
        return None, "the credential is for another subject"
    moment = time.time() if now is None else float(now)
    if float(claims["exp"]) <= moment:
        return None, f"the credential expired {moment - float(claims['exp']):.0f} s ago"
    return claims, None


__all__ = ["SUBJECT_PATTERN", "canonical", "parse", "public_key_hex", "sign_with", "subject_problem", "verify"]
