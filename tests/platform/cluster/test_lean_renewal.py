"""The lean node path: ``POST node/renew/`` renews a node's lease with one fenced UPDATE and answers as a
heartbeat does; the full heartbeat carries batched device samples at their times; node tokens are cached per
process for a bounded time, and a revocation stops them within it (a renewal at once)."""

from __future__ import annotations

import io
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone
from node_protocol import NODE_API, NodeProtocol

from strata.accounts import node_tokens
from strata.accounts.models import ApiToken, token_digest
from strata.cluster.models import Node
from strata.jobs.models import Allocation, Attempt
from strata.telemetry.models import DeviceSample


@pytest.fixture
def cluster(make_team, make_user, make_node, node_token, api):
    team = make_team("alpha")
    user = make_user("alice", team)
    node_tokens.forget_all()
    return {"team": team, "user": user, "node": make_node("n1", gpus=2), "agent": api(node_token),
            "token": node_token}


def renew(cluster, attempts=(), session=None, node=None, client=None):
    protocol = NodeProtocol(client or cluster["agent"], node=node or cluster["node"])
    return protocol.node_post("renew", {"attempts": [str(a) for a in attempts]}, session=session)


def test_a_renewal_extends_the_lease_and_records_nothing_else(cluster):
    node = cluster["node"]
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=2))
    answer = renew(cluster)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["stop"] == [] and body["state"] == "up" and body["lease_seconds"] == 15.0
    assert body["sharing_policy"] and body["telemetry_seconds"] == 15.0  # five 3 s heartbeats
    node.refresh_from_db()
    assert node.lease_expires_at > timezone.now() + timedelta(seconds=10)
    assert not DeviceSample.objects.filter(device__node=node).exists()


def test_a_stale_down_or_unknown_node_is_refused(cluster, make_node):
    node = cluster["node"]
    stale = renew(cluster, session=uuid.uuid4())
    assert stale.status_code == 409 and "register again" in stale.json()["detail"]
    old_session = node.session
    make_node("n1", gpus=2)  # registered again: a new session; the old one is fenced off
    assert renew(cluster, session=old_session).status_code == 409
    node.refresh_from_db()
    before = node.lease_expires_at
    Node.objects.filter(pk=node.pk).update(state=Node.State.DOWN)  # the reaper, or a leave
    assert renew(cluster).status_code == 409
    node.refresh_from_db()
    assert node.state == Node.State.DOWN and node.lease_expires_at == before  # the refused renewal wrote nothing
    unknown = renew(cluster, node=Node(pk=uuid.uuid4(), session=uuid.uuid4()))
    assert unknown.status_code == 404


def test_only_a_node_token_renews_and_a_bad_body_is_a_400(cluster, make_token, api):
    user_client = api(make_token(cluster["user"], cluster["team"]))
    assert renew(cluster, client=user_client).status_code == 403
    assert renew(cluster, client=api()).status_code == 401
    assert renew(cluster, client=api("st_nope_nope")).status_code == 401
    bad = cluster["agent"].post(f"{NODE_API}/renew/", {"node": "x", "session": "y", "attempts": "z"}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"node", "session", "attempts"}
    assert cluster["agent"].get(f"{NODE_API}/renew/").status_code == 405


def test_a_draining_node_renews_and_hears_its_attempts_left(cluster):
    node = cluster["node"]
    Node.objects.filter(pk=node.pk).update(state=Node.State.DRAINING)
    answer = renew(cluster)
    assert answer.status_code == 200
    assert answer.json()["state"] == "draining" and answer.json()["attempts_left"] == 0


def test_a_renewal_holds_the_node_to_its_attempts_as_a_heartbeat_does(cluster, submit, run_pass):
    job = submit(cluster["user"], cluster["team"], max_attempts=1)
    run_pass()
    attempt = Attempt.objects.get(job=job, ended_at__isnull=True)
    node = cluster["node"]
    claimed = NodeProtocol(cluster["agent"], attempt, node).claim()
    assert claimed.status_code == 200
    assert renew(cluster, [attempt.pk]).json()["stop"] == []
    # Not listed: noted (a lease of grace), as the heartbeat does.
    assert renew(cluster).status_code == 200
    assert Allocation.objects.get(attempt=attempt).unreported_since is not None
    # An attempt that ended (or one the control plane does not know) is one to stop.
    Attempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now())
    unknown = uuid.uuid4()
    assert renew(cluster, [attempt.pk, unknown]).json()["stop"] == [str(attempt.pk), str(unknown)]


def test_the_full_heartbeat_stores_batched_samples_at_their_times(cluster):
    node = cluster["node"]
    now = time.time()
    samples = [{"index": i, "utilization": 10.0 * beat + i, "memory_used": 1000 * beat, "time": now - 3 * (4 - beat)}
               for beat in range(5) for i in range(2)]
    answer = NodeProtocol(cluster["agent"], node=node).heartbeat(samples=samples, attempts=[])
    assert answer.status_code == 200, answer.content
    assert answer.json()["telemetry_seconds"] == 15.0
    stored = DeviceSample.objects.filter(device__node=node, device__index=0).order_by("time")
    assert [row.utilization for row in stored] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert stored[0].time == pytest.approx(datetime.fromtimestamp(now - 12, tz=UTC), abs=timedelta(seconds=0.01))
    device = node.devices.get(index=1)
    assert (device.utilization, device.memory_used) == (41.0, 4000)  # the newest sample
    # A sample from the far past or the future is clamped to the heartbeat's window.
    far = [{"index": 0, "utilization": 1.0, "memory_used": 1, "time": now - 86400},
           {"index": 0, "utilization": 2.0, "memory_used": 2, "time": now + 86400}]
    NodeProtocol(cluster["agent"], node=node).heartbeat(samples=far, attempts=[])
    times = sorted(DeviceSample.objects.filter(device__node=node, device__index=0, utilization__lt=3)
                   .values_list("time", flat=True))
    assert times[1] - times[0] <= timedelta(seconds=601)


def test_telemetry_cadence_is_configurable(cluster, settings):
    settings.STRATA_NODE_TELEMETRY_SECONDS = 30.0
    assert renew(cluster).json()["telemetry_seconds"] == 30.0
    settings.STRATA_NODE_TELEMETRY_SECONDS = 0.5  # never less than one heartbeat interval
    assert renew(cluster).json()["telemetry_seconds"] == 3.0


def _wait(predicate, seconds: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_revoked_node_token_stops_within_the_cache_bound(cluster, settings):

    settings.STRATA_NODE_TOKEN_CACHE_SECONDS = 1.0
    node = NodeProtocol(cluster["agent"], node=cluster["node"])
    heartbeat = lambda: node.heartbeat(samples=[], attempts=[]).status_code  # noqa: E731
    assert heartbeat() == 200
    assert node_tokens.lookup(token_digest(cluster["token"])) is not None  # cached after one check
    # Revoked by another server process (no signal reaches this one): the renewal checks its token in its UPDATE
    # and is refused at once; the other node calls stop once the cached entry is older than the bound.
    ApiToken.objects.filter(digest=token_digest(cluster["token"])).update(revoked_at=timezone.now())
    assert renew(cluster).status_code == 401
    _wait(lambda: heartbeat() == 401, what="the revoked token to be refused")
    assert node_tokens.lookup(token_digest(cluster["token"])) is None


def test_a_revocation_in_this_process_takes_effect_at_once(cluster, settings):
    from strata.accounts import services

    settings.STRATA_NODE_TOKEN_CACHE_SECONDS = 3600.0  # whatever the bound, this process forgets at once
    node = NodeProtocol(cluster["agent"], node=cluster["node"])
    assert node.heartbeat(samples=[], attempts=[]).status_code == 200
    assert renew(cluster).status_code == 200
    services.token_revoke(ApiToken.objects.get(digest=token_digest(cluster["token"])))
    assert node.heartbeat(samples=[], attempts=[]).status_code == 401
    assert renew(cluster).status_code == 401


def test_the_wsgi_fast_path_answers_the_renewal_before_django(cluster):
    from strata.api.fastpath import NodeFastPath

    node = cluster["node"]
    payload = json.dumps({"node": str(node.pk), "session": str(node.session), "attempts": []}).encode()
    untouched = []
    app = NodeFastPath(lambda environ, start_response: untouched.append(environ) or [b""])

    def call(path: str, method: str = "POST", body: bytes = payload, token: str | None = None):
        answer: dict = {}
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "CONTENT_LENGTH": str(len(body)),
                   "wsgi.input": io.BytesIO(body), "HTTP_AUTHORIZATION": f"Bearer {token or cluster['token']}"}
        chunks = app(environ, lambda status, headers: answer.update(status=status, headers=dict(headers)))
        return answer["status"], b"".join(chunks)

    # As Django's test client does: the test's transaction must outlive the request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        status, body = call("/api/v1/node/renew/")
        assert status == "200 OK" and json.loads(body)["state"] == "up"
        status, body = call("/api/v1/node/renew/", token="st_nope_nope")
        assert status.startswith("401")
        status, _ = call("/api/v1/node/renew/", body=b"x" * 200_000)
        assert status.startswith("413")
        assert call("/api/v1/node/renew/", method="GET")[0].startswith("405")
        app({"REQUEST_METHOD": "POST", "PATH_INFO": "/api/v1/node/heartbeat/"}, None)
        app({"REQUEST_METHOD": "POST", "PATH_INFO": "/api/v1/node/renew/"}, None)  # no token: Django's session
        assert len(untouched) == 2  # every other path goes to Django
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
