"""Attempt credentials: what an attempt's processes authenticate with instead of the node's token.

The node token lets its holder register nodes, heartbeat and be dispatched any team's attempts, so it stays in
the node agent and its worker. Each attempt rank gets an *attempt credential* instead: a value the control plane
signs (HMAC with its secret key, through :mod:`django.core.signing`, so the old key keeps working while it is in
``SECRET_KEY_FALLBACKS``) that names one attempt and the node running it, and expires after
``STRATA_ATTEMPT_CREDENTIAL_TTL_S``. It works only on that attempt's own node routes (its reports, artifacts,
checkpoint, rendezvous, children, job credentials and access-token digests, :class:`strata.api.permissions.
IsNodeOrOwnAttempt`); every other route refuses it. The attempt renews it (``POST node/attempts/{id}/renew/``)
while the attempt lives.

Nothing is stored: a credential is checked by its signature, and the attempt's fencing token is still checked on
every call, so a credential outliving its attempt opens nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.core import signing

PREFIX = "sac1."  # what tells an attempt credential from an API token in an Authorization header
SALT = "strata.attempt-credential"
MAX_CHARS = 1024


@dataclass(frozen=True)
class AttemptCredential:
    """A checked attempt credential: ``request.auth`` of a call made with one."""

    attempt: str
    node: str
    expires: float

    @property
    def team_id(self):  # never a team's: user routes refuse it (they read request.auth.team_id of tokens)
        return None


class CredentialRefused(Exception):
    """Why a presented attempt credential is refused (one line that never repeats it)."""


def is_attempt_credential(value: str | None) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def mint(attempt_id, node_id, ttl_s: float | None = None) -> dict:
    """A credential for attempt ``attempt_id`` run by node ``node_id``: ``{"credential", "expires"}`` (unix s)."""
    ttl = float(settings.STRATA_ATTEMPT_CREDENTIAL_TTL_S if ttl_s is None else ttl_s)
    expires = round(time.time() + ttl, 3)
    value = signing.dumps({"a": str(attempt_id), "n": str(node_id), "e": expires}, salt=SALT, compress=False)
    return {"credential": PREFIX + value, "expires": expires}


def check(value: str, now: float | None = None) -> AttemptCredential:
    """The attempt credential ``value`` names; :class:`CredentialRefused` when it is malformed, not signed by this
    control plane, or expired."""
    if not is_attempt_credential(value) or len(value) > MAX_CHARS:
        raise CredentialRefused("not an attempt credential")
    try:
        claims = signing.loads(value[len(PREFIX):], salt=SALT)
    except signing.BadSignature:
        raise CredentialRefused("the attempt credential is not valid (bad signature)") from None
    if not isinstance(claims, dict) or not all(isinstance(claims.get(k), str) for k in ("a", "n")) \
            or isinstance(claims.get("e"), bool) or not isinstance(claims.get("e"), int | float):
        raise CredentialRefused("the attempt credential is not valid (bad claims)")
    moment = time.time() if now is None else now
    if float(claims["e"]) <= moment:
        raise CredentialRefused(f"the attempt credential expired {moment - float(claims['e']):.0f} s ago: renew it "
                                "before it expires")
    return AttemptCredential(attempt=claims["a"], node=claims["n"], expires=float(claims["e"]))
