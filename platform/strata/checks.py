"""Strata's production checks: Django system checks with the ``deploy`` tag, so ``strata check --deploy`` and
``manage.py check --deploy`` report them next to Django's own (docs/operations/production.md lists every id).

They run only with ``--deploy``: the broker check opens a connection (2 s timeout), and so does the artifact
storage check where it is an object store; nothing else does.
"""

from __future__ import annotations

import ipaddress
import math
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Tags, Warning, register

DOCS = "docs/operations/production.md"
LOOPBACK_NAMES = {"localhost", "testserver", "[::1]", "::1"}
BROKER_TIMEOUT_S = 2.0
SECRET_KEY_MIN_BITS = 256


def _warning(number: str, message: str, hint: str) -> Warning:
    return Warning(message, hint=f"{hint} ({DOCS})", id=f"strata.W{number}")


def _loopback(host: str) -> bool:
    host = host.strip().lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# --- broker ------------------------------------------------------------------------------------------------

def redis_persistence(url: str, timeout: float = BROKER_TIMEOUT_S) -> bool | None:
    """Whether the Redis at ``url`` keeps its data across a restart (AOF or RDB snapshots): ``None`` when it
    cannot be told (unreachable, ``CONFIG`` disabled or renamed, no ``redis`` package)."""
    try:
        import redis
    except ImportError:
        return None
    # RESP2: every Redis (and work-alike) speaks it.
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, protocol=2)
    try:
        appendonly = client.config_get("appendonly").get("appendonly", "")
        save = client.config_get("save").get("save", "")
    except Exception:  # noqa: BLE001 - unreachable, refused, or an odd answer: it cannot be told
        return None
    finally:
        client.close()
    return str(appendonly).lower() == "yes" or bool(str(save).strip())


@register(Tags.compatibility, "strata", deploy=True)
def check_broker(app_configs=None, **kwargs) -> list:
    url = settings.CELERY_BROKER_URL
    scheme = urlsplit(url).scheme
    if scheme == "filesystem":
        return [_warning("001", "The broker is the embedded filesystem broker: it keeps messages on this "
                                "machine's disk, so every scheduler and node must run on this one host.",
                         "For several hosts set STRATA_BROKER_URL=redis://... (with persistence) or amqp://...")]
    if scheme in {"redis", "rediss"}:
        persistent = redis_persistence(url)
        if persistent is None:
            return [_warning("003", "Could not verify that the Redis broker keeps its data across a restart "
                                    "(unreachable within 2 s, or CONFIG is disabled).",
                             "Make sure Redis runs with appendonly yes (or RDB snapshots), or silence "
                             "strata.W003 once verified")]
        if not persistent:
            return [_warning("002", "The Redis broker runs without persistence (appendonly no, no save "
                                    "points): a Redis restart loses queued dispatches until the reconciler "
                                    "republishes them.",
                             "Run Redis with --appendonly yes")]
        return []
    if scheme in {"amqp", "amqps", "pyamqp"}:
        from components.runtime.shared.broker import COMMON_CELERY_SETTINGS

        # Celery declares durable queues and sends persistent messages unless told otherwise.
        if COMMON_CELERY_SETTINGS.get("task_default_delivery_mode", "persistent") not in {"persistent", 2}:
            return [_warning("004", "AMQP messages are sent transient: a broker restart loses them.",
                             "Keep Celery's default persistent delivery mode")]
    return []


# --- database, secret key, cache, leader lease ---------------------------------------------------------------

@register(Tags.database, "strata", deploy=True)
def check_database(app_configs=None, **kwargs) -> list:
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        return [_warning("010", "The database is SQLite in STRATA_HOME: one machine only, and one writer at "
                                "a time.",
                         "Set STRATA_DATABASE_URL=postgres://... for production and for several replicas")]
    return []


@register(Tags.security, "strata", deploy=True)
def check_node_sandboxes(app_configs=None, **kwargs) -> list:
    """Nodes that run a team's code without the sandbox (``strata node --sandbox``, reported at registration)."""
    from django.db import DatabaseError

    from strata.cluster.models import Node

    try:
        nodes = [(node.name, (node.info or {}).get("sandbox") or "unknown")
                 for node in Node.objects.exclude(state=Node.State.DOWN).only("name", "info")]
    except DatabaseError:  # not migrated yet: nothing registered
        return []
    open_nodes = sorted(f"{name} ({mode})" for name, mode in nodes if mode != "bwrap")
    if not open_nodes:
        return []
    shown = ", ".join(open_nodes[:5]) + (f" and {len(open_nodes) - 5} more" if len(open_nodes) > 5 else "")
    return [_warning("070", f"The sandbox is off on {len(open_nodes)} node(s): {shown}. A job's code runs there "
                            "with the node agent's privileges and can read the node token.",
                     "Install bubblewrap on those nodes (make install, or Debian's bubblewrap) and start them with "
                     "--sandbox bwrap (docs/security.md)")]


def secret_key_bits(key: str) -> float:
    """A rough upper bound on a key's entropy: its length times log2 of its number of distinct characters."""
    distinct = len(set(key))
    return len(key) * math.log2(distinct) if distinct > 1 else 0.0


@register(Tags.security, "strata", deploy=True)
def check_secret_key(app_configs=None, **kwargs) -> list:
    from strata.conf import env_str

    problems = []
    if not env_str("STRATA_SECRET_KEY"):
        problems.append(_warning(
            "020", "STRATA_SECRET_KEY is not set: the key is generated into STRATA_HOME/secret_key, which is "
                   "fine on one machine, but every web replica must share one key (sessions, CSRF, and the "
                   "job credentials derived from it).",
            "Set STRATA_SECRET_KEY_FILE (or STRATA_SECRET_KEY) to the same secret on every replica"))
    if secret_key_bits(str(settings.SECRET_KEY)) < SECRET_KEY_MIN_BITS:
        problems.append(_warning(
            "021", f"The secret key holds less than {SECRET_KEY_MIN_BITS} bits of entropy.",
            "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(64))'"))
    return problems


@register(Tags.caches, "strata", deploy=True)
def check_cache(app_configs=None, **kwargs) -> list:
    if settings.CACHES["default"]["BACKEND"].endswith("LocMemCache"):
        return [_warning("050", "The cache is in each process's memory: request throttles (submits) are "
                                "counted per web replica, not for the cluster.",
                         "Set STRATA_CACHE_URL=redis://... shared by every replica")]
    return []


@register("strata", deploy=True)
def check_leader_lease(app_configs=None, **kwargs) -> list:
    if settings.STRATA_LEADER_LEASE_SECONDS < 3 * settings.STRATA_SCHEDULER_TICK_SECONDS:
        return [_warning("060", "STRATA_LEADER_LEASE_SECONDS is under three scheduler ticks: the leader may "
                                "lose its lease between two renewals and leadership flaps.",
                         "Keep STRATA_LEADER_LEASE_SECONDS >= 3 x STRATA_SCHEDULER_TICK_SECONDS")]
    return []


# --- artifact storage ------------------------------------------------------------------------------------

@register("strata", deploy=True)
def check_artifact_storage(app_configs=None, **kwargs) -> list:
    """Object storage (``STRATA_ARTIFACT_STORAGE`` other than local disk): its bucket answers (2 s, one try)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import import_string

    from strata.jobs.storage import LocalArtifactStorage, StorageUnavailable

    try:
        backend = import_string(settings.STRATA_ARTIFACT_STORAGE)
        if isinstance(backend, type) and issubclass(backend, LocalArtifactStorage):
            return []
        backend().check()
    except (ImportError, ImproperlyConfigured, StorageUnavailable) as error:
        return [_warning("080", f"The artifact storage ({settings.STRATA_ARTIFACT_STORAGE}) cannot be used: "
                                f"{error}. Uploads and downloads of artifacts, checkpoints, code and data "
                                "would fail (503).",
                         "Check STRATA_S3_ENDPOINT, STRATA_S3_BUCKET (created beforehand) and the credentials "
                         "(docs/operations.md#object-storage-s3)")]
    return []


# --- hosts and HTTPS ---------------------------------------------------------------------------------------

@register(Tags.security, "strata", deploy=True)
def check_hosts(app_configs=None, **kwargs) -> list:
    problems = []
    hosts = list(settings.ALLOWED_HOSTS)
    public = urlsplit(settings.STRATA_PUBLIC_URL)
    if "*" in hosts:
        problems.append(_warning("030", "ALLOWED_HOSTS accepts any host ('*').",
                                 "List the public host name: STRATA_ALLOWED_HOSTS=strata.example.org"))
    elif hosts and all(_loopback(host) for host in hosts):
        problems.append(_warning("031", "ALLOWED_HOSTS lists loopback names only: nothing but this machine "
                                        "can reach the control plane by name.",
                                 "Set STRATA_ALLOWED_HOSTS to the public host name(s)"))
    if public.hostname and hosts and "*" not in hosts:
        from django.http.request import validate_host

        if not validate_host(public.hostname, hosts):
            problems.append(_warning("032", f"The host of STRATA_PUBLIC_URL ({public.hostname}) is not in "
                                            "ALLOWED_HOSTS: requests to it are refused (400).",
                                     "Add it to STRATA_ALLOWED_HOSTS"))
    return problems


@register(Tags.security, "strata", deploy=True)
def check_https(app_configs=None, **kwargs) -> list:
    problems = []
    public = urlsplit(settings.STRATA_PUBLIC_URL)
    if public.scheme != "https":
        problems.append(_warning("040", f"STRATA_PUBLIC_URL ({settings.STRATA_PUBLIC_URL}) is not https: "
                                        "passwords, session cookies and tokens cross the network in clear.",
                                 "Put a TLS proxy in front and set STRATA_PUBLIC_URL=https://... and "
                                 "STRATA_HTTPS=1"))
    if settings.SECURE_SSL_REDIRECT and not settings.SECURE_PROXY_SSL_HEADER:
        problems.append(_warning("041", "HTTPS redirects are on but SECURE_PROXY_SSL_HEADER is not set: "
                                        "strata server never sees TLS itself (the proxy ends it), so every "
                                        "request would be redirected again.",
                                 "Set STRATA_SECURE_PROXY_SSL_HEADER=X-Forwarded-Proto (a header the proxy "
                                 "always overwrites)"))
    if public.scheme == "https":
        origin = f"{public.scheme}://{public.netloc}"
        if origin not in settings.CSRF_TRUSTED_ORIGINS:
            problems.append(_warning("042", f"CSRF_TRUSTED_ORIGINS does not hold the public origin {origin}.",
                                     "Add it to STRATA_CSRF_TRUSTED_ORIGINS"))
    return problems


@register(Tags.security, "strata", deploy=True)
def check_sign_in(app_configs=None, **kwargs) -> list:
    """Single sign-on (strata.accounts.oidc): a configuration nobody can log in with, or an admin group that
    never applies."""
    problems = []
    sso = bool(settings.STRATA_OIDC_ISSUER and settings.STRATA_OIDC_CLIENT_ID)
    if not settings.STRATA_PASSWORD_LOGIN and not sso:
        problems.append(_warning("090", "STRATA_PASSWORD_LOGIN is off and single sign-on is not configured: nobody "
                                        "can log in to the web UI.",
                                 "Set STRATA_OIDC_ISSUER and STRATA_OIDC_CLIENT_ID, or STRATA_PASSWORD_LOGIN=true"))
    if sso and settings.STRATA_OIDC_ADMIN_GROUP and not settings.STRATA_OIDC_TEAM_CLAIM:
        problems.append(_warning("091", "STRATA_OIDC_ADMIN_GROUP is set but STRATA_OIDC_TEAM_CLAIM is not: the "
                                        "admin group is looked for in that claim, so no login makes an admin.",
                                 "Set STRATA_OIDC_TEAM_CLAIM (e.g. groups)"))
    return problems
