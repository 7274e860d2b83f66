"""Fixtures of the jobs app's tests: a user of team alpha and one of team beta (API clients with a token), and
artifact storage under the test's own directory."""

from __future__ import annotations

import uuid

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


@pytest.fixture(scope="session")
def seaweedfs():
    """A real S3 server (SeaweedFS, tests/seaweedfs.py), started once per session (per xdist worker)."""
    import seaweedfs as store

    with store.started() as running:
        yield running


@pytest.fixture
def s3_storage(seaweedfs, settings):
    """Every get_storage() of the test on SeaweedFS, under a key prefix of the test's own."""
    for name, value in seaweedfs.settings(f"tests/{uuid.uuid4().hex}/").items():
        setattr(settings, name, value)
    return seaweedfs


class StoredKeys:
    """What the test's artifact storage holds, seen through the storage interface (on any backend)."""

    def keys(self, prefix: str = "") -> list[str]:
        from strata.jobs.storage import get_storage

        return [item.key for item in get_storage().list(prefix)]

    def read(self, key: str) -> bytes:
        from strata.jobs.storage import get_storage

        with get_storage().open(key) as stream:
            return stream.read()


@pytest.fixture(params=["local", "s3"])
def storage_backend(request, settings, tmp_path):
    """The test's artifact storage on local disk, then on S3 (SeaweedFS): a module that uses it runs twice, so the
    real users of the storage (code bundles, data sets) are checked on both backends."""
    if request.param == "s3":
        request.getfixturevalue("s3_storage")
    else:
        settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    return StoredKeys()
