"""Answers to HEAD carry headers only, on every route (API, web UI, static files, /healthz, admin).

Django answers HEAD like GET, body included, and leaves dropping the body to the server; a server that sends
it anyway (waitress does) desynchronizes a kept-alive connection: the client or proxy reads the stray body as
the start of the next response. This middleware, first in ``MIDDLEWARE``, empties the body of every HEAD
response and keeps its headers (``Content-Length`` included, so it still says what GET would send). The
hardened server (:mod:`strata.api.server`) also refuses to write body bytes after a HEAD response's headers.
"""

from __future__ import annotations


def strip_head_body(response) -> None:
    """Empty ``response``'s body in place, keeping its headers; a streamed file is closed at once."""
    if response.streaming:
        stream = getattr(response, "file_to_stream", None)
        if stream is not None and hasattr(stream, "close"):
            stream.close()
        # Other streams (generators) stay registered with the response and are closed when the handler
        # closes it at the end of the request.
        response.streaming_content = []
        return
    if not response.has_header("Content-Length"):
        response.headers["Content-Length"] = str(len(response.content))
    response.content = b""


class HeadResponseMiddleware:
    """Outermost middleware: a response to HEAD keeps its headers and loses its body."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.method == "HEAD":
            strip_head_body(response)
        return response
