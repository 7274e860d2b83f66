"""Attempt credentials: what an attempt's processes authenticate with instead of the node token. Minted with the
claim, renewed while the attempt lives, accepted only on that attempt's own routes from its own node; refused on
another attempt's routes (403), on the node's own routes and on every user route; refused once expired (401)."""

from __future__ import annotations

import time

import pytest

from strata.accounts import attempt_credentials
from strata.jobs.models import Attempt


@pytest.fixture
def world(make_team, make_user, make_node, node_protocol, api, submit, run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=2)
    jobs = [submit(user, team, gpus=1), submit(user, team, gpus=1)]
    run_pass()
    attempts = [Attempt.objects.get(job=job, ended_at__isnull=True) for job in jobs]
    protocols = [node_protocol(attempt, node) for attempt in attempts]
    return {"node": node, "attempts": attempts, "claims": [protocol.claimed for protocol in protocols], "api": api,
            "team": team, "protocols": protocols}


def _with(world, index: int, credential: str):
    """Attempt ``index``'s routes (its node, its fencing token), called with ``credential``."""
    return world["protocols"][index].through(world["api"](credential))


def test_the_claim_carries_a_credential_and_the_team_never_the_node_token(world, node_token):
    claim = world["claims"][0]
    assert claim["credential"]["credential"].startswith(attempt_credentials.PREFIX)
    assert claim["credential"]["expires"] > time.time() + 60
    assert claim["team"] == world["team"].pk
    assert node_token not in str(claim)


def test_a_credential_opens_its_own_attempts_routes(world):
    own = _with(world, 0, world["claims"][0]["credential"]["credential"])
    response = own.report(logs=[{"level": "info", "message": "hello"}])
    assert response.status_code == 200, response.content
    assert own.get("checkpoint").status_code == 404  # none yet: allowed
    assert own.get("tokens").status_code == 200
    renewed = own.post("renew")
    assert renewed.status_code == 200, renewed.content
    fresh = renewed.json()
    assert fresh["credential"].startswith(attempt_credentials.PREFIX) and fresh["expires"] > time.time()
    again = _with(world, 0, fresh["credential"]).report(logs=[])
    assert again.status_code == 200


def test_another_attempts_routes_refuse_it(world):
    own = _with(world, 1, world["claims"][0]["credential"]["credential"])  # attempt 0's, on attempt 1's routes
    for verb in ("report", "renew", "children/metrics"):
        response = own.post(verb, {"logs": []})
        assert response.status_code == 403, (verb, response.content)
        assert "another attempt" in response.json()["detail"]
    assert own.get("checkpoint").status_code == 403


def test_the_nodes_own_routes_and_user_routes_refuse_it(world, make_node):
    credential = world["claims"][0]["credential"]["credential"]
    own = world["api"](credential)
    protocol = world["protocols"][0]
    node_only = [("post", protocol.url("claim"), protocol.auth),
                 ("post", protocol.url("finish"), {**protocol.auth, "outcome": "succeeded", "reason": ""}),
                 ("get", protocol.url("code"), protocol.auth),
                 ("post", "/api/v1/node/register/", {"name": "fake", "devices": []}),
                 ("post", "/api/v1/node/heartbeat/", {"node": str(world["node"].pk)}),
                 ("post", "/api/v1/node/leave/", {"node": str(world["node"].pk)})]
    for method, path, body in node_only:
        response = getattr(own, method)(path, body, format="json") if method == "post" else own.get(path, body)
        assert response.status_code == 403, (path, response.status_code, response.content)
    for path in ("/api/v1/jobs/", "/api/v1/teams/", "/api/v1/tokens/", "/api/v1/nodes/", "/api/v1/code/"):
        response = own.get(path)
        assert response.status_code in (401, 403), (path, response.status_code)
    assert own.post("/api/v1/jobs/", {"kind": "train"}, format="json").status_code in (401, 403)
    # From another node, it is refused too (it names the node it was issued for).
    stranger = make_node("n2", gpus=1)
    response = protocol.through(own).report(node=stranger, logs=[])
    assert response.status_code == 403


def test_an_expired_a_forged_and_an_ended_attempts_credential_are_refused(world, settings):
    attempt = world["attempts"][0]
    expired = attempt_credentials.mint(attempt.pk, world["node"].pk, ttl_s=-1)["credential"]
    response = _with(world, 0, expired).report(logs=[])
    assert response.status_code == 401 and "expired" in response.json()["detail"]
    forged = attempt_credentials.PREFIX + world["claims"][0]["credential"]["credential"][
        len(attempt_credentials.PREFIX):-4] + "AAAA"
    response = _with(world, 0, forged).report(logs=[])
    assert response.status_code == 401
    # Signed with the old key while it is a fallback: still good; a new key alone: refused.
    credential = world["claims"][0]["credential"]["credential"]
    original = settings.SECRET_KEY
    settings.SECRET_KEY_FALLBACKS = [original]
    settings.SECRET_KEY = "a-new-key-" + "x" * 50
    assert _with(world, 0, credential).report(logs=[]).status_code == 200
    settings.SECRET_KEY_FALLBACKS = []
    assert _with(world, 0, credential).report(logs=[]).status_code == 401
    settings.SECRET_KEY = original  # the key that signed the other claim's credential
    # An attempt that ended: its fencing check answers 409, and so does renewal.
    own = _with(world, 1, world["claims"][1]["credential"]["credential"])
    world["protocols"][1].finish("succeeded", reason="")
    assert own.post("renew").status_code == 409
