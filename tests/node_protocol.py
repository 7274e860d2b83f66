"""The node protocol, spoken as a node agent speaks it: the calls about one attempt
(``/api/v1/node/attempts/<id>/...``) and the node's own (``heartbeat``, ``renew``, ``drain``, ``leave``). One
client instead of each test's own URLs, ``{"node", "token"}`` and ``{"node", "session"}`` dicts and claim calls.
Importable from every test as ``node_protocol`` (pytest's ``pythonpath`` in pyproject.toml); conftest's
``node_protocol`` fixture builds one on the node token.

An attempt's call carries the node's id and the attempt's fencing token where the route reads them: in the query
of a GET, of a PUT (an artifact's bytes) and of a POST to the upload session's routes (``uploads/...``), in the
JSON body of every other POST. A node's own call carries the node's id and its session in the body. A call may
name another ``node``, ``token`` or ``session`` (a stale fencing token, a stranger's node, a replaced session),
and :meth:`NodeProtocol.of` speaks for another attempt, so tests of the fencing still send the wrong one."""

from __future__ import annotations

from urllib.parse import urlencode

NODE_API = "/api/v1/node"
ATTEMPTS = f"{NODE_API}/attempts"
QUERY_AUTH_POSTS = ("uploads",)  # the POST routes that read node and token from the query, not the body


class NodeProtocol:
    """Speaks the node protocol for one attempt as a node agent would: through ``client`` (a DRF APIClient with
    the node token, or an attempt credential), with the node's id (the attempt's own node unless ``node`` is
    given) and the attempt's fencing token (unless ``token`` is given) on every request. Without an attempt it
    speaks for ``node`` alone (its own routes only)."""

    def __init__(self, client, attempt=None, node=None, token: str | None = None):
        self.client, self.attempt, self.node, self.token = client, attempt, node, token
        self.claimed: dict | None = None

    def of(self, attempt, node=None, token: str | None = None) -> NodeProtocol:
        """The same client speaking for another attempt (of its own node unless ``node`` is given)."""
        return NodeProtocol(self.client, attempt, node, token)

    def through(self, client) -> NodeProtocol:
        """The same calls sent through another client (the attempt's credential, a user's token, no token)."""
        return NodeProtocol(client, self.attempt, self.node, self.token)

    def auth_for(self, node=None, token: str | None = None) -> dict:
        """``{"node", "token"}`` as the routes read them; ``node`` (a Node, or an id) and ``token`` override."""
        node = node or self.node or self.attempt.node_id
        return {"node": str(getattr(node, "pk", node)), "token": token or self.token or self.attempt.fencing_token}

    @property
    def auth(self) -> dict:
        """``{"node": <the node's id>, "token": <the fencing token>}``."""
        return self.auth_for()

    def url(self, route: str = "", **query) -> str:
        """``/api/v1/node/attempts/<id>/<route>/``, with ``query`` (as given: no auth added) after it."""
        path = f"{ATTEMPTS}/{self.attempt.pk}/" + (f"{route.strip('/')}/" if route else "")
        return f"{path}?{urlencode(query)}" if query else path

    def get(self, route: str, *, node=None, token: str | None = None, **params):
        """GET ``route`` with the auth and ``params`` in the query."""
        return self.client.get(self.url(route), {**self.auth_for(node, token), **params})

    def post(self, route: str, body: dict | None = None, *, node=None, token: str | None = None, **query):
        """POST ``body`` as JSON to ``route``: the auth goes into the body, or into the query on the routes that
        read it there (the upload session's); ``query`` always goes into the query."""
        auth = self.auth_for(node, token)
        if route.strip("/").split("/")[0] in QUERY_AUTH_POSTS:
            return self.client.post(self.url(route, **auth, **query), body or {}, format="json")
        return self.client.post(self.url(route, **query), {**auth, **(body or {})}, format="json")

    def put(self, route: str, data: bytes, *, node=None, token: str | None = None,
            content_type: str = "application/octet-stream", **query):
        """PUT raw bytes to ``route`` (an artifact: ``artifacts/<name>``, ``kind=checkpoint`` for a checkpoint),
        the auth and ``query`` in the query."""
        return self.client.generic("PUT", self.url(route, **self.auth_for(node, token), **query), data,
                                   content_type=content_type)

    def claim(self, *, node=None, token: str | None = None, **body):
        """Claim the attempt (the node starts it). A 200's answer (the job, its allocations, the attempt's
        credential) is kept as ``claimed``."""
        response = self.post("claim", body, node=node, token=token)
        if response.status_code == 200:
            self.claimed = response.json()
        return response

    def report(self, *, node=None, token: str | None = None, **body):
        """Report ``logs``, ``metrics``, ``endpoint`` or ``reports``; the answer says whether to stop."""
        return self.post("report", body, node=node, token=token)

    def finish(self, outcome: str = "succeeded", *, node=None, token: str | None = None, **body):
        """End the attempt with ``outcome`` (and ``reason``); the answer is the job's state."""
        return self.post("finish", {"outcome": outcome, **body}, node=node, token=token)

    def node_post(self, route: str, body: dict | None = None, *, node=None, session=None):
        """POST ``body`` to one of the node's own routes (``heartbeat``, ``renew``, ``drain``, ``leave``) with
        ``{"node", "session"}``: the node's (a Node) current session unless ``session`` is given."""
        node = node or self.node or self.attempt.node
        return self.client.post(f"{NODE_API}/{route.strip('/')}/",
                                {"node": str(node.pk), "session": str(session or node.session), **(body or {})},
                                format="json")

    def heartbeat(self, *, node=None, session=None, **body):
        """A heartbeat (``samples``, ``attempts``, ``reports``); the answer names the attempts to stop."""
        return self.node_post("heartbeat", body, node=node, session=session)
