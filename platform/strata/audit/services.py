"""Writing the audit log: :func:`record`, the one way an entry is made (docs/architecture.md, *Audit log*).

Call it inside the transaction of the action it records (``transaction.atomic()`` around both), so that the
entry exists exactly when the action committed: a failed write of the entry fails the action, a rolled back
action takes its entry with it. Actions are dotted strings, the first word the subject ("login.failure",
"token.create", "quota.change"); filters match them by prefix.
"""

from __future__ import annotations

import getpass
import socket
from typing import Any

from strata.accounts.login_guard import client_ip
from strata.audit.models import AuditEntry

TARGET_CHARS = 200
NAME_CHARS = 150
AGENT_CHARS = 256


def local_actor(command: str = "strata") -> str:
    """The actor of a write made straight in the database by an operator's command on a server (no request,
    no user): the operating-system user and host, and the command."""
    try:
        who = getpass.getuser()
    except Exception:  # no user name in this environment (a container without a passwd entry)
        who = "?"
    return f"{who}@{socket.gethostname()} ({command})"[:NAME_CHARS]


def _actor(request, actor) -> tuple[Any, str]:
    """(the user or None, the name kept) for ``actor``: a user, a plain name (a process: "strata-cli",
    "scheduler"), or None for the request's authenticated user (else nobody)."""
    if actor is None and request is not None:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            actor = user
    if actor is None:
        return None, ""
    if isinstance(actor, str):
        return None, actor[:NAME_CHARS]
    return actor, str(actor.get_username())[:NAME_CHARS]


def record(action: str, *, request=None, actor=None, team=None, target: str = "", before: Any = None,
           after: Any = None) -> AuditEntry:
    """Append one entry to the audit log and return it.

    ``actor`` defaults to ``request.user`` (when authenticated); it may be a user or a name. ``team`` is a Team
    (or None). ``target`` names the object acted on ("job 1234", "token ab12cd34"). ``before`` and ``after`` are
    JSON-able (dates and decimals are encoded) and must never hold a secret value. The client address and user
    agent come from ``request`` (the address as the login guard reads it: X-Forwarded-For only behind
    ``STRATA_NUM_PROXIES`` proxies).
    """
    user, name = _actor(request, actor)
    meta = getattr(request, "META", None) or {}
    return AuditEntry.objects.create(
        action=action, actor=user, actor_name=name, team=team, team_slug=getattr(team, "slug", "") or "",
        target=str(target or "")[:TARGET_CHARS], before=before, after=after,
        address=(client_ip(request) or "") if request is not None else "",
        user_agent=str(meta.get("HTTP_USER_AGENT", ""))[:AGENT_CHARS],
    )
