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
