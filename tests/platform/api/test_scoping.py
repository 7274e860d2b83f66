"""Walk every API route as another team's user (and as a node) and check that nothing of team A leaks."""

from __future__ import annotations

import io

import pytest
from support import api_routes, fill_route

from strata.jobs.models import Attempt

PREFIX = "/api/v1/"
NODE_ROUTES = {"node-register", "node-heartbeat", "node-renew", "node-drain", "node-leave", "attempt-claim", "attempt-report", "attempt-finish",
               "attempt-artifact", "attempt-checkpoint", "attempt-source", "attempt-children",
               "attempt-child-cancel", "attempt-child-hold", "attempt-child-release", "attempt-child-resize",
               "attempt-child-metrics", "attempt-children-metrics", "attempt-children-batch", "attempt-child-file",
               "attempt-child-checkpoint", "attempt-tokens", "attempt-rendezvous", "attempt-credential", "attempt-code", "attempt-data", "attempt-renew",
               "attempt-upload-start", "attempt-upload-parts", "attempt-upload-complete", "attempt-upload-abort"}
# Authenticated by a job's access token (join) or a participant's own secret, never by an API token: 401 for those.
PARTICIPANT_ROUTES = {"participant-join", "participant-heartbeat", "participant-leave"}
DOC_ROUTES = {"schema", "docs", "redoc", "api-root"}


ROUTES = api_routes()
_fill = fill_route


def test_route_table_is_what_this_walk_expects():
    names = {name for name, _, _ in ROUTES}
    # A new route must be added to the walk's knowledge below (kwargs to fill, expectations).
    assert names == NODE_ROUTES | DOC_ROUTES | PARTICIPANT_ROUTES | {
        "job-list", "job-detail", "job-artifacts", "job-cancel", "job-download", "job-events", "job-logs",
        "job-metrics", "job-resubmit", "job-route", "job-tokens", "job-revoke-token", "node-list", "node-detail", "device-list", "device-detail", "team-list",
        "team-detail", "quota-list", "quota-detail", "quota-usage", "token-list", "token-detail", "pool-list",
        "pool-detail", "collection", "collection-item", "job-participants", "job-evict-participant",
        "code-list", "code-detail", "code-download", "data-list", "data-detail", "upload-list", "upload-detail",
        "upload-chunk", "upload-parts", "upload-complete", "secret-list", "secret-detail",
        "team-members", "team-member", "compare", "logs-search", "audit", "audit-export",
        "quota-what-if", "webhook-list", "webhook-detail", "webhook-deliveries", "webhook-test",
        "email-subscription-list", "email-subscription-detail", "email-subscription-deliveries",
        "email-subscription-test", "tracking", "usage-list", "usage-team", "eta-calibration"}


@pytest.fixture
def world(make_team, make_user, make_token, make_node, submit, node_token, run_pass, api):
    from strata.jobs.services import artifact_store, attempt_claim, attempt_report

    team_a = make_team("secret-alpha")
    team_b = make_team("beta")
    alice = make_user("alice", team_a)
    bob = make_user("bob", team_b)
    node = make_node("n1", gpus=2)
    job = submit(alice, team_a, name="alpha-secret-job")
    run_pass()
    attempt = Attempt.objects.get(job=job)
    attempt_claim(attempt.pk, attempt.fencing_token, node)
    attempt_report(attempt, logs=[{"message": "alpha-secret-log"}], metrics=[{"name": "loss", "step": 1, "value": 0.5}])
    artifact = artifact_store(attempt, "alpha-secret.bin", io.BytesIO(b"alpha-secret-bytes"))
    token_a = make_token(alice, team_a)
    from strata.accounts.team_secrets import secret_set

    secret_set(team_a, "ALPHA_SECRET", "alpha-secret-value", user=alice)
    from strata.accounts.models import ApiToken
    from strata.jobs.models import PluginRecord

    PluginRecord.objects.create(collection="datasets", team=team_a, name="alpha-secret-data", created_by=alice,
                                body={"source": {"path": "/srv/alpha-secret"}, "format": "npz"})
    from strata.jobs.models import Participant

    participant = Participant.objects.create(job=job, name="alpha-secret-participant", gpus=0.5,
                                             secret_digest="0" * 64, info={"address": "alpha-secret-address"})

    return {
        "team_a": team_a, "team_b": team_b, "job": job, "attempt": attempt, "node": node, "artifact": artifact,
        "token_a": ApiToken.objects.get(user=alice),
        "a": api(token_a), "b": api(make_token(bob, team_b)), "node_client": api(node_token),
        "values": {"pk": str(job.pk), "artifact_id": str(artifact.pk), "team": team_a.slug, "slug": team_a.slug,
                   "attempt_id": str(attempt.pk), "child_id": str(job.pk), "name": "alpha-secret.bin",
                   "route": "trials", "token_id": str(job.pk), "collection": "datasets",
                   "participant_id": str(participant.pk), "digest": "0" * 64, "index": "0",
                   "username": "alice"},
    }


def _call(client, method: str, url: str):
    body = {} if method in {"post", "put", "patch"} else None
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


def _secrets(world) -> list[str]:
    return [str(world["job"].pk), world["team_a"].slug, "alpha-secret", str(world["attempt"].pk),
            str(world["artifact"].pk), world["attempt"].fencing_token, world["token_a"].prefix]


def _body(response) -> str:
    if hasattr(response, "streaming_content"):
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode(errors="replace")


# Every route × verb × object of every kind, as another team's token and session: test_access_walk.py.


def test_foreign_user_list_endpoints_show_only_own_team(world, make_user, submit):
    b = world["b"]
    submit(make_user("bob2", world["team_b"]), world["team_b"], name="beta-job")
    jobs = b.get("/api/v1/jobs/").json()
    assert [j["name"] for j in jobs["results"]] == ["beta-job"]
    assert b.get("/api/v1/jobs/", {"team": world["team_a"].slug}).json()["count"] == 0
    assert b.get("/api/v1/jobs/", {"owner": "alice"}).json()["count"] == 0
    assert b.get("/api/v1/jobs/", {"state": "RUNNING"}).json()["count"] == 0
    assert [t["slug"] for t in b.get("/api/v1/teams/").json()["results"]] == ["beta"]
    assert [q["team"] for q in b.get("/api/v1/quotas/").json()["results"]] == ["beta"]
    assert all(t["team"] == "beta" for t in b.get("/api/v1/tokens/").json()["results"])
    assert b.get("/api/v1/secrets/").json()["results"] == []


def test_owner_team_does_see_its_job(world):
    a, job_id = world["a"], str(world["job"].pk)
    assert a.get(f"/api/v1/jobs/{job_id}/").status_code == 200
    assert [line["message"] for line in a.get(f"/api/v1/jobs/{job_id}/logs/").json()] == ["alpha-secret-log"]
    response = a.get(f"/api/v1/jobs/{job_id}/artifacts/{world['artifact'].pk}/download/")
    assert response.status_code == 200 and _body(response) == "alpha-secret-bytes"
    assert a.get("/api/v1/jobs/", {"team": "secret-alpha"}).json()["count"] == 1


def test_a_multi_team_user_token_is_scoped_to_its_team(world, make_token, api):
    from strata.accounts import services

    alice = world["job"].owner
    services.membership_set(alice, world["team_b"])
    client = api(make_token(alice, world["team_b"]))
    assert client.get(f"/api/v1/jobs/{world['job'].pk}/").status_code == 404
    assert client.get("/api/v1/jobs/").json()["count"] == 0


def test_node_routes_refuse_user_tokens(world):
    for client in (world["a"], world["b"]):
        for name, text, methods in ROUTES:
            if name not in NODE_ROUTES:
                continue
            for method in methods:
                response = _call(client, method, _fill(text, world["values"]))
                assert response.status_code == 403, (name, method, response.status_code)


def test_user_routes_refuse_node_tokens(world):
    node_client = world["node_client"]
    for name, text, methods in ROUTES:
        if name in NODE_ROUTES or name in DOC_ROUTES:
            continue
        values = dict(world["values"])
        for method in methods:
            response = _call(node_client, method, _fill(text, values))
            # A participant route takes no API token at all: a node token is no job token or secret either.
            expected = 401 if name in PARTICIPANT_ROUTES else 403
            assert response.status_code == expected, (name, method, response.status_code)
            assert not [s for s in _secrets(world) if s in _body(response)], name


# No credentials, expired, revoked and revoked-parent tokens on every route × verb: test_access_walk.py.


# Attempt credentials (strata.accounts.attempt_credentials): what an attempt's own processes hold. A credential of
# another attempt, on every route of the API, opens nothing: user routes refuse it (no user), the node's own
# routes refuse it, and the attempt routes refuse it for any attempt but its own.
ATTEMPT_CREDENTIAL_ROUTES = {"attempt-report", "attempt-renew", "attempt-artifact", "attempt-source",
                             "attempt-checkpoint", "attempt-tokens", "attempt-rendezvous", "attempt-credential",
                             "attempt-children", "attempt-child-cancel", "attempt-child-hold", "attempt-child-release",
                             "attempt-child-resize", "attempt-child-metrics", "attempt-children-metrics",
                             "attempt-children-batch", "attempt-child-file", "attempt-child-checkpoint",
                             "attempt-upload-start", "attempt-upload-parts", "attempt-upload-complete", "attempt-upload-abort"}


def _bearer(value: str):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    return client


def test_every_route_refuses_another_attempts_credential(world):
    import uuid

    from strata.accounts import attempt_credentials

    client = _bearer(attempt_credentials.mint(uuid.uuid4(), world["node"].pk)["credential"])
    for name, text, methods in ROUTES:
        if name in DOC_ROUTES:
            continue
        for method in methods:
            response = _call(client, method, _fill(text, dict(world["values"])))
            expected = {401} if name in PARTICIPANT_ROUTES else {401, 403}
            assert response.status_code in expected, (name, method, response.status_code)
            assert not [s for s in _secrets(world) if s in _body(response)], name


def test_its_own_attempt_routes_take_the_attempts_credential_and_nothing_else_does(world):
    from strata.accounts import attempt_credentials

    client = _bearer(attempt_credentials.mint(world["attempt"].pk, world["node"].pk)["credential"])
    for name, text, methods in ROUTES:
        if name in DOC_ROUTES:
            continue
        for method in methods:
            response = _call(client, method, _fill(text, dict(world["values"])))
            if name in ATTEMPT_CREDENTIAL_ROUTES:
                # Past the permission: what the route itself answers (the walk's calls carry no body).
                assert response.status_code not in (401, 403), (name, method, response.status_code)
            else:
                assert response.status_code in ({401} if name in PARTICIPANT_ROUTES else {401, 403}), (
                    name, method, response.status_code)
