"""Bearer tokens: revoked, expired, malformed and inactive-user tokens are 401; scope rules at creation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from strata.accounts.models import ApiToken, token_digest


@pytest.fixture
def alice(make_team, make_user):
    team = make_team("alpha")
    return make_user("alice", team), team


def test_valid_token_authenticates_and_raw_value_is_not_stored(alice, make_token, api):
    user, team = alice
    raw = make_token(user, team)
    assert api(raw).get("/api/v1/jobs/").status_code == 200
    token = ApiToken.objects.get(user=user)
    assert token.digest == token_digest(raw) and raw not in token.digest
    assert token.last_used_at is not None


def test_revoked_token_is_401(alice, make_token, api):
    user, team = alice
    raw = make_token(user, team)
    client = api(raw)
    token_id = ApiToken.objects.get(user=user).pk
    assert client.delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]


def test_expired_token_is_401(alice, make_token, api):
    user, team = alice
    raw = make_token(user, team)
    ApiToken.objects.filter(user=user).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = api(raw).get("/api/v1/jobs/")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer st_nope_nope"])
def test_malformed_or_unknown_tokens_are_401(db, header):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert client.get("/api/v1/jobs/").status_code == 401


def test_inactive_user_token_is_401(alice, make_token, api):
    user, team = alice
    raw = make_token(user, team)
    user.is_active = False
    user.save()
    assert api(raw).get("/api/v1/jobs/").status_code == 401


def test_token_create_via_api_returns_raw_once_and_scopes_team(alice, make_team, make_token, api):
    user, team = alice
    client = api(make_token(user, team))
    response = client.post("/api/v1/tokens/", {"name": "ci", "ttl_days": 1}, format="json")
    assert response.status_code == 201
    raw = response.json()["token"]
    assert response.json()["team"] == "alpha"
    assert api(raw).get("/api/v1/jobs/").status_code == 200
    assert "token" not in client.get("/api/v1/tokens/").json()["results"][0]
    make_team("beta")
    refused = client.post("/api/v1/tokens/", {"team": "beta"}, format="json")
    assert refused.status_code == 400 and "team" in refused.json()
    node = client.post("/api/v1/tokens/", {"kind": "node"}, format="json")
    assert node.status_code == 400 and "kind" in node.json()


def test_cannot_revoke_another_users_token(alice, make_team, make_user, make_token, api):
    user, team = alice
    make_token(user, team)
    other = make_user("bob", team)
    response = api(make_token(other, team)).delete(f"/api/v1/tokens/{ApiToken.objects.get(user=user).pk}/")
    assert response.status_code == 404
    assert ApiToken.objects.get(user=user).revoked_at is None


def test_service_refuses_tokens_outside_membership(alice, make_team, make_user):
    from strata.accounts.services import TokenRefused, token_create

    user, team = alice
    with pytest.raises(TokenRefused):
        token_create(user, team=make_team("beta"))
    with pytest.raises(TokenRefused):
        token_create(user, kind="node")
    with pytest.raises(TokenRefused):
        token_create(user, team=None)


def test_token_list_pages_are_stable_and_complete(alice, make_token, api):
    user, team = alice
    raws = [make_token(user, team) for _ in range(5)]
    client = api(raws[0])
    seen = []
    for page in range(1, 6):
        response = client.get("/api/v1/tokens/", {"page_size": 1, "page": page})
        assert response.status_code == 200
        seen += [t["id"] for t in response.json()["results"]]
    assert sorted(seen) == sorted(str(pk) for pk in ApiToken.objects.filter(user=user).values_list("id", flat=True))


# --- scope: a token sees and manages only its own team's tokens; node tokens only by admins' sessions ------

@pytest.fixture
def two_teams_admin(make_team, make_user, make_token):
    """An admin who belongs to demo and alpha, with a token for each and the cluster's node token."""
    demo, alpha = make_team("demo"), make_team("alpha")
    admin = make_user("root", demo, admin=True)
    from strata.accounts.services import membership_set

    membership_set(admin, alpha)
    return admin, make_token(admin, demo), make_token(admin, alpha), make_token(admin, kind="node")


def test_team_token_lists_and_revokes_only_its_own_team(two_teams_admin, api):
    admin, demo_raw, alpha_raw, node_raw = two_teams_admin
    client = api(demo_raw)
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert [t["team"] for t in listed] == ["demo"]
    alpha_token = ApiToken.objects.get(user=admin, team__slug="alpha")
    node_token = ApiToken.objects.get(kind="node")
    assert client.delete(f"/api/v1/tokens/{alpha_token.pk}/").status_code == 404
    assert client.delete(f"/api/v1/tokens/{node_token.pk}/").status_code == 404
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    # the node token still works for the node routes
    assert api(node_raw).post("/api/v1/node/heartbeat/", {}, format="json").status_code != 401


def test_team_token_cannot_create_node_token_even_for_an_admin(two_teams_admin, api):
    _, demo_raw, _, _ = two_teams_admin
    response = api(demo_raw).post("/api/v1/tokens/", {"kind": "node"}, format="json")
    assert response.status_code == 400 and "kind" in response.json()
    assert ApiToken.objects.filter(kind="node").count() == 1


def test_admin_session_manages_node_tokens(two_teams_admin, client):
    admin, *_ = two_teams_admin
    client.force_login(admin)
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert sorted(str(t["team"]) for t in listed) == ["None", "alpha", "demo"]
    created = client.post("/api/v1/tokens/", {"kind": "node", "name": "n2"}, content_type="application/json")
    assert created.status_code == 201 and created.json()["team"] is None
    node = ApiToken.objects.get(kind="node", name="")
    assert client.delete(f"/api/v1/tokens/{node.pk}/").status_code == 204


def test_member_session_never_sees_node_tokens(alice, make_user, make_token, client):
    user, team = alice
    make_token(make_user("root", admin=True), kind="node")
    client.force_login(user)
    assert client.get("/api/v1/tokens/").json()["results"] == []


# --- lifetime: a token cannot mint a longer-lived one, and its children die with it ------------------------

def test_short_token_cannot_mint_long_token(alice, make_token, api):
    user, team = alice
    short = api(make_token(user, team, ttl_days=0.001))
    refused = short.post("/api/v1/tokens/", {"ttl_days": 3650}, format="json")
    assert refused.status_code == 400 and "outlives" in refused.json()["ttl_days"][0]
    parent = ApiToken.objects.get(user=user)
    created = short.post("/api/v1/tokens/", {"name": "child"}, format="json")
    assert created.status_code == 201
    child = ApiToken.objects.get(name="child")
    assert child.expires_at <= parent.expires_at and child.parent_id == parent.pk


def test_revoking_a_token_revokes_what_it_created(alice, make_token, api):
    user, team = alice
    parent_raw = make_token(user, team)
    child_raw = api(parent_raw).post("/api/v1/tokens/", {"ttl_days": 1}, format="json").json()["token"]
    grandchild_raw = api(child_raw).post("/api/v1/tokens/", {"ttl_days": 0.5}, format="json").json()["token"]
    assert api(grandchild_raw).get("/api/v1/jobs/").status_code == 200
    parent = ApiToken.objects.get(digest=token_digest(parent_raw))
    assert api(parent_raw).delete(f"/api/v1/tokens/{parent.pk}/").status_code == 204
    for raw in (parent_raw, child_raw, grandchild_raw):
        assert api(raw).get("/api/v1/jobs/").status_code == 401


def test_session_created_tokens_may_live_long(alice, client):
    user, team = alice
    client.force_login(user)
    response = client.post("/api/v1/tokens/", {"team": "alpha", "ttl_days": 3650}, content_type="application/json")
    assert response.status_code == 201
    assert ApiToken.objects.get(user=user).parent_id is None
