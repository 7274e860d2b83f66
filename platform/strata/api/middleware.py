"""Checks applied to every request before any body is read: size limits, the body's charset, and text in
the path and query string that could not be stored."""

from __future__ import annotations

import codecs

from django.conf import settings
from django.http import JsonResponse
from django.utils.http import parse_header_parameters

from strata.api.values import safe_name, text_problem

UPLOAD_PATH_MARKER = "/artifacts/"
CODE_UPLOAD_PATH = "/api/v1/code/"
CODE_ARCHIVE_SLACK = 16 * 2**20  # a zip or tar of a bundle at the limit is somewhat larger than its files
DATA_UPLOAD_PREFIX = "/api/v1/uploads/"  # PUT .../uploads/{id}/chunks/{n}/: one chunk of a data set


def body_limit(path: str) -> int:
    """The largest body a request to ``path`` may carry: artifact uploads from nodes have their own, larger limit.
    The HTTP server asks it too (``strata.api.server``), so a larger ``Content-Length`` is answered 413 as soon as
    the headers arrive, before any of the body is read."""
    is_upload = path.startswith("/api/v1/node/") and UPLOAD_PATH_MARKER in path
    if path == CODE_UPLOAD_PATH:  # code bundles: their own limit (STRATA_MAX_CODE_BYTES)
        return max(settings.STRATA_MAX_CODE_BYTES + CODE_ARCHIVE_SLACK, settings.STRATA_MAX_BODY_BYTES)
    if path.startswith(DATA_UPLOAD_PREFIX) and "/chunks/" in path:  # a data set's chunk: STRATA_MAX_DATA_CHUNK_BYTES
        return max(settings.STRATA_MAX_DATA_CHUNK_BYTES, settings.STRATA_MAX_BODY_BYTES)
    return settings.STRATA_MAX_UPLOAD_BYTES if is_upload else settings.STRATA_MAX_BODY_BYTES


class BodySizeLimitMiddleware:
    """Answer 413 for bodies over the limit (artifact uploads from nodes have their own, larger limit)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Content-Length is not a number."}, status=400)
        if length < 0:  # Django would read it as an empty body
            return JsonResponse({"detail": "Content-Length is negative."}, status=400)
        limit = body_limit(request.path)
        if length > limit:
            return JsonResponse({"detail": f"Request body of {length} bytes exceeds the {limit} byte limit."},
                                status=413)
        return self.get_response(request)


def charset_problem(content_type: str) -> str | None:
    """Why a request's ``Content-Type`` charset cannot decode text (unknown, or a codec such as rot13, hex or
    zlib that is not a text encoding), or None."""
    _, params = parse_header_parameters(content_type or "")
    charset = params.get("charset")
    if charset is None:
        return None
    try:
        info = codecs.lookup(charset)
    except LookupError:
        return f"unknown charset {safe_name(charset)!r}"
    if not getattr(info, "_is_text_encoding", True):
        return f"charset {safe_name(charset)!r} is not a text encoding"
    return None


class RequestTextMiddleware:
    """415 for a body whose charset is not a text encoding (Django would fail on it with a 500 when the form
    or JSON body is decoded); 400 for a path, header (cookies included) or query parameter holding text that
    cannot be stored (a NUL character: PostgreSQL refuses it in a query, which would be a 500)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if problem := charset_problem(request.META.get("CONTENT_TYPE", "")):
            return JsonResponse({"detail": f"Unsupported Content-Type: {problem}; send UTF-8."}, status=415)
        if problem := text_problem(request.path):
            return JsonResponse({"detail": f"The URL path {problem}."}, status=400)
        for key, value in request.META.items():
            if key.startswith("HTTP_") and isinstance(value, str) and "\x00" in value:
                header = key[5:].replace("_", "-").title()
                return JsonResponse({"detail": f"The {header} header contains a NUL character."}, status=400)
        for name, value in request.COOKIES.items():
            if "\x00" in name or "\x00" in value:
                return JsonResponse({"detail": f"Cookie {safe_name(name)} contains a NUL character."}, status=400)
        for key, values in request.GET.lists():
            for text in (key, *values):
                if problem := text_problem(text):
                    return JsonResponse({safe_name(key): [f"query parameter {problem}"]}, status=400)
        return self.get_response(request)


class ProbeMiddleware:
    """``/healthz``, ``/readyz`` and ``/metrics`` answer whatever ``Host`` a request names: load balancers,
    Kubernetes probes and Prometheus call a replica by its pod or host address, which ``ALLOWED_HOSTS`` (the
    public names) does not list, and Django's host check would answer them 400. These three views read nothing
    from the host and reveal no team data (``/metrics`` has its own optional token), so they are answered here,
    before any middleware that validates the host; every other path still is validated."""

    VIEWS = {"/healthz": "strata.urls.health", "/readyz": "strata.api.metrics.readyz",
             "/metrics": "strata.api.metrics.metrics"}

    def __init__(self, get_response):
        from django.utils.module_loading import import_string

        self.get_response = get_response
        self.views = {path: import_string(view) for path, view in self.VIEWS.items()}

    def __call__(self, request):
        view = self.views.get(request.path_info)
        if view is not None and request.method in ("GET", "HEAD"):
            response = view(request)
            if not response.streaming and not response.has_header("Content-Length"):
                response["Content-Length"] = str(len(response.content))  # as CommonMiddleware would: keep-alive
            return response
        return self.get_response(request)
