"""Where a serving endpoint may listen: without authentication (auth: none) only on a loopback address, unless
the node's operator opts in with ``STRATA_SERVING_INSECURE_BIND=1``. The child-process component and the
endpoint both check the bind host here.
"""

from __future__ import annotations

import ipaddress
import logging
import os

log = logging.getLogger(__name__)

# Without authentication (auth: none) binding a non-loopback interface is an operator's explicit choice.
INSECURE_BIND_ENV = "STRATA_SERVING_INSECURE_BIND"
_TRUE = {"1", "true", "yes", "on"}


class InsecureBindError(ValueError):
    """The endpoint was asked to bind a non-loopback interface without the explicit opt-in."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and the loopback addresses (127.0.0.0/8, ::1, also as ``[::1]`` or IPv4-mapped)."""
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # another host name: it could resolve to anything
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def insecure_bind_allowed() -> bool:
    """Whether the node's operator opted in to a non-loopback bind (``STRATA_SERVING_INSECURE_BIND=1``)."""
    return os.environ.get(INSECURE_BIND_ENV, "").strip().lower() in _TRUE


def check_bind_host(host: str, *, insecure: bool | None = None, source: str = "") -> None:
    """Refuse to serve on ``host`` unless it is a loopback address or ``insecure`` (default: the environment's
    opt-in) allows it: without deployment tokens (auth: none) anyone who can reach the port could call
    the model. Raises :class:`InsecureBindError` naming the fix."""
    if is_loopback(host):
        return
    if insecure is None:
        insecure = insecure_bind_allowed()
    if insecure:
        log.warning("the serving endpoint binds %r, which is not a loopback address, and has no authentication: "
                    "any process that can reach the port can call the model (%s is set)", host, INSECURE_BIND_ENV)
        return
    origin = f" (from {source})" if source else ""
    raise InsecureBindError(
        f"the serving endpoint will not bind {host!r}{origin}: it has no authentication (auth: none), so it listens on a "
        f"loopback address only (127.0.0.1, ::1 or localhost). Set {INSECURE_BIND_ENV}=1 on the node to bind "
        f"{host!r} anyway; then any process that can reach the port can call the model"
    )
