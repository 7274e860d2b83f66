"""Request-size limits applied before any body is read."""

from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse

UPLOAD_PATH_MARKER = "/artifacts/"


class BodySizeLimitMiddleware:
    """Answer 413 for bodies over the limit (artifact uploads from nodes have their own, larger limit)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Content-Length is not a number."}, status=400)
        is_upload = request.path.startswith("/api/v1/node/") and UPLOAD_PATH_MARKER in request.path
        limit = settings.STRATA_MAX_UPLOAD_BYTES if is_upload else settings.STRATA_MAX_BODY_BYTES
        if length > limit:
            return JsonResponse({"detail": f"Request body of {length} bytes exceeds the {limit} byte limit."},
                                status=413)
        return self.get_response(request)
