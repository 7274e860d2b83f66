"""plotly.js, served from the copy inside the installed ``plotly`` package: pages never need a CDN."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib.resources import files

from django.http import FileResponse, Http404, HttpResponseNotModified
from django.views.decorators.http import require_GET


@lru_cache(maxsize=1)
def plotly_bundle() -> tuple[str, str]:
    """(path, etag) of plotly.min.js in the plotly package."""
    try:
        path = files("plotly") / "package_data" / "plotly.min.js"
    except ModuleNotFoundError as error:
        raise Http404("the plotly package is not installed") from error
    if not path.is_file():
        raise Http404("plotly.min.js is missing from the plotly package")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return str(path), f'"{digest}"'


@require_GET
def plotly_js(request):
    path, etag = plotly_bundle()
    if request.headers.get("If-None-Match") == etag:
        return HttpResponseNotModified()
    response = FileResponse(open(path, "rb"), content_type="text/javascript; charset=utf-8")
    response["ETag"] = etag
    response["Cache-Control"] = "public, max-age=86400"
    return response
