"""Checking callers against a job's access tokens, on the node.

The control plane issues and revokes a job's tokens (``POST /api/v1/jobs/{id}/tokens/``, ``DELETE
.../tokens/{token_id}/``, ``strata job-token``) and keeps only their SHA-256 digests. A running attempt of a kind
whose ``KindSpec.accepts_tokens`` is true reads the digests of the working ones through
:meth:`ctx.identity.token_digests() <components.runtime.contract.context.Identity.token_digests>`; a :class:`TokenGate` keeps them
fresh on a background thread and answers :meth:`TokenGate.check` from memory, so a call costs one hash and no
round trip. A revoked or expired token stops working at the next refresh (``refresh_s``).

If a refresh fails (the control plane is unreachable), the gate keeps the digests it has and says so in the log:
the service goes on for the callers it knew, and a revocation waits for the control plane to come back. Before the
first successful read it accepts no one.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 2.0
MAX_TOKEN_CHARS = 512  # longer presented values are refused without hashing them


def token_digest(raw: str) -> str:
    """The SHA-256 hex digest the control plane stores for token ``raw`` (256 random bits: no salt needed)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def new_api_token() -> tuple[str, str]:
    """A new API token: (its prefix, shown in listings; its raw value ``st_<prefix>_<random>``). The control plane
    makes them (``ApiToken.generate``), and so does ``strata login``, which sends only the digest."""
    prefix = secrets.token_hex(4)
    return prefix, f"st_{prefix}_{secrets.token_urlsafe(32)}"


def bearer(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The token in call metadata: ``authorization: Bearer <token>`` (or ``x-strata-token: <token>``); None."""
    for key, value in metadata:
        if isinstance(value, bytes):
            continue
        name = key.lower()
        if name == "authorization":
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == "x-strata-token" and value.strip():
            return value.strip()
    return None


class TokenGate:
    """Which access tokens a job's service accepts now: ``fetch()`` returns the working digests.

    :meth:`check` returns None for a working token, else the reason (one line, never the token). :meth:`start`
    reads once and then refreshes every ``refresh_s`` seconds on a daemon thread until :meth:`stop`.
    """

    def __init__(self, fetch: Callable[[], Iterable[str]], *, refresh_s: float = DEFAULT_REFRESH_S, name: str = ""):
        self.fetch = fetch
        self.refresh_s = float(refresh_s)
        self.name = name
        self._digests: frozenset[str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        self.failures = 0

    def refresh(self) -> bool:
        """Read the digests now; False (and the old ones kept) when the read fails."""
        try:
            digests = frozenset(str(digest) for digest in self.fetch())
        except Exception as error:
            self.failures += 1
            log.warning("%s: could not refresh the access tokens (%s: %s); keeping the %s known", self.name or "gate",
                        type(error).__name__, error, "none" if self._digests is None else len(self._digests))
            return False
        with self._lock:
            self._digests = digests
        self.refreshes += 1
        return True

    def start(self) -> TokenGate:
        self.refresh()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"token-gate-{self.name}")
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.refresh_s + 5.0)

    def check(self, token: str | None) -> str | None:
        """None when ``token`` is one of the job's working tokens; otherwise why it is refused."""
        if not token:
            return ("no access token: send 'authorization: Bearer <token>' "
                    "(create one with: strata job-token create JOB_ID)")
        if len(token) > MAX_TOKEN_CHARS:
            return "the access token is not valid for this job"
        with self._lock:
            digests = self._digests
        if digests is None:
            return "the job's access tokens could not be read yet: retry shortly"
        presented = token_digest(token)
        if any(hmac.compare_digest(presented, digest) for digest in digests):
            return None
        return "the access token is not valid for this job (unknown, revoked or expired)"

    @property
    def known(self) -> int:
        with self._lock:
            return len(self._digests or ())


__all__ = ["DEFAULT_REFRESH_S", "TokenGate", "bearer", "token_digest"]
