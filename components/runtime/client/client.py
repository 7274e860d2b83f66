"""HTTP client for the control plane's REST API, used by node agents, attempt children and the CLI."""

from __future__ import annotations

import re
import time
from typing import Any

import requests

RETRY_STATUSES = {502, 503, 504}
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` as the control plane stores it: NUL characters and lone surrogates (which it refuses with a
    400) become U+FFFD, so one odd byte in a job's output never blocks its reports."""
    return _UNSTORABLE.sub("\ufffd", text)


class ApiError(Exception):
    """The control plane answered with an error. ``status`` is the HTTP status (0: unreachable)."""

    def __init__(self, status: int, message: str, payload: Any = None):
        self.status, self.message, self.payload = status, message, payload
        super().__init__(message)


def _plain_text(body: str, limit: int = 200) -> str:
    """A non-JSON error body (a proxy's HTML page, say) as one short line: its title, else its text."""
    title = re.search(r"<title[^>]*>(.*?)</title>", body, re.IGNORECASE | re.DOTALL)
    text = title.group(1) if title else re.sub(r"<[^>]+>", " ", body)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(response: requests.Response) -> tuple[str, Any]:
    try:
        payload = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {_plain_text(response.text)}", None
    if isinstance(payload, dict) and "detail" in payload and len(payload) == 1:
        return f"HTTP {response.status_code}: {payload['detail']}", payload
    if isinstance(payload, dict):
        parts = [f"{field}: {' '.join(map(str, msgs)) if isinstance(msgs, list) else msgs}"
                 for field, msgs in payload.items()]
        return f"HTTP {response.status_code}: " + "; ".join(parts), payload
    return f"HTTP {response.status_code}: {payload}", payload


class ControlPlaneClient:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0, retries: int = 3):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["User-Agent"] = "strata"

    def request(self, method: str, path: str, *, raw: bool = False, retries: int | None = None, **kwargs):
        url = path if path.startswith("http") else f"{self.url}/api/v1/{path.lstrip('/')}"
        kwargs.setdefault("timeout", self.timeout)
        attempts = self.retries if retries is None else retries
        delay = 0.2
        for attempt in range(attempts + 1):
            try:
                response = self.session.request(method, url, **kwargs)
            except requests.RequestException as error:
                if attempt >= attempts:
                    raise ApiError(0, f"cannot reach the control plane at {self.url}: {error.__class__.__name__}") from None
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= attempts:
                    break
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        if response.status_code >= 400:
            message, payload = _describe(response)
            raise ApiError(response.status_code, message, payload)
        if raw:
            return response
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, json: Any = None, **kwargs):
        return self.request("POST", path, json=json, **kwargs)

    def delete(self, path: str, **kwargs):
        return self.request("DELETE", path, **kwargs)


# --- participants: a machine outside the cluster in a running job (strata.jobs.participants) ------------------

def participant_join(url: str, job_id: str, token: str, *, name: str = "", gpus: float = 0.0,
                     info: dict[str, Any] | None = None, retries: int = 1) -> dict[str, Any]:
    """Join running job ``job_id`` with one of its access tokens (``POST /api/v1/participants/``). Returns the
    answer: ``{"id", "name", "gpus", "secret", "job": {"id", "kind", "spec", "state"}, "payload", "public_key",
    "heartbeat_s", "lease_s"}``; :class:`ApiError` with the API's one-line message otherwise (401: not a working
    token of that job; 400: bad fields, or a kind that takes no participants; 409: the job is not running, or the
    team's quota has no room for ``gpus``). Few retries: a join that reached the server twice leaves a participant
    that is lost after its lease."""
    body = {"job": str(job_id), "name": name, "gpus": float(gpus), "info": info or {}}
    return ControlPlaneClient(url, token, retries=retries).post("participants/", body)


class ParticipantClient(ControlPlaneClient):
    """The routes of one participant, authenticated with its secret (from the join's answer)."""

    def __init__(self, url: str, participant_id: str, secret: str, **kwargs):
        super().__init__(url, secret, **kwargs)
        self.participant_id = str(participant_id)

    def heartbeat(self, *, metrics: dict[str, float] | None = None, info: dict[str, Any] | None = None,
                  subject: str | None = None) -> dict[str, Any]:
        """``{"state": "run" | "stop", "reason", "credential"?}``; ``metrics`` and ``info`` replace the stored ones,
        ``subject`` asks for a job credential for that identity."""
        body: dict[str, Any] = {}
        if metrics is not None:
            body["metrics"] = metrics
        if info is not None:
            body["info"] = info
        if subject is not None:
            body["subject"] = subject
        return self.post(f"participants/{self.participant_id}/heartbeat/", body)

    def leave(self) -> dict[str, Any]:
        return self.post(f"participants/{self.participant_id}/leave/", {})

