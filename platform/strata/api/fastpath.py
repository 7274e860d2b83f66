"""The node's lease renewal answered before Django's request handling.

``POST /api/v1/node/renew/`` (:mod:`strata.cluster.api.renewal`) is the call a thousand nodes make 333 times a
second. Through Django it would still pay for building an ``HttpRequest``, thirteen middlewares (sessions, CSRF,
messages, security headers: none of which a bearer-token node call needs) and URL resolution. The WSGI
application the server runs (:mod:`strata.wsgi`) is wrapped in :class:`NodeFastPath`, which hands that one path
straight to :func:`strata.cluster.api.renewal.wsgi_renew` when it carries an ``Authorization`` header (a node's
call); every other request (a browser session's, say) goes to Django unchanged. Inside
Django the same route is served by ``renewal.RenewView`` (tests, another WSGI server without the wrapper).
"""

from __future__ import annotations


class NodeFastPath:
    def __init__(self, application):
        from strata.cluster.api.renewal import PATH, wsgi_renew

        self.application, self.path, self.renew = application, PATH, wsgi_renew

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == self.path and environ.get("HTTP_AUTHORIZATION") and not environ.get("SCRIPT_NAME"):
            return self.renew(environ, start_response)
        return self.application(environ, start_response)
