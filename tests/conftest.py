"""Shared test set-up: an isolated STRATA_HOME, inline scheduling passes, and factories for the usual objects
(teams, users, tokens, nodes, jobs) used by the control-plane and dashboard tests.

With STRATA_DATABASE_URL / STRATA_BROKER_URL set (CI), the suite runs against PostgreSQL and Redis; without
them, on the embedded defaults (SQLite and the filesystem broker).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path

os.environ.setdefault("STRATA_HOME", tempfile.mkdtemp(prefix="strata-test-home-"))
os.environ.setdefault("STRATA_SCHEDULE_INLINE", "1")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
# Under pytest-xdist (make test runs two workers) each worker has a broker key prefix of its own, as it has its own
# test database and STRATA_HOME: queues named alike (the scheduler's "control") never cross between workers.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("STRATA_BROKER_PREFIX"):
    os.environ["STRATA_BROKER_PREFIX"] += f"{os.environ['PYTEST_XDIST_WORKER']}:"

import django  # noqa: E402
import pytest  # noqa: E402

django.setup()

# The chaos suite runs on its own (make chaos; .ci/run after make test), never inside make test.
collect_ignore = [] if os.environ.get("STRATA_CHAOS") else ["chaos"]


# -- make test-fast: the tests that take under a second each, by the durations of the last recorded full run ------
DURATIONS = Path(__file__).with_name("durations.json")
FAST_LIMIT_S = 1.0
_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Add up each test's setup, call and teardown (in the xdist controller too: workers forward their reports)."""
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """``STRATA_TEST_DURATIONS=1 make test`` records every test's seconds in tests/durations.json (what ``make
    test-fast`` selects by), from a run of the whole suite."""
    if not os.environ.get("STRATA_TEST_DURATIONS") or hasattr(session.config, "workerinput") or not _durations:
        return
    if os.environ.get("STRATA_CHAOS") or os.environ.get("STRATA_FAST") or session.config.args != ["tests"]:
        return  # not the whole suite (make chaos after make test in .ci/run, a part of it): keep the record
    ordered = {nodeid: round(seconds, 3) for nodeid, seconds in sorted(_durations.items())}
    DURATIONS.write_text(json.dumps(ordered, indent=0) + "\n")


def fast_only(config, items) -> None:
    """``make test-fast`` (STRATA_FAST=1): deselect end-to-end tests and every test the recorded run measured at
    FAST_LIMIT_S or more; a test the record does not know (a new one) runs."""
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    keep, drop = [], []
    for item in items:
        slow = item.get_closest_marker("e2e") or recorded.get(item.nodeid, 0.0) >= FAST_LIMIT_S
        (drop if slow else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    """End-to-end test files run first (under pytest-xdist each worker takes a whole file at a time: the long
    files first, then the many short ones fill in, so no worker is left alone with a long file at the end).

    Tests marked ``postgres`` need a real PostgreSQL. They skip on the embedded defaults, but with
    STRATA_REQUIRE_SERVICES=1 (CI) a missing PostgreSQL is a failure, never a skip."""
    # Stable: the file order is kept within each group. The plugins' tests (benchmarks, swarms) are next longest.
    items.sort(key=lambda item: 0 if item.get_closest_marker("e2e") else 1 if "/components/" in str(item.path) else 2)
    if os.environ.get("STRATA_FAST"):
        fast_only(config, items)
    if os.environ.get("STRATA_DATABASE_URL", "").startswith("postgres"):
        return
    if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
        raise pytest.UsageError("STRATA_REQUIRE_SERVICES=1 but STRATA_DATABASE_URL is not a PostgreSQL URL")
    skip = pytest.mark.skip(reason="needs PostgreSQL: set STRATA_DATABASE_URL=postgres://...")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)

@pytest.fixture
def make_team(db):
    from strata.accounts import services

    def make(slug: str = "alpha", **quota):
        team = services.team_create(slug)
        if quota:
            from strata.quotas.models import Quota

            Quota.objects.filter(team=team).update(**quota)
        return team

    return make


@pytest.fixture
def make_user(db):
    from strata.accounts import services

    def make(username: str = "alice", team=None, role: str = "member", admin: bool = False):
        user = services.user_create(username, "pw-" + username, admin=admin)
        if team is not None:
            services.membership_set(user, team, role)
        return user

    return make


@pytest.fixture
def make_token(db):
    from strata.accounts import services

    def make(user, team=None, kind: str = "user", ttl_days: float | None = None) -> str:
        _, raw = services.token_create(user, team=team, kind=kind, ttl_days=ttl_days)
        return raw

    return make


@pytest.fixture
def api(db):
    """An API client factory: ``api(token)`` sends ``Authorization: Bearer token`` on every request."""
    from rest_framework.test import APIClient

    def make(token: str | None = None) -> APIClient:
        client = APIClient()
        if token:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        return client

    return make


@pytest.fixture
def make_node(db):
    """Register a node with ``gpus`` virtual devices of ``memory`` bytes each, as a node agent would; with
    ``cpus`` (and ``host_memory`` bytes) it also offers CPUs to jobs that reserve them."""
    from strata.cluster.services import node_register

    def make(name: str = "node-1", gpus: int = 2, memory: int = 8 * 2**30, labels=None, cpus=None, host_memory=None):
        return node_register(name=name, labels=labels or {}, devices=[
            {"index": i, "kind": "virtual", "name": f"virtual GPU {i}", "memory_total": memory} for i in range(gpus)
        ], cpus=cpus, memory=host_memory)

    return make


TRAIN_JOB = {"name": "digits", "kind": "train", "spec": {"workload": "mlp-digits", "epochs": 1}}


@pytest.fixture
def job_body():
    import copy

    return lambda **overrides: {**copy.deepcopy(TRAIN_JOB), **overrides}


@pytest.fixture(autouse=True)
def published(monkeypatch):
    """Record dispatches instead of sending them to the broker: a list of batches of (queue, attempt, token)."""
    from strata.scheduling import dispatch

    calls: list[list[tuple[str, str, str]]] = []
    monkeypatch.setattr(dispatch, "publish_all", lambda batch: calls.append(list(batch)))
    return calls


@pytest.fixture
def submit(db):
    """Submit a normalized job through the service layer (no scheduling pass is run)."""
    from strata.jobs.services import job_submit

    def make(user, team, *, gpus: float = 1.0, memory: int | None = None, workers: int = 1, priority: int = 0,
             max_attempts: int = 3, name: str = "job", node_labels=None):
        resources = {"gpus": float(gpus), "gpu_memory": memory, "workers": workers}
        if node_labels:
            resources["node_labels"] = node_labels
        data = {"kind": "train", "name": name, "spec": {"workload": "mlp-digits", "epochs": 1},
                "resources": resources, "priority": priority, "max_attempts": max_attempts, "time_limit": 3600}
        job, _ = job_submit(user=user, team=team, data=data)
        return job

    return make


@pytest.fixture
def submit_resources(db):
    """Submit a train job with ``resources`` as a user writes them (normalized by the API's rules), through the
    service layer (no scheduling pass is run)."""
    from strata.jobs.api.serializers import normalize_resources
    from strata.jobs.services import job_submit

    def make(user, team, resources: dict, *, name: str = "job", priority: int = 0):
        data = {"kind": "train", "name": name, "spec": {"workload": "mlp-digits", "epochs": 1},
                "resources": normalize_resources(resources), "priority": priority, "max_attempts": 3,
                "time_limit": 3600}
        return job_submit(user=user, team=team, data=data)[0]

    return make


@pytest.fixture
def node_token(make_user, make_token):
    """A node-agent token, created by a cluster admin."""
    admin = make_user("node-admin", admin=True)
    return make_token(admin, kind="node")


@pytest.fixture
def node_protocol(api, node_token):
    """``node_protocol(attempt, node=None, claim=True, client=None)``: a :class:`node_protocol.NodeProtocol`
    speaking for the attempt as its node (or ``node``) with the node token (or through ``client``), the attempt
    claimed first unless ``claim`` is false (a refused claim fails the test). ``node_protocol(node=node)`` speaks
    for the node alone."""
    from node_protocol import NodeProtocol

    def make(attempt=None, node=None, claim: bool = True, client=None) -> NodeProtocol:
        protocol = NodeProtocol(client or api(node_token), attempt, node)
        if claim and attempt is not None:
            response = protocol.claim()
            assert response.status_code == 200, response.content
        return protocol

    return make


@pytest.fixture
def run_pass(db):
    from strata.scheduling.services import schedule_pass

    return lambda: schedule_pass(dispatch=False)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class LoginClock:
    """The login guard's injected clock (``strata.accounts.login_guard.clock``), moved by the tests."""

    def __init__(self):
        from django.utils import timezone

        self.now = timezone.now()

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        from datetime import timedelta

        self.now += timedelta(seconds=seconds)


@pytest.fixture
def login_policy(settings):
    """The login guard's documented defaults, whatever the environment says."""
    settings.STRATA_LOGIN_FREE_FAILURES = 5
    settings.STRATA_LOGIN_LOCKOUT_FAILURES = 10
    settings.STRATA_LOGIN_ADDRESS_FREE_FAILURES = 20
    settings.STRATA_LOGIN_ADDRESS_LOCKOUT_FAILURES = 50
    settings.STRATA_LOGIN_USER_FREE_FAILURES = 10
    settings.STRATA_LOGIN_BACKOFF_SECONDS = 1.0
    settings.STRATA_LOGIN_BACKOFF_MAX_SECONDS = 60.0
    settings.STRATA_LOGIN_LOCKOUT_SECONDS = 900.0
    settings.STRATA_LOGIN_WINDOW_SECONDS = 3600.0
    settings.STRATA_LOGIN_KNOWN_ADDRESS_DAYS = 30.0
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    return settings


@pytest.fixture
def login_clock(db, login_policy, monkeypatch):
    """The login guard's clock, under the documented policy; old counters are never purged at random."""
    from strata.accounts import login_guard

    now = LoginClock()
    monkeypatch.setattr(login_guard, "clock", now)
    monkeypatch.setattr(login_guard, "PURGE_CHANCE", 0.0)
    return now


@pytest.fixture
def install_plugins(monkeypatch):
    """``install_plugins(*paths)``: the registry as if these ``"module:PLUGIN"`` manifests were installed next to
    the built-ins (reloaded now, and again after the test)."""
    from components.runtime.contract import registry

    def install(*paths: str) -> None:
        monkeypatch.setattr(registry, "BUILTIN_PLUGINS", (*registry.BUILTIN_PLUGINS, *paths))
        registry.reload()

    yield install
    monkeypatch.undo()
    registry.reload()


# -- artifact storage on S3: a real SeaweedFS (tests/seaweedfs.py) --------------------------------------------

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
