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
    from strata.accounts.services import token_create

    user, team = alice
    with pytest.raises(PermissionError):
        token_create(user, team=make_team("beta"))
    with pytest.raises(PermissionError):
        token_create(user, kind="node")
    with pytest.raises(ValueError):
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
