"""A short-lived, in-process cache of checked node tokens: a node's calls (a thousand nodes renew their leases
333 times a second) are not each one more token lookup, user lookup and ancestor walk.

An entry is ``digest -> (user, token)`` of a node token that :class:`BearerTokenAuthentication` found live (not
revoked, not expired, its user active, every ancestor live). It is trusted for ``STRATA_NODE_TOKEN_CACHE_SECONDS``
(5 s) and never past the token's own expiry. The bound on a revocation:

- on the server process that revokes a token (``token_revoke``, a token or user saved) the cache is emptied at
  once, through ``forget_all`` and the model signals connected in :mod:`strata.accounts.apps`;
- on every other process the revoked token's node calls stop at most ``STRATA_NODE_TOKEN_CACHE_SECONDS`` later;
- a lease renewal (``node/renew/``) checks its token's ``revoked_at`` and ``expires_at`` in its own UPDATE
  (``cluster.services.node_renew``): refused at once on every process.

Only node tokens are cached: user tokens and attempt credentials are checked on every request as before.
"""

from __future__ import annotations

import threading
import time

from django.conf import settings

MAX_ENTRIES = 10_000  # more distinct node tokens than this in one TTL: start over (a bound on memory)

_lock = threading.Lock()
_entries: dict[str, tuple[float, object, object]] = {}  # digest -> (trusted until, monotonic; user; token)


def ttl() -> float:
    return float(settings.STRATA_NODE_TOKEN_CACHE_SECONDS)


def lookup(digest: str):
    """``(user, token)`` for a node token checked less than the TTL ago and not expired since; else None."""
    entry = _entries.get(digest)
    if entry is None:
        return None
    until, user, token = entry
    if until <= time.monotonic() or token.expires_at.timestamp() <= time.time():
        with _lock:
            if _entries.get(digest) is entry:
                del _entries[digest]
        return None
    return user, token


def remember(digest: str, user, token) -> None:
    seconds = ttl()
    if seconds <= 0:
        return
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[digest] = (time.monotonic() + seconds, user, token)


def forget_all(*_args, **_kwargs) -> None:
    """Empty the cache (a token revoked or saved, a user saved): the next call of each node is checked afresh.
    Takes and ignores a signal's arguments."""
    with _lock:
        _entries.clear()
