"""A real MLflow tracking server for the MLflow bridge's tests: ``mlflow server`` (the full ``mlflow`` package, in
the dev extra) on a free 127.0.0.1 port, a SQLite backend store and a temporary artifact root served through the
server (``--serve-artifacts``), started once per module and reaped after it. Without the ``mlflow`` command the
tests skip, or fail with STRATA_REQUIRE_SERVICES=1 (CI)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import requests
import support

START_TIMEOUT_S = 180.0  # a cold start imports Flask, SQLAlchemy and alembic and migrates the store: give it time
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}  # nothing leaves 127.0.0.1


def unavailable(reason: str) -> None:
    if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
        pytest.fail(f"STRATA_REQUIRE_SERVICES=1: {reason}", pytrace=False)
    pytest.skip(reason)


def mlflow_command() -> str | None:
    beside = Path(sys.executable).with_name("mlflow")
    return str(beside) if beside.exists() else shutil.which("mlflow")


class MlflowServer:
    def __init__(self, url: str, home: Path):
        self.url, self.home = url, home

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.url)

    def healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    command = mlflow_command()
    if command is None:
        unavailable("the mlflow command is not installed (pip install mlflow; make install does, from the dev extra)")
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    home = tmp_path_factory.mktemp("mlflow")
    port = support.free_port()
    with support.reaper() as start:
        log = (home / "server.log").open("wb")
        process = start([command, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                         "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
                         "--artifacts-destination", str(home / "artifacts"), "--serve-artifacts"],
                        cwd=home, stdout=log, stderr=log, env={**os.environ, **QUIET})
        server = MlflowServer(f"http://127.0.0.1:{port}", home)
        try:
            support.wait_for(lambda: process.poll() is not None or server.healthy(), timeout=START_TIMEOUT_S,
                             message="mlflow server to answer /health", interval=0.5)
        except AssertionError:
            raise AssertionError("mlflow server did not start:\n"
                                 + (home / "server.log").read_text(errors="replace")[-3000:]) from None
        if process.poll() is not None:
            raise AssertionError(f"mlflow server exited with {process.returncode}:\n"
                                 + (home / "server.log").read_text(errors="replace")[-3000:])
        yield server
        log.close()
