"""Attempt credentials: what an attempt's processes authenticate with instead of the node token. Minted with the
claim, renewed while the attempt lives, accepted only on that attempt's own routes from its own node; refused on
another attempt's routes (403), on the node's own routes and on every user route; refused once expired (401)."""

from __future__ import annotations

import time

import pytest

from strata.accounts import attempt_credentials
from strata.jobs.models import Attempt

NODE = "/api/v1/node/attempts"


@pytest.fixture
def world(make_team, make_user, make_node, node_token, api, submit, run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=2)
    agent = api(node_token)
    jobs = [submit(user, team, gpus=1), submit(user, team, gpus=1)]
    run_pass()
    attempts = [Attempt.objects.get(job=job, ended_at__isnull=True) for job in jobs]
    claims = []
    for attempt in attempts:
        response = agent.post(f"{NODE}/{attempt.pk}/claim/", {"node": str(node.pk), "token": attempt.fencing_token},
                              format="json")
        assert response.status_code == 200, response.content
        claims.append(response.json())
    return {"node": node, "attempts": attempts, "claims": claims, "api": api, "team": team, "agent": agent}


def _auth(world, index: int) -> dict:
    return {"node": str(world["node"].pk), "token": world["attempts"][index].fencing_token}


def test_the_claim_carries_a_credential_and_the_team_never_the_node_token(world, node_token):
    claim = world["claims"][0]
    assert claim["credential"]["credential"].startswith(attempt_credentials.PREFIX)
    assert claim["credential"]["expires"] > time.time() + 60
    assert claim["team"] == world["team"].pk
    assert node_token not in str(claim)


def test_a_credential_opens_its_own_attempts_routes(world):
    own = world["api"](world["claims"][0]["credential"]["credential"])
    attempt = world["attempts"][0]
    response = own.post(f"{NODE}/{attempt.pk}/report/", {**_auth(world, 0), "logs": [{"level": "info",
                                                                                      "message": "hello"}]},
                        format="json")
    assert response.status_code == 200, response.content
    assert own.get(f"{NODE}/{attempt.pk}/checkpoint/", _auth(world, 0)).status_code == 404  # none yet: allowed
    assert own.get(f"{NODE}/{attempt.pk}/tokens/", _auth(world, 0)).status_code == 200
    renewed = own.post(f"{NODE}/{attempt.pk}/renew/", _auth(world, 0), format="json")
    assert renewed.status_code == 200, renewed.content
    fresh = renewed.json()
    assert fresh["credential"].startswith(attempt_credentials.PREFIX) and fresh["expires"] > time.time()
    again = world["api"](fresh["credential"]).post(f"{NODE}/{attempt.pk}/report/", {**_auth(world, 0), "logs": []},
                                                   format="json")
    assert again.status_code == 200


def test_another_attempts_routes_refuse_it(world):
    own = world["api"](world["claims"][0]["credential"]["credential"])
    other = world["attempts"][1]
    for verb in ("report", "renew", "children/metrics"):
        response = own.post(f"{NODE}/{other.pk}/{verb}/", {**_auth(world, 1), "logs": []}, format="json")
        assert response.status_code == 403, (verb, response.content)
        assert "another attempt" in response.json()["detail"]
    assert own.get(f"{NODE}/{other.pk}/checkpoint/", _auth(world, 1)).status_code == 403


def test_the_nodes_own_routes_and_user_routes_refuse_it(world, make_node):
    credential = world["claims"][0]["credential"]["credential"]
    own = world["api"](credential)
    attempt = world["attempts"][0]
    node_only = [("post", f"{NODE}/{attempt.pk}/claim/", _auth(world, 0)),
                 ("post", f"{NODE}/{attempt.pk}/finish/", {**_auth(world, 0), "outcome": "succeeded", "reason": ""}),
                 ("get", f"{NODE}/{attempt.pk}/code/", _auth(world, 0)),
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
    response = own.post(f"{NODE}/{attempt.pk}/report/", {"node": str(stranger.pk), "token": attempt.fencing_token,
                                                          "logs": []}, format="json")
    assert response.status_code == 403


def test_an_expired_a_forged_and_an_ended_attempts_credential_are_refused(world, settings):
    attempt = world["attempts"][0]
    expired = attempt_credentials.mint(attempt.pk, world["node"].pk, ttl_s=-1)["credential"]
    response = world["api"](expired).post(f"{NODE}/{attempt.pk}/report/", {**_auth(world, 0), "logs": []},
                                          format="json")
    assert response.status_code == 401 and "expired" in response.json()["detail"]
    forged = attempt_credentials.PREFIX + world["claims"][0]["credential"]["credential"][
        len(attempt_credentials.PREFIX):-4] + "AAAA"
    response = world["api"](forged).post(f"{NODE}/{attempt.pk}/report/", {**_auth(world, 0), "logs": []},
                                         format="json")
    assert response.status_code == 401
    # Signed with the old key while it is a fallback: still good; a new key alone: refused.
    credential = world["claims"][0]["credential"]["credential"]
    original = settings.SECRET_KEY
    settings.SECRET_KEY_FALLBACKS = [original]
    settings.SECRET_KEY = "a-new-key-" + "x" * 50
    assert world["api"](credential).post(f"{NODE}/{attempt.pk}/report/", {**_auth(world, 0), "logs": []},
                                         format="json").status_code == 200
    settings.SECRET_KEY_FALLBACKS = []
    assert world["api"](credential).post(f"{NODE}/{attempt.pk}/report/", {**_auth(world, 0), "logs": []},
                                         format="json").status_code == 401
    settings.SECRET_KEY = original  # the key that signed the other claim's credential
    # An attempt that ended: its fencing check answers 409, and so does renewal.
    ended = world["attempts"][1]
    own = world["api"](world["claims"][1]["credential"]["credential"])
    world["agent"].post(f"{NODE}/{ended.pk}/finish/", {**_auth(world, 1), "outcome": "succeeded", "reason": ""},
                        format="json")
    assert own.post(f"{NODE}/{ended.pk}/renew/", _auth(world, 1), format="json").status_code == 409
