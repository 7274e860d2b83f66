"""Shared test set-up: an isolated STRATA_HOME, inline scheduling passes, and factories for the usual objects.

With STRATA_DATABASE_URL / STRATA_BROKER_URL set (CI), the suite runs against PostgreSQL and Redis; without
them, on the embedded defaults (SQLite and the filesystem broker).
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("STRATA_HOME", tempfile.mkdtemp(prefix="strata-test-home-"))
os.environ.setdefault("STRATA_SCHEDULE_INLINE", "1")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")

import django  # noqa: E402
import pytest  # noqa: E402

django.setup()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``postgres`` need a real PostgreSQL. They skip on the embedded defaults, but with
    STRATA_REQUIRE_SERVICES=1 (CI) a missing PostgreSQL is a failure, never a skip."""
    if os.environ.get("STRATA_DATABASE_URL", "").startswith("postgres"):
        return
    if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
        raise pytest.UsageError("STRATA_REQUIRE_SERVICES=1 but STRATA_DATABASE_URL is not a PostgreSQL URL")
    skip = pytest.mark.skip(reason="needs PostgreSQL: set STRATA_DATABASE_URL=postgres://...")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)
