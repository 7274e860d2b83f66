"""A small client of MLflow's REST API (``/api/2.0/mlflow/...`` and the tracking server's proxied artifact store,
``/api/2.0/mlflow-artifacts/artifacts/...``), on ``requests``.

Chosen over ``mlflow-skinny``'s ``MlflowClient``: the control plane already depends on ``requests``, while
mlflow-skinny 3.17 would add some twenty packages to it (FastAPI, uvicorn, starlette, databricks-sdk,
OpenTelemetry, GitPython, google-auth...); every call here has its own timeout and no retry loop of its own (the
mirror's backoff is per team, in :mod:`strata.tracking.services`); and an artifact is uploaded as a stream read
from the artifact storage chunk by chunk (``MlflowClient.log_artifact`` wants a local file). The routes used are
MLflow's stable 2.0 REST API; tests/platform/tracking checks them against a real ``mlflow server``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

import requests

API = "/api/2.0/mlflow"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"
PROXIED_SCHEME = "mlflow-artifacts:"
CHUNK_BYTES = 1 << 20  # an artifact's bytes go up in pieces of this size

# MLflow's own limits (mlflow/utils/validation.py): per log-batch call, and on keys and values.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000
MAX_KEY_CHARS = 250
MAX_PARAM_VALUE_CHARS = 6000
MAX_TAG_VALUE_CHARS = 8000
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")


class MlflowError(Exception):
    """A call to the tracking server failed: unreachable, timed out, or an error answer. ``code`` is MLflow's
    ``error_code`` (``RESOURCE_DOES_NOT_EXIST``...) when the server sent one."""

    def __init__(self, message: str, *, status: int = 0, code: str = ""):
        super().__init__(message)
        self.status, self.code = status, code


def safe_key(key: str) -> str:
    """``key`` as MLflow accepts a param, metric or tag name: alphanumerics, ``_ - . : /`` and spaces (anything
    else becomes ``_``), at most 250 characters."""
    return _BAD_KEY_CHARS.sub("_", key)[:MAX_KEY_CHARS] or "_"


def clip(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


class StreamBody:
    """A request body read from ``stream`` in chunks, of a known ``size`` (sent with a Content-Length, never
    buffered whole)."""

    def __init__(self, stream: BinaryIO, size: int, chunk: int = CHUNK_BYTES):
        self.stream, self.size, self.chunk = stream, size, chunk
        self.sent = 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < self.size:
            data = self.stream.read(min(self.chunk, self.size - self.sent))
            if not data:
                raise MlflowError(f"the stored object ended after {self.sent} of {self.size} bytes")
            self.sent += len(data)
            yield data


class MlflowRest:
    """One tracking server: ``url`` (its base URL), an optional bearer ``token``, a connect ``timeout``."""

    def __init__(self, url: str, token: str = "", *, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "strata-mlflow-bridge"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        self.session.close()

    def _call(self, method: str, route: str, *, read_timeout: float | None = None, **kwargs) -> Any:
        timeout = (self.timeout, read_timeout or self.timeout * 4)
        try:
            response = self.session.request(method, f"{self.url}{route}", timeout=timeout, **kwargs)
        except requests.RequestException as error:
            raise MlflowError(f"cannot reach the tracking server at {self.url}: {error.__class__.__name__}") from None
        if response.status_code >= 400:
            code, message = "", response.text.strip()[:300]
            try:
                payload = response.json()
            except ValueError:
                payload = None
            if isinstance(payload, dict):
                code = str(payload.get("error_code") or "")
                message = str(payload.get("message") or message)[:300]
            raise MlflowError(f"{method} {route}: HTTP {response.status_code} {code} {message}".strip(),
                              status=response.status_code, code=code)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            return {}

    # -- experiments and runs ------------------------------------------------------------------------------------
    def experiment_id(self, name: str) -> str:
        """The id of experiment ``name``, created if the server has none of that name."""
        try:
            answer = self._call("GET", f"{API}/experiments/get-by-name", params={"experiment_name": name})
            return str(answer["experiment"]["experiment_id"])
        except MlflowError as error:
            if error.code != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            return str(self._call("POST", f"{API}/experiments/create", json={"name": name})["experiment_id"])
        except MlflowError as error:  # created by someone else meanwhile
            if error.code != "RESOURCE_ALREADY_EXISTS":
                raise
        answer = self._call("GET", f"{API}/experiments/get-by-name", params={"experiment_name": name})
        return str(answer["experiment"]["experiment_id"])

    def run_create(self, experiment_id: str, *, name: str, start_ms: int, tags: dict[str, str]) -> dict[str, Any]:
        """A new run (RUNNING); returns its ``info`` (``run_id``, ``artifact_uri``...)."""
        body = {"experiment_id": experiment_id, "run_name": name, "start_time": start_ms,
                "tags": [{"key": safe_key(key), "value": clip(str(value), MAX_TAG_VALUE_CHARS)}
                         for key, value in tags.items()]}
        return self._call("POST", f"{API}/runs/create", json=body)["run"]["info"]

    def run_get(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"{API}/runs/get", params={"run_id": run_id})["run"]

    def run_end(self, run_id: str, status: str, end_ms: int) -> None:
        self._call("POST", f"{API}/runs/update", json={"run_id": run_id, "status": status, "end_time": end_ms})

    def log_batch(self, run_id: str, *, metrics: list[dict[str, Any]] | None = None,
                  params: dict[str, str] | None = None, tags: dict[str, str] | None = None) -> None:
        """Log metrics (``{key, value, timestamp (ms), step}``), params and tags, split into as many calls as
        MLflow's per-call limits ask for. Non-finite values are left out (JSON has no NaN)."""
        metric_rows = [{"key": safe_key(row["key"]), "value": float(row["value"]), "timestamp": int(row["timestamp"]),
                        "step": int(row["step"])} for row in metrics or [] if math.isfinite(float(row["value"]))]
        param_rows = [{"key": safe_key(key), "value": clip(str(value), MAX_PARAM_VALUE_CHARS)}
                      for key, value in (params or {}).items()]
        tag_rows = [{"key": safe_key(key), "value": clip(str(value), MAX_TAG_VALUE_CHARS)}
                    for key, value in (tags or {}).items()]
        while metric_rows or param_rows or tag_rows:
            body: dict[str, Any] = {"run_id": run_id, "params": param_rows[:MAX_PARAMS_PER_BATCH],
                                    "tags": tag_rows[:MAX_TAGS_PER_BATCH]}
            room = MAX_ENTITIES_PER_BATCH - len(body["params"]) - len(body["tags"])
            body["metrics"] = metric_rows[:min(room, MAX_METRICS_PER_BATCH)]
            param_rows = param_rows[len(body["params"]):]
            tag_rows = tag_rows[len(body["tags"]):]
            metric_rows = metric_rows[len(body["metrics"]):]
            self._call("POST", f"{API}/runs/log-batch", json=body)

    # -- artifacts -----------------------------------------------------------------------------------------------
    @staticmethod
    def proxied_root(artifact_uri: str) -> str | None:
        """The path under the proxied artifact API of a run whose ``artifact_uri`` is ``mlflow-artifacts:/...``
        (the tracking server proxies its artifact store); None for any other store (s3://, file://...), which the
        control plane does not write to directly."""
        if not artifact_uri.startswith(PROXIED_SCHEME):
            return None
        path = artifact_uri[len(PROXIED_SCHEME):]
        if path.startswith("//"):  # mlflow-artifacts://host:port/path: the path on that server (this one)
            path = "/" + path[2:].partition("/")[2]
        return path.strip("/")

    def artifact_upload(self, root: str, path: str, stream: BinaryIO, size: int) -> None:
        """Upload ``size`` bytes read from ``stream`` as artifact ``path`` of the run whose proxied root is
        ``root``: one PUT, streamed in CHUNK_BYTES pieces."""
        route = f"{ARTIFACTS_API}/{quote(root)}/{quote(path.strip('/'))}"
        body = StreamBody(stream, size)
        self._call("PUT", route, data=body if size else b"", read_timeout=max(self.timeout * 10, 60.0),
                   headers={"Content-Type": "application/octet-stream"})
        if body.sent != size:
            raise MlflowError(f"sent {body.sent} of {size} bytes of {path}")
