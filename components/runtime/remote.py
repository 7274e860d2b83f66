"""The context an attempt's child process runs in: reports go to the control plane over REST.

Logs and metrics are buffered and flushed by a background thread twice a second. Each flush also tells the
child whether the control plane wants it to stop (cancel or preemption), so ``should_stop`` reacts within
about a second even when the worker's own poll is slower.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from components.runtime.client import ApiError, ControlPlaneClient
from components.runtime.context import Context

log = logging.getLogger(__name__)


@dataclass
class RemoteContext(Context):
    client: ControlPlaneClient | None = None
    node_id: str = ""
    token: str = ""
    flush_seconds: float = 0.5
    _logs: list = field(default_factory=list, repr=False)
    _metrics: list = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)
    stale: bool = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._flush_loop, name="strata-report", daemon=True)
        self._thread.start()

    def _path(self, suffix: str) -> str:
        return f"node/attempts/{self.attempt_id}/{suffix}"

    def _auth(self) -> dict:
        return {"node": self.node_id, "token": self.token}

    def log(self, message: str, level: str = "info") -> None:
        with self._lock:
            self._logs.append({"level": level, "message": str(message)})

    def metrics(self, values: dict[str, float], step: int) -> None:
        with self._lock:
            self._metrics.extend({"name": name, "step": int(step), "value": float(value)}
                                 for name, value in values.items())

    def flush(self) -> None:
        with self._lock:
            logs, metrics = self._logs, self._metrics
            self._logs, self._metrics = [], []
        try:
            answer = self.client.post(self._path("report/"), {**self._auth(), "logs": logs, "metrics": metrics})
        except ApiError as error:
            if error.status == 409:  # this attempt was ended by the control plane: stop at once
                self.stale = True
                self.request_stop()
                return
            with self._lock:  # keep them for the next flush
                self._logs[:0], self._metrics[:0] = logs, metrics
            log.warning("report failed, will retry: %s", error)
            return
        if answer and answer.get("stop"):
            self.request_stop()

    def _flush_loop(self) -> None:
        while not self._closed.wait(self.flush_seconds):
            self.flush()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()

    def artifact(self, path: str | Path, name: str | None = None, kind: str = "artifact") -> None:
        source = Path(path)
        with source.open("rb") as body:
            self.client.request("PUT", self._path(f"artifacts/{name or source.name}/"), data=body,
                                params={**self._auth(), "kind": kind},
                                headers={"Content-Type": "application/octet-stream"}, timeout=600)

    def _save_checkpoint_bytes(self, data: bytes) -> None:
        self.client.request("PUT", self._path("artifacts/checkpoint.pt/"), data=data,
                            params={**self._auth(), "kind": "checkpoint"},
                            headers={"Content-Type": "application/octet-stream"}, timeout=600)

    def _load_checkpoint_bytes(self) -> bytes | None:
        try:
            response = self.client.request("GET", self._path("checkpoint/"), params=self._auth(), raw=True,
                                           timeout=600)
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return response.content
