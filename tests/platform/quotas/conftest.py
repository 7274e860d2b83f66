"""Fixtures of the quotas app's tests: artifact storage on local disk under the test's own directory."""

from __future__ import annotations

import pytest


@pytest.fixture
def artifact_root(settings, tmp_path):
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    return tmp_path / "artifacts"
