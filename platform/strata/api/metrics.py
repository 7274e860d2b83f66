"""``/metrics`` (Prometheus) and ``/readyz`` (readiness) of the web process (docs/operations/metrics.md).

``/metrics`` answers aggregate counts only (:mod:`strata.telemetry.metrics`). When ``STRATA_METRICS_TOKEN`` is
set, it asks for ``Authorization: Bearer <token>`` (a 401 otherwise); unset, it is open like ``/healthz``.

``/readyz`` answers 200 when every check passes and 503 naming each failing one otherwise, as JSON
``{"status": "ok" | "unavailable", "checks": {name: "ok" | reason}}``:

* ``database``: ``SELECT 1`` answers;
* ``migrations``: no unapplied migration (checked until it first passes, then remembered: migrations are
  applied before the server starts, and a process does not un-apply them);
* ``broker``: the Celery broker is reachable (Redis: PING; AMQP and others: a TCP connection; the embedded
  filesystem broker: its spool directory is writable), with a 1 s timeout.
"""

from __future__ import annotations

import hmac
import os
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_safe

CHECK_TIMEOUT_S = 1.0
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6380, "amqp": 5672, "amqps": 5671, "pyamqp": 5672}


@require_safe  # GET and HEAD
def metrics(request):
    token = getattr(settings, "STRATA_METRICS_TOKEN", None)
    if token:
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            response = JsonResponse({"detail": "a metrics token is required: Authorization: Bearer <token>"},
                                    status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    from strata.telemetry.metrics import exposition

    body, content_type = exposition()
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response


# --- readiness ---------------------------------------------------------------------------------------------

_migrated = threading.Event()  # set once no migration was found unapplied


def _database() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _migrations() -> None:
    if _migrated.is_set():
        return
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{migration.app_label}.{migration.name}" for migration, _ in plan[:5])
        raise RuntimeError(f"{len(plan)} unapplied migration(s): {names}{', ...' if len(plan) > 5 else ''}")
    _migrated.set()


def _broker() -> None:
    url = settings.CELERY_BROKER_URL
    parsed = urlparse(url)
    scheme = parsed.scheme
    if scheme == "filesystem":
        spool = Path(parsed.path or ".").expanduser().resolve() / "queue"
        if not spool.is_dir():
            raise RuntimeError(f"the broker spool {spool} does not exist")
        # Writable for real (a read-only mount, a full disk): create and remove a file.
        fd, name = tempfile.mkstemp(prefix=".readyz-", dir=spool)
        os.close(fd)
        os.unlink(name)
        return
    if scheme == "memory":
        return
    if scheme in {"redis", "rediss"}:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S)
        try:
            client.ping()
        finally:
            client.close()
        return
    host, port = parsed.hostname or "localhost", parsed.port or _DEFAULT_PORTS.get(scheme)
    if port is None:
        raise RuntimeError(f"cannot check a broker of scheme {scheme!r}")
    with socket.create_connection((host, port), timeout=CHECK_TIMEOUT_S):
        pass


CHECKS = {"database": _database, "migrations": _migrations, "broker": _broker}


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}"[:300] if text else type(error).__name__


@require_safe  # GET and HEAD
def readyz(request):
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        if name == "migrations" and results.get("database") != "ok":
            results[name] = "not checked: the database does not answer"
            continue
        try:
            check()
        except Exception as error:  # noqa: BLE001 - any failure is an unready answer, never a 500
            results[name] = _reason(error)
        else:
            results[name] = "ok"
    ready = all(value == "ok" for value in results.values())
    response = JsonResponse({"status": "ok" if ready else "unavailable", "checks": results},
                            status=200 if ready else 503)
    response["Cache-Control"] = "no-store"
    return response
