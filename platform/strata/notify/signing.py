"""Signing Strata's webhook bodies, and checking them on the receiving side. Light: the standard library only, so
a receiver can copy this file as it is.

Every delivery carries ``Strata-Signature: t=<unix seconds>,v1=<hex>``, where ``<hex>`` is the HMAC-SHA256, keyed
with the webhook's secret (the ``whsec_...`` string shown once at creation, used as UTF-8 bytes), of
``"<t>." + body`` (the raw request body, byte for byte). A receiver verifies with::

    from signing import SignatureError, verify_signature

    try:
        verify_signature(SECRET, request_body_bytes, request.headers["Strata-Signature"])
    except SignatureError as error:
        return 400, str(error)

which checks the HMAC in constant time and refuses a timestamp more than ``tolerance`` seconds (5 minutes) away
from the receiver's clock: a captured request replayed later is refused. Within those 5 minutes, refuse a
``Strata-Delivery`` id (or signature) already seen: a retry of the same delivery is signed afresh with a new
timestamp, and carries the same delivery id.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "Strata-Signature"
TOLERANCE_S = 300  # 5 minutes
SCHEME = "v1"


class SignatureError(ValueError):
    """The signature header is missing, malformed, does not match the body, or is too old (a replay)."""


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The hex HMAC-SHA256 of ``"<timestamp>." + body`` under ``secret``."""
    message = f"{int(timestamp)}.".encode("ascii") + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The ``Strata-Signature`` header value for ``body`` sent at ``timestamp`` (now by default)."""
    stamp = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={stamp},{SCHEME}={signature(secret, body, stamp)}"


def parse(header: str) -> tuple[int, list[str]]:
    """``(timestamp, [v1 signatures])`` of a header value; :class:`SignatureError` when it has neither."""
    stamp, found = None, []
    for part in (header or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            stamp = int(value)
        elif key == SCHEME and value:
            found.append(value)
    if stamp is None or not found:
        raise SignatureError(f"malformed {HEADER} header: expected t=<unix seconds>,{SCHEME}=<hex>")
    return stamp, found


def verify_signature(secret: str, body: bytes, header: str, *, tolerance: float = TOLERANCE_S,
                     now: float | None = None) -> int:
    """Check ``header`` (a ``Strata-Signature`` value) against ``body`` and ``secret``; returns its timestamp.
    Raises :class:`SignatureError` when it does not match, or when its timestamp is more than ``tolerance``
    seconds from ``now`` (a replay of an old request, or a clock far off)."""
    stamp, candidates = parse(header)
    expected = signature(secret, body, stamp)
    if not any(hmac.compare_digest(expected, candidate) for candidate in candidates):
        raise SignatureError("signature does not match the body")
    current = time.time() if now is None else now
    if abs(current - stamp) > tolerance:
        raise SignatureError(f"timestamp {stamp} is {current - stamp:.0f} s from now (more than {tolerance:g} s): "
                             "refused as a replay")
    return stamp
