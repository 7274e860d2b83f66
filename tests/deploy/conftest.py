"""Fixtures for the deploy/ tests: the rendered Kubernetes manifests and a check of command lines against the
real `strata` argument parser. Everything here runs offline: no Docker engine, no cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"

def _require_or_skip(message: str) -> None:
    """CI (STRATA_REQUIRE_SERVICES=1) fails where a developer machine skips."""
    if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{message} (STRATA_REQUIRE_SERVICES=1: a missing tool is a failure, not a skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        _require_or_skip("kubectl is not installed: cannot render deploy/kubernetes with `kubectl kustomize`")
    return path


def kustomize(kubectl: str, directory: Path) -> list[dict]:
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    documents = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
    assert documents, f"kubectl kustomize {directory} rendered nothing"
    return documents


@pytest.fixture(scope="session")
def base_manifests(kubectl) -> list[dict]:
    """deploy/kubernetes as shipped: the base, with its placeholder Secrets."""
    return kustomize(kubectl, KUBERNETES)


# Real-looking secrets for the example overlay (what an operator writes into its git-ignored env files).
EXAMPLE_SECRETS = {
    "REPLACE-ME-secret-key": "k3y-0123456789abcdefghijklmnopqrstuvwxyz",
    "REPLACE-ME-pg": "pgPassw0rd123",
    "REPLACE-ME-redis": "redisPassw0rd456",
    "REPLACE-ME-node-token": "node-token-789",
}


@pytest.fixture(scope="session")
def full_manifests(kubectl, tmp_path_factory) -> list[dict]:
    """overlays/example rendered the way an operator would: a copy of deploy/kubernetes with secrets.env and
    node-secrets.env written from the *.env.example files (every REPLACE-ME filled in)."""
    copy = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    example = copy / "overlays" / "example"
    for name in ("secrets.env", "node-secrets.env"):
        text = (example / f"{name}.example").read_text()
        for placeholder, value in EXAMPLE_SECRETS.items():
            text = text.replace(placeholder, value)
        values = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        assert values and not [v for v in values if "REPLACE-ME" in v], f"{name}.example: unknown placeholder"
        (example / name).write_text(text)
    return kustomize(kubectl, example)


@pytest.fixture(scope="session")
def cli_accepts() -> Callable[[list[str]], None]:
    """Assert that `strata ARGV...` parses with the real argument parser (strata.cli.main.build_parser)."""
    from strata.cli.main import build_parser

    def parses(argv: list[str]) -> bool:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            return False
        return True

    def check(argv: list[str]) -> None:
        assert parses(argv), f"`strata {' '.join(argv)}` is refused by the strata CLI"

    return check
