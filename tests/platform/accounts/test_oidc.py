"""Single sign-on (strata.accounts.oidc) against a real OpenID provider: node-oidc-provider, started here.

Django's test client is the browser on Strata's side; a requests session is the same browser on the provider's
pages (its own login form). Every login goes the whole way: Strata's authorization request with state, nonce and
PKCE, the provider's login, the code traded for tokens over HTTP, the ID token checked against the provider's
keys, the claims read from its userinfo endpoint.
"""

from __future__ import annotations

import re

import pytest
import requests
from django.test import Client
from oidc_provider import query, running_provider, sign_in

from components.runtime.shared.tokens import new_api_token, token_digest
from strata.accounts import oidc
from strata.accounts.models import ApiToken, Membership, Team
from strata.audit.models import AuditEntry

CALLBACK = "http://testserver/oidc/callback/"
ACCOUNTS = {
    "alice": {"email": "alice@example.test", "groups": ["vision", "nlp:team-admin", "no-such-team", "strata-admins"]},
    "bob": {"email": "bob@example.test", "groups": ["vision:viewer", "/vision"]},
    "carol": {"email": "carol@example.test"},  # no groups claim at all
}


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    with running_provider(tmp_path_factory.mktemp("oidc-provider"), [CALLBACK], ACCOUNTS) as running:
        yield running


@pytest.fixture
def sso(settings, provider, db):
    """Strata pointed at the provider, team claim "groups", admin group "strata-admins"."""
    for name, value in provider.settings().items():
        setattr(settings, name, value)
    settings.STRATA_OIDC_SCOPES = ["openid", "email", "profile", "groups"]
    settings.STRATA_OIDC_TEAM_CLAIM = "groups"
    settings.STRATA_OIDC_ADMIN_GROUP = "strata-admins"
    settings.STRATA_OIDC_TEAM_PREFIX = ""
    settings.STRATA_OIDC_CREATE_TEAMS = False
    settings.STRATA_PASSWORD_LOGIN = True
    oidc.forget_provider()
    provider.set_accounts(ACCOUNTS)
    Team.objects.get_or_create(slug="vision", defaults={"name": "vision"})
    Team.objects.get_or_create(slug="nlp", defaults={"name": "nlp"})
    yield settings
    oidc.forget_provider()


def sso_login(client: Client, login: str, next_url: str | None = None):
    """The whole sign-in: Strata's /oidc/authenticate/, the provider's pages, Strata's callback. Returns the
    callback's answer."""
    start = client.get("/oidc/authenticate/", {"next": next_url} if next_url else {})
    assert start.status_code == 302, start.status_code
    authorize = start["Location"]
    params = query(authorize)
    assert params["code_challenge_method"] == "S256" and params["nonce"] and params["state"]
    assert set(params["scope"].split()) == {"openid", "email", "profile", "groups"}
    with requests.Session() as browser:
        back = sign_in(browser, authorize, login, CALLBACK)
    return client.get("/oidc/callback/", query(back))


def roles(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("team__slug", "role"))


def test_the_login_page_offers_the_provider(sso):
    page = Client().get("/login/?next=/cluster/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "Sign in with Test IdP" in text
    assert 'href="/oidc/authenticate/?next=%2Fcluster%2F"' in text
    assert 'name="password"' in text  # passwords are still on


def test_no_button_and_no_route_without_a_provider(settings, db):
    settings.STRATA_OIDC_ISSUER = ""
    assert "Sign in with" not in Client().get("/login/").content.decode()
    assert Client().get("/oidc/authenticate/").status_code == 404
    assert Client().get("/oidc/callback/", {"code": "x", "state": "y"}).status_code == 404


def test_first_login_creates_the_user_with_the_teams_and_the_admin_flag_of_the_claim(sso):
    client = Client()
    answer = sso_login(client, "alice")
    assert answer.status_code == 302 and answer["Location"] == "/jobs/"
    from django.contrib.auth import get_user_model

    alice = get_user_model().objects.get(username="alice")
    assert alice.email == "alice@example.test"
    assert not alice.has_usable_password()
    assert alice.is_staff and alice.is_superuser  # in strata-admins
    assert roles("alice") == {"vision": "member", "nlp": "team-admin"}  # no-such-team: no team, none created
    assert not Team.objects.filter(slug="no-such-team").exists()
    page = client.get("/jobs/")
    assert page.status_code == 200
    assert re.search(r'id="whoami">alice \(admin\)<', page.content.decode())
    entry = AuditEntry.objects.filter(action="login.success").latest("time")
    assert (entry.actor, entry.target, entry.after) == (alice, "user alice", {"method": "sso", "provider": "Test IdP"})


def test_a_deactivated_user_loses_the_session_and_cannot_sign_in_again(sso):
    client = Client()
    sso_login(client, "alice")
    assert client.get("/jobs/").status_code == 200
    from django.contrib.auth import get_user_model

    get_user_model().objects.filter(username="alice").update(is_active=False)
    assert client.get("/jobs/")["Location"].startswith("/login/")
    again = Client()
    answer = sso_login(again, "alice")
    assert answer["Location"] == "/login/" and "_auth_user_id" not in again.session
    assert "this user is deactivated" in again.get("/login/").content.decode()


def test_every_login_makes_the_teams_and_the_admin_flag_what_the_claim_says(sso, provider):
    sso_login(Client(), "alice")
    assert roles("alice") == {"vision": "member", "nlp": "team-admin"}
    provider.set_accounts({**ACCOUNTS, "alice": {"groups": ["nlp"]}})
    answer = sso_login(Client(), "alice")
    assert answer.status_code == 302 and answer["Location"] == "/jobs/"
    from django.contrib.auth import get_user_model

    alice = get_user_model().objects.get(username="alice")
    assert roles("alice") == {"nlp": "member"}  # left vision, no longer team-admin of nlp
    assert not alice.is_staff and not alice.is_superuser  # left strata-admins
    # An answer without the claim changes nothing (a provider that did not send it, not an empty list).
    provider.set_accounts({**ACCOUNTS, "alice": {}})
    sso_login(Client(), "alice")
    assert roles("alice") == {"nlp": "member"}
    # An empty list is the claim saying "no teams".
    provider.set_accounts({**ACCOUNTS, "alice": {"groups": []}})
    sso_login(Client(), "alice")
    assert roles("alice") == {}


def test_the_highest_role_a_team_is_named_with_wins_and_keycloak_paths_count(sso):
    sso_login(Client(), "bob")  # "vision:viewer" and "/vision" (a Keycloak group path)
    assert roles("bob") == {"vision": "member"}


def test_no_claim_no_change(sso):
    team = Team.objects.get(slug="vision")
    answer = sso_login(Client(), "carol")
    assert answer.status_code == 302
    from django.contrib.auth import get_user_model

    carol = get_user_model().objects.get(username="carol")
    Membership.objects.create(user=carol, team=team, role="team-admin")
    sso_login(Client(), "carol")
    assert roles("carol") == {"vision": "team-admin"}


def test_prefix_and_created_teams(sso, provider):
    sso.STRATA_OIDC_TEAM_PREFIX = "strata-"
    sso.STRATA_OIDC_CREATE_TEAMS = True
    provider.set_accounts({"dave": {"groups": ["strata-robotics:team-admin", "vision", "strata-Bad Name"]}})
    sso_login(Client(), "dave")
    assert roles("dave") == {"robotics": "team-admin"}  # created; vision has no prefix; a name no slug can be
    assert Team.objects.filter(slug="robotics").exists()
    from strata.quotas.models import Quota

    assert Quota.objects.filter(team__slug="robotics").exists()  # a team like any other (its quota)


def test_next_url_is_followed_on_this_host_only(sso):
    assert sso_login(Client(), "alice", "/cluster/")["Location"] == "/cluster/"
    assert sso_login(Client(), "alice", "https://evil.example/")["Location"] == "/jobs/"


def test_a_forged_or_replayed_answer_logs_nobody_in(sso):
    client = Client()
    start = client.get("/oidc/authenticate/")
    with requests.Session() as browser:
        back = query(sign_in(browser, start["Location"], "alice", CALLBACK))
    forged = client.get("/oidc/callback/", {**back, "state": "not-the-state"})
    assert forged.status_code == 302 and forged["Location"] == "/login/"
    assert "_auth_user_id" not in client.session
    # The right state in a browser that did not start the sign-in: no state there, refused.
    other = Client()
    assert other.get("/oidc/callback/", back)["Location"] == "/login/"
    assert "_auth_user_id" not in other.session
    # The forged answer spent nothing of the real one: it still logs the browser that started it in, once.
    assert client.get("/oidc/callback/", back)["Location"] == "/jobs/"
    client.logout()
    assert client.get("/oidc/callback/", back)["Location"] == "/login/"  # the state is spent
    assert "_auth_user_id" not in client.session
    failures = AuditEntry.objects.filter(action="login.failure", target="single sign-on")
    assert failures.count() == 3 and all(entry.after["method"] == "sso" for entry in failures)
    assert "state not found" in failures.order_by("time").first().after["reason"]


def test_the_provider_saying_no_is_shown_on_the_login_page(sso):
    client = Client()
    client.get("/oidc/authenticate/")
    state = next(iter(client.session["oidc_states"]))
    answer = client.get("/oidc/callback/", {"error": "access_denied", "error_description": "End-User aborted",
                                            "state": state}, follow=True)
    assert "Sign-in with Test IdP failed: End-User aborted" in answer.content.decode()
    assert "_auth_user_id" not in client.session


def test_an_unreachable_provider_is_a_message_not_a_500(sso):
    from support import free_port

    sso.STRATA_OIDC_ISSUER = f"http://127.0.0.1:{free_port()}"
    answer = Client().get("/oidc/authenticate/", follow=True)
    assert answer.status_code == 200
    assert "Sign-in with Test IdP failed: the provider is unreachable" in answer.content.decode()


def test_the_id_token_must_be_for_this_client_from_this_issuer(sso, monkeypatch):
    from django.core.exceptions import SuspiciousOperation
    from mozilla_django_oidc.auth import OIDCAuthenticationBackend

    backend = oidc.OidcBackend()
    backend.provider = oidc.provider()
    backend.OIDC_RP_CLIENT_ID = sso.STRATA_OIDC_CLIENT_ID
    good = {"iss": backend.provider.issuer, "aud": sso.STRATA_OIDC_CLIENT_ID, "exp": 2**40, "nonce": "n"}
    for payload, problem in [({**good, "iss": "http://127.0.0.1:1"}, "issuer"), ({**good, "aud": "other"}, "aud"),
                             ({**good, "aud": ["other", sso.STRATA_OIDC_CLIENT_ID]}, "azp"),
                             ({key: value for key, value in good.items() if key != "exp"}, "exp")]:
        monkeypatch.setattr(OIDCAuthenticationBackend, "verify_token", lambda self, token, payload=payload, **kw: payload)
        with pytest.raises(SuspiciousOperation, match=problem):
            backend.verify_token("token", nonce="n")
    monkeypatch.setattr(OIDCAuthenticationBackend, "verify_token", lambda self, token, **kw: good)
    assert backend.verify_token("token", nonce="n") == good


def test_group_values_map_to_teams(settings):
    settings.STRATA_OIDC_TEAM_PREFIX = ""
    assert oidc.team_for_group("vision") == ("vision", "member")
    assert oidc.team_for_group("/vision:team-admin") == ("vision", "team-admin")
    assert oidc.team_for_group("vision:viewer") == ("vision", "viewer")
    assert oidc.team_for_group("vision:owner") is None  # not a role, and "vision:owner" is no slug
    assert oidc.team_for_group("Domain Users") is None
    settings.STRATA_OIDC_TEAM_PREFIX = "strata-"
    assert oidc.team_for_group("strata-vision") == ("vision", "member")
    assert oidc.team_for_group("vision") is None


def test_user_names_come_from_the_configured_claim(settings):
    settings.STRATA_OIDC_USERNAME_CLAIM = "preferred_username"
    assert oidc.username_from({"preferred_username": "Alice", "email": "a@x.test", "sub": "1"}) == "Alice"
    assert oidc.username_from({"email": "a@x.test", "sub": "1"}) == "a@x.test"
    assert oidc.username_from({"sub": "auth0|42"}) == "auth0-42"
    assert oidc.username_from({}) == ""


# --- passwords ------------------------------------------------------------------------------------------------


@pytest.fixture
def erin(make_user):
    return make_user("erin")  # password "pw-erin"


def test_password_login_turned_off_everywhere(sso, erin):
    sso.STRATA_PASSWORD_LOGIN = False
    page = Client().get("/login/").content.decode()
    assert 'name="password"' not in page and "Sign in with Test IdP" in page
    assert "Password login is turned off on this cluster: sign in with Test IdP." in page
    for path in ("/login/", "/admin/login/", "/api-auth/login/"):
        client = Client()
        answer = client.post(path, {"username": "erin", "password": "pw-erin"})  # the right password
        assert answer.status_code == 403, (path, answer.status_code)
        assert "Password login is turned off on this cluster" in answer.content.decode(), path
        assert "_auth_user_id" not in client.session, path
    from django.contrib.auth import authenticate

    assert authenticate(username="erin", password="pw-erin") is None
    # Single sign-on still works.
    client = Client()
    assert sso_login(client, "alice")["Location"] == "/jobs/"
    assert client.get("/jobs/").status_code == 200


def test_with_passwords_on_the_login_guard_still_applies(sso, erin, login_clock):
    sso.STRATA_LOGIN_FREE_FAILURES = 1
    sso.STRATA_LOGIN_BACKOFF_SECONDS = 60.0
    client = Client(REMOTE_ADDR="10.0.0.9")
    assert client.post("/login/", {"username": "erin", "password": "wrong"}).status_code == 200
    refused = client.post("/login/", {"username": "erin", "password": "pw-erin"})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "Too many failed logins" in refused.content.decode()
    login_clock.advance(61)
    assert client.post("/login/", {"username": "erin", "password": "pw-erin"}).status_code == 302


# --- the command line's token, from the web session ----------------------------------------------------------------


def cli_link_params(team: str | None = None) -> tuple[str, dict]:
    prefix, raw = new_api_token()
    params = {"prefix": prefix, "digest": token_digest(raw), "name": "strata login on test"}
    if team:
        params["team"] = team
    return raw, params


def test_cli_login_gives_the_command_line_a_token_of_the_chosen_team(sso, api):
    client = Client()
    sso_login(client, "bob")  # vision only
    raw, params = cli_link_params("vision")
    assert api(raw).get("/api/v1/tokens/").status_code == 401  # what strata login polls with: not yet
    page = client.get("/cli-login/", params).content.decode()
    code = f"{params['digest'][:4]}-{params['digest'][4:8]}".upper()
    assert f'id="cli-login-code">{code}<' in page
    assert '<option value="vision" selected>' in page and "nlp" not in page  # only bob's teams
    wrong = client.post("/cli-login/", {**params, "team": "nlp"}).content.decode()  # not his team
    assert "Pick one of your teams" in wrong
    assert not ApiToken.objects.filter(digest=params["digest"]).exists()
    approved = client.post("/cli-login/", params)
    assert approved.status_code == 200 and 'id="cli-login-approved"' in approved.content.decode()
    token = ApiToken.objects.get(digest=params["digest"])
    assert (token.user.username, token.team.slug, token.prefix, token.name) == (
        "bob", "vision", params["prefix"], "strata login on test")
    listed = api(raw).get("/api/v1/tokens/")
    assert listed.status_code == 200
    assert [row["prefix"] for row in listed.json()["results"]] == [params["prefix"]]
    assert AuditEntry.objects.filter(action="token.create", actor=token.user).exists()
    again = client.post("/cli-login/", params).content.decode()
    assert "approved already" in again
    assert ApiToken.objects.filter(user=token.user).count() == 1


def test_cli_login_link_for_a_visitor_who_is_not_logged_in(sso):
    _, params = cli_link_params()
    plain = Client().get("/cli-login/", params)
    assert plain.status_code == 302 and plain["Location"].startswith("/login/?next=/cli-login/")
    straight = Client().get("/cli-login/", {**params, "sso": "1"})
    assert straight.status_code == 302 and straight["Location"].startswith("/oidc/authenticate/?next=%2Fcli-login%2F")
    # Through the provider and back to the page, as `strata login --sso` does it.
    client = Client()
    start = client.get(straight["Location"])
    with requests.Session() as browser:
        back = sign_in(browser, start["Location"], "bob", CALLBACK)
    landed = client.get("/oidc/callback/", query(back))
    assert landed["Location"].startswith("/cli-login/?") and params["digest"] in landed["Location"]
    assert "cli-login-code" in client.get(landed["Location"]).content.decode()


def test_cli_login_refuses_broken_links(sso, make_user):
    client = Client()
    client.force_login(make_user("frank", team=Team.objects.get(slug="vision")))
    _, params = cli_link_params()
    for broken in ({**params, "digest": "zz"}, {**params, "prefix": ""}, {}):
        page = client.post("/cli-login/", {**broken, "team": "vision"}).content.decode()
        assert "not a complete strata login link" in page
    assert not ApiToken.objects.filter(user__username="frank").exists()
    lonely = Client()
    lonely.force_login(make_user("gina"))
    assert "You belong to no team yet" in lonely.get("/cli-login/", params).content.decode()


def test_strata_check_deploy_warns_of_a_configuration_nobody_can_log_in_with(settings):
    from strata.checks import check_sign_in

    settings.STRATA_OIDC_ISSUER, settings.STRATA_OIDC_CLIENT_ID = "", ""
    settings.STRATA_PASSWORD_LOGIN = True
    settings.STRATA_OIDC_ADMIN_GROUP, settings.STRATA_OIDC_TEAM_CLAIM = "", ""
    assert check_sign_in() == []
    settings.STRATA_PASSWORD_LOGIN = False
    assert [problem.id for problem in check_sign_in()] == ["strata.W090"]
    settings.STRATA_OIDC_ISSUER, settings.STRATA_OIDC_CLIENT_ID = "https://sso.example.test", "strata"
    assert check_sign_in() == []
    settings.STRATA_OIDC_ADMIN_GROUP = "admins"
    assert [problem.id for problem in check_sign_in()] == ["strata.W091"]
    settings.STRATA_OIDC_TEAM_CLAIM = "groups"
    assert check_sign_in() == []


def test_the_client_secret_can_come_from_a_file(tmp_path, monkeypatch):
    from strata.conf import env_str

    secret = tmp_path / "oidc-secret"
    secret.write_text("from-the-file\n")
    monkeypatch.setenv("STRATA_OIDC_CLIENT_SECRET", "from-the-environment")
    monkeypatch.setenv("STRATA_OIDC_CLIENT_SECRET_FILE", str(secret))
    assert env_str("STRATA_OIDC_CLIENT_SECRET", "") == "from-the-file"
