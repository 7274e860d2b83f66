"""Fixtures of the jobs app's tests: a user of team alpha and one of team beta (API clients with a token), and
artifact storage under the test's own directory (``storage_backend``, on local disk and on S3: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def alice(make_team, make_user, make_token, api):
    team = make_team("alpha")
    return api(make_token(make_user("alice", team), team))


@pytest.fixture
def bob(make_team, make_user, make_token, api):
    team = make_team("beta")
    return api(make_token(make_user("bob", team), team))


@pytest.fixture
def artifact_root(settings, tmp_path):
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    return tmp_path / "artifacts"

