"""``POST /api/v1/node/renew/``: the lean lease renewal of a node agent, a plain Django view.

A node renews its lease every heartbeat interval (3 s): with a thousand nodes that is 333 calls a second, and what
each carries is worth little -- "still here, still this session, still running these attempts". So this route
does no more than that: the node token from the in-process cache (:mod:`strata.accounts.node_tokens`), the body
read with ``json`` and checked by hand (no DRF request, serializer or renderer), and one fenced
``UPDATE ... RETURNING`` (:func:`strata.cluster.services.node_renew`). Its answer is the heartbeat's
(``lease_seconds``, ``stop``, ``sharing_policy``, ``state``, ``telemetry_seconds``; ``stalled`` and
``attempts_left`` when they apply). The device samples and plugins' reports go with the full heartbeat
(``node/heartbeat/``), every ``telemetry_seconds``.

:func:`renew` is the whole route, without Django's request: the server's WSGI fast path
(:mod:`strata.api.fastpath`) calls it before Django's middleware, and :class:`RenewView` serves it inside Django
(the test client, another WSGI server).
"""

from __future__ import annotations

import json
import uuid

from django.http import HttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

MAX_BODY = 128 * 1024  # node, session and at most MAX_ATTEMPTS ids
MAX_ATTEMPTS = 1024
PATH = "/api/v1/node/renew/"


def _error(status: int, detail, headers: dict | None = None) -> tuple[int, dict, dict]:
    return status, (detail if isinstance(detail, dict) else {"detail": detail}), headers or {}


def _authenticate(authorization: str | None):
    """``(token, None)`` for a live node token, else ``(None, error)``."""
    from rest_framework import exceptions

    from strata.accounts import node_tokens
    from strata.accounts.authentication import BearerTokenAuthentication
    from strata.accounts.models import ApiToken, token_digest

    challenge = {"WWW-Authenticate": "Bearer"}
    parts = (authorization or "").split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None, _error(401, "A node token is required.", challenge)
    cached = node_tokens.lookup(token_digest(parts[1]))
    if cached is not None:
        return cached[1], None
    shim = _Headers(authorization)
    try:
        found = BearerTokenAuthentication().authenticate(shim)
    except exceptions.AuthenticationFailed as error:
        return None, _error(401, str(error.detail), challenge)
    token = found[1] if found else None
    if not isinstance(token, ApiToken) or token.kind != ApiToken.Kind.NODE:
        return None, _error(403, "A node token is required.")
    return token, None


class _Headers:
    """Just enough of a request for ``BearerTokenAuthentication`` (it reads the ``Authorization`` header)."""

    def __init__(self, authorization: str):
        self.headers = {"authorization": authorization}
        self.META = {"HTTP_AUTHORIZATION": authorization}


def _uuid(value, field: str, errors: dict) -> str | None:
    try:
        return str(uuid.UUID(str(value))) if isinstance(value, str) else None
    except ValueError:
        pass
    errors[field] = ["Must be a valid UUID."]
    return None


def renew(authorization: str | None, body: bytes) -> tuple[int, dict, dict]:
    """The route: ``(status, JSON answer, extra headers)`` for a request's ``Authorization`` header and body."""
    from strata.cluster import services

    token, refused = _authenticate(authorization)
    if refused:
        return refused
    if len(body) > MAX_BODY:
        return _error(413, f"The body is larger than {MAX_BODY} bytes.")
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return _error(400, "The body is not JSON.")
    if not isinstance(data, dict):
        return _error(400, {"non_field_errors": ["Must be an object."]})
    errors: dict = {}
    node = _uuid(data.get("node"), "node", errors)
    session = _uuid(data.get("session"), "session", errors)
    attempts = data.get("attempts", [])
    if not isinstance(attempts, list) or len(attempts) > MAX_ATTEMPTS:
        errors["attempts"] = [f"Must be a list of at most {MAX_ATTEMPTS} attempt ids."]
    else:
        ids = [_uuid(item, "attempts", errors) for item in attempts]
    if errors:
        return 400, errors, {}
    try:
        return 200, services.node_renew(node, session, ids, token_id=token.pk), {}
    except services.NodeUnknown:
        return _error(404, "unknown node")
    except services.StaleSession as error:
        return _error(409, str(error))
    except services.TokenRefused as error:
        return _error(401, str(error), {"WWW-Authenticate": "Bearer"})


@method_decorator(csrf_exempt, name="dispatch")
class RenewView(View):
    """The route inside Django (the test client, or a server without the fast path)."""

    http_method_names = ["post"]

    def post(self, request):
        authorization = request.META.get("HTTP_AUTHORIZATION")
        if not authorization and getattr(request, "user", None) is not None and request.user.is_authenticated:
            return _respond(403, {"detail": "A node token is required."}, {})  # a browser session, as DRF answers
        return _respond(*renew(authorization, request.body))

    def http_method_not_allowed(self, request, *args, **kwargs):
        return _respond(405, {"detail": f'Method "{request.method}" not allowed.'}, {"Allow": "POST"})


def _respond(status: int, answer: dict, headers: dict) -> HttpResponse:
    response = HttpResponse(json.dumps(answer), status=status, content_type="application/json")
    for name, value in headers.items():
        response[name] = value
    return response


def wsgi_renew(environ, start_response):
    """The route as a WSGI application (:mod:`strata.api.fastpath`): Django's database connections are looked
    after as its request handler does (old or broken ones closed before and after)."""
    from django.core import signals

    method = environ.get("REQUEST_METHOD", "")
    if method != "POST":
        status, answer, headers = 405, {"detail": f'Method "{method}" not allowed.'}, {"Allow": "POST"}
    else:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            status, answer, headers = _error(413, f"The body is larger than {MAX_BODY} bytes.")
        else:
            signals.request_started.send(sender=wsgi_renew, environ=environ)
            try:
                status, answer, headers = renew(environ.get("HTTP_AUTHORIZATION"),
                                                environ["wsgi.input"].read(length) if length else b"")
            finally:
                signals.request_finished.send(sender=wsgi_renew)
    payload = json.dumps(answer).encode()
    start_response(f"{status} {_REASONS.get(status, 'Error')}",
                   [("Content-Type", "application/json"), ("Content-Length", str(len(payload))),
                    *headers.items()])
    return [payload]


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Request Entity Too Large"}
