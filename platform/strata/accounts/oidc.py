"""Single sign-on with OpenID Connect (docs/operations.md, Single sign-on), on mozilla-django-oidc.

The browser goes to ``/oidc/authenticate/`` (the login page's "Sign in with <provider>"), which sends it to the
provider with a state, a nonce and a PKCE challenge; the provider sends it back to ``/oidc/callback/``, where
:class:`OidcBackend` trades the code for tokens, checks the ID token (signature from the provider's JWKS, issuer,
audience, nonce) and reads the user's claims from the userinfo endpoint. The provider's endpoints come from its
discovery document (``<issuer>/.well-known/openid-configuration``), fetched at the first login and kept for an hour.

The user is the one named by ``STRATA_OIDC_USERNAME_CLAIM`` (then ``email``, then ``sub``), created at the first
login. With ``STRATA_OIDC_TEAM_CLAIM`` set, every login makes the user's teams those the claim names (memberships
created, their roles updated, the others removed) and the cluster-admin flag follow ``STRATA_OIDC_ADMIN_GROUP``; a
login whose answer lacks the claim changes neither.

Everything is read from the ``STRATA_OIDC_*`` settings when used (nothing at import), so the backend costs nothing
when single sign-on is off: it answers only the callback.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpResponseRedirect
from django.urls import path
from django.utils.http import url_has_allowed_host_and_scheme
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from strata.accounts import services
from strata.accounts.models import Membership, Team
from strata.audit.services import record

log = logging.getLogger(__name__)

WELL_KNOWN = "/.well-known/openid-configuration"
DISCOVERY_TTL_S = 3600.0
#: The request attribute holding why a sign-in failed (shown on the login page).
FAILURE_ATTR = "strata_oidc_failure"
CALLBACK_ROUTE = "oidc_authentication_callback"
SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
USERNAME_CHARS = re.compile(r"[^\w.@+-]")


def enabled() -> bool:
    """Whether single sign-on is configured (an issuer and a client id)."""
    return bool(settings.STRATA_OIDC_ISSUER and settings.STRATA_OIDC_CLIENT_ID)


def provider_name() -> str:
    return settings.STRATA_OIDC_PROVIDER_NAME or "single sign-on"


def password_login() -> bool:
    """Whether passwords may log in (``STRATA_PASSWORD_LOGIN``)."""
    return bool(settings.STRATA_PASSWORD_LOGIN)


# --- the provider: discovery ---------------------------------------------------------------------------------


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read or is not one."""


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str


_discovered: dict[str, tuple[float, Provider]] = {}
_discovery_lock = threading.Lock()


def discovery_url(issuer: str) -> tuple[str, str]:
    """(the discovery document's URL, the issuer it must name) for a configured issuer or discovery URL."""
    issuer = issuer.strip()
    if issuer.endswith(WELL_KNOWN):
        return issuer, issuer[: -len(WELL_KNOWN)]
    return issuer.rstrip("/") + WELL_KNOWN, issuer.rstrip("/")


def provider() -> Provider:
    """The configured provider's endpoints, from its discovery document (cached for DISCOVERY_TTL_S)."""
    url, expected = discovery_url(settings.STRATA_OIDC_ISSUER)
    now = time.monotonic()
    with _discovery_lock:
        cached = _discovered.get(url)
        if cached is not None and now - cached[0] < DISCOVERY_TTL_S:
            return cached[1]
    try:
        answer = requests.get(url, timeout=settings.STRATA_OIDC_TIMEOUT_SECONDS)
        answer.raise_for_status()
        document = answer.json()
    except (requests.RequestException, ValueError) as error:
        raise ProviderUnavailable(f"cannot read {url}: {error}") from None
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"{url} is not a discovery document")
    missing = [key for key in ("issuer", "authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
               if not isinstance(document.get(key), str)]
    if missing:
        raise ProviderUnavailable(f"{url} names no {', '.join(missing)}")
    if document["issuer"].rstrip("/") != expected:
        raise ProviderUnavailable(f"{url} names the issuer {document['issuer']!r}, not {expected!r}")
    found = Provider(document["issuer"], document["authorization_endpoint"], document["token_endpoint"],
                     document["userinfo_endpoint"], document["jwks_uri"])
    with _discovery_lock:
        _discovered[url] = (now, found)
    return found


def forget_provider() -> None:
    """Drop the cached discovery documents (tests; a provider that moved)."""
    with _discovery_lock:
        _discovered.clear()


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's settings, answered from the STRATA_OIDC_* ones."""
    values = {
        "OIDC_RP_CLIENT_ID": settings.STRATA_OIDC_CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": settings.STRATA_OIDC_CLIENT_SECRET,
        "OIDC_RP_SCOPES": " ".join(settings.STRATA_OIDC_SCOPES),
        "OIDC_RP_SIGN_ALGO": settings.STRATA_OIDC_SIGN_ALGO,
        "OIDC_RP_IDP_SIGN_KEY": None,
        "OIDC_TIMEOUT": settings.STRATA_OIDC_TIMEOUT_SECONDS,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_TOKEN_USE_BASIC_AUTH": True,  # client_secret_basic: the spec's default, what every provider takes
        "OIDC_CREATE_USER": True,
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_STORE_ID_TOKEN": False,
        "OIDC_AUTHENTICATION_CALLBACK_URL": CALLBACK_ROUTE,
        "LOGIN_REDIRECT_URL": settings.LOGIN_REDIRECT_URL,
        "LOGIN_REDIRECT_URL_FAILURE": settings.LOGIN_URL,
    }
    if attr in values:
        return values[attr]
    if attr.startswith("OIDC_OP_"):
        endpoints = provider()
        return {"OIDC_OP_AUTHORIZATION_ENDPOINT": endpoints.authorization_endpoint,
                "OIDC_OP_TOKEN_ENDPOINT": endpoints.token_endpoint,
                "OIDC_OP_USER_ENDPOINT": endpoints.userinfo_endpoint,
                "OIDC_OP_JWKS_ENDPOINT": endpoints.jwks_uri}.get(attr, *default)
    return getattr(settings, attr, *default)


# --- claims -> the user, their teams and the admin flag ---------------------------------------------------------


def username_from(claims: dict) -> str:
    """The Strata user name the claims name: STRATA_OIDC_USERNAME_CLAIM, else email, else sub; characters a
    Django user name cannot hold become '-'. Empty if none is there."""
    for claim in (settings.STRATA_OIDC_USERNAME_CLAIM, "email", "sub"):
        value = claims.get(claim) if claim else None
        if isinstance(value, str | int) and str(value).strip():
            return USERNAME_CHARS.sub("-", str(value).strip())[:150]
    return ""


def group_values(claims: dict) -> list[str] | None:
    """The values of the team claim (a list, or one string; a comma-separated string too), None when the claim
    is not configured or the answer lacks it."""
    claim = settings.STRATA_OIDC_TEAM_CLAIM
    if not claim or claim not in claims:
        return None
    value = claims[claim]
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple):
        return []
    return [str(item).strip() for item in value if isinstance(item, str | int) and str(item).strip()]


ROLE_ORDER = [role for role in ("viewer", Membership.Role.MEMBER, Membership.Role.TEAM_ADMIN)
              if role in Membership.Role.values]


def team_for_group(group: str) -> tuple[str, str] | None:
    """(team slug, role) for a group value, or None when it names no team: without STRATA_OIDC_TEAM_PREFIX, or
    after the prefix is stripped; a leading '/' (Keycloak's group paths) is dropped; "slug:role" gives a role."""
    prefix = settings.STRATA_OIDC_TEAM_PREFIX or ""
    value = group.lstrip("/")
    if prefix:
        if not value.startswith(prefix):
            return None
        value = value[len(prefix):]
    role = Membership.Role.MEMBER
    name, sep, suffix = value.rpartition(":")
    if sep and suffix in ROLE_ORDER:
        value, role = name, suffix
    if not SLUG.match(value):
        return None
    return value, str(role)


@dataclass
class Sync:
    """What a login changed (for the log and the tests)."""

    added: list[str]
    changed: list[str]
    removed: list[str]
    admin: bool | None  # the admin flag now, None: not managed by this login


@transaction.atomic
def sync_user(user, claims: dict) -> Sync:
    """Make ``user``'s teams and admin flag what the team claim says (nothing changes when it is absent)."""
    groups = group_values(claims)
    result = Sync([], [], [], None)
    if groups is None:
        return result
    admin_group = settings.STRATA_OIDC_ADMIN_GROUP
    if admin_group:
        admin = admin_group in groups or admin_group.lstrip("/") in {group.lstrip("/") for group in groups}
        if user.is_staff != admin or user.is_superuser != admin:
            user.is_staff = user.is_superuser = admin
            user.save(update_fields=["is_staff", "is_superuser"])
        result.admin = admin
    wanted: dict[str, str] = {}
    for group in groups:
        if admin_group and group.lstrip("/") == admin_group.lstrip("/"):
            continue
        mapped = team_for_group(group)
        if mapped is None:
            continue
        slug, role = mapped
        if slug not in wanted or ROLE_ORDER.index(role) > ROLE_ORDER.index(wanted[slug]):
            wanted[slug] = role
    teams = {team.slug: team for team in Team.objects.filter(slug__in=list(wanted))}
    for slug in wanted:
        if slug not in teams and settings.STRATA_OIDC_CREATE_TEAMS:
            teams[slug] = services.team_create(slug)
    current = {membership.team.slug: membership for membership in
               Membership.objects.filter(user=user).select_related("team")}
    for slug, team in teams.items():
        membership = current.get(slug)
        if membership is None:
            services.membership_set(user, team, wanted[slug])
            result.added.append(slug)
        elif membership.role != wanted[slug]:
            services.membership_set(user, team, wanted[slug])
            result.changed.append(slug)
    gone = [slug for slug in current if slug not in teams]
    if gone:
        Membership.objects.filter(user=user, team__slug__in=gone).delete()
        result.removed = sorted(gone)
    return result


# --- the backend -----------------------------------------------------------------------------------------------


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend on the STRATA_OIDC_* settings. It answers only the callback's
    ``authenticate(request=..., nonce=..., code_verifier=...)``: any other call (a password login) is None."""

    def __init__(self, *args, **kwargs):
        # Nothing read here: Django builds every backend for every authenticate(), password logins included.
        self.UserModel = get_user_model()

    @staticmethod
    def get_settings(attr, *args):
        return oidc_setting(attr, *args)

    def authenticate(self, request, **kwargs):
        if request is None or "nonce" not in kwargs or not enabled() or {"username", "password"} & set(kwargs):
            return None
        try:
            endpoints = provider()
            self.provider = endpoints
            self.OIDC_OP_TOKEN_ENDPOINT = endpoints.token_endpoint
            self.OIDC_OP_USER_ENDPOINT = endpoints.userinfo_endpoint
            self.OIDC_OP_JWKS_ENDPOINT = endpoints.jwks_uri
            self.OIDC_RP_CLIENT_ID = settings.STRATA_OIDC_CLIENT_ID
            self.OIDC_RP_CLIENT_SECRET = settings.STRATA_OIDC_CLIENT_SECRET
            self.OIDC_RP_SIGN_ALGO = settings.STRATA_OIDC_SIGN_ALGO
            self.OIDC_RP_IDP_SIGN_KEY = None
            user = super().authenticate(request, **kwargs)
        except ProviderUnavailable as error:
            return self._failed(request, f"the provider is unreachable ({error})")
        except requests.RequestException as error:
            return self._failed(request, f"the provider did not answer as expected ({error})")
        except SuspiciousOperation as error:
            return self._failed(request, str(error))
        if user is None and not getattr(request, FAILURE_ATTR, None):
            return self._failed(request, "the provider's answer names no user")
        return user

    def _failed(self, request, reason: str):
        log.warning("single sign-on failed: %s", reason)
        setattr(request, FAILURE_ATTR, reason)
        return None

    def verify_token(self, token, **kwargs):
        """The signature and nonce (mozilla-django-oidc), then what it leaves out: the issuer, the audience (this
        client) and an expiry."""
        payload = super().verify_token(token, **kwargs)
        issuer = getattr(self, "provider", None) and self.provider.issuer
        if issuer and payload.get("iss") != issuer:
            raise SuspiciousOperation(f"the ID token's issuer {payload.get('iss')!r} is not {issuer!r}")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token is not for this client (aud)")
        if len(audiences) > 1 and payload.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("the ID token names another authorized party (azp)")
        if "nonce" in kwargs and "exp" not in payload:
            raise SuspiciousOperation("the ID token has no expiry (exp)")
        return payload

    def verify_claims(self, claims):
        if not username_from(claims):
            raise SuspiciousOperation(f"the provider's answer has no {settings.STRATA_OIDC_USERNAME_CLAIM}, email "
                                      "or sub claim")
        return True

    def get_user(self, user_id):
        """The session's user, None once deactivated (as Django's ModelBackend: a session does not outlive it)."""
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def describe_user_by_claims(self, claims):
        return f"user {username_from(claims)!r}"

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(username=username_from(claims))

    def create_user(self, claims):
        email = claims.get("email") if isinstance(claims.get("email"), str) else ""
        user = self.UserModel.objects.create_user(username_from(claims), email=email)  # no usable password
        return self._synced(user, claims)

    def update_user(self, user, claims):
        email = claims.get("email")
        if isinstance(email, str) and email and email != user.email:
            user.email = email
            user.save(update_fields=["email"])
        return self._synced(user, claims)

    def _synced(self, user, claims):
        changed = sync_user(user, claims)
        if changed.added or changed.changed or changed.removed:
            log.info("single sign-on: %s joined %s, changed role in %s, left %s (admin: %s)", user.username,
                     changed.added, changed.changed, changed.removed, changed.admin)
        return user


# --- the views: /oidc/authenticate/ and /oidc/callback/ ----------------------------------------------------------


def _audit(action: str, request, user=None, reason: str = "") -> None:
    """The audit log's entry for a single sign-on login (password logins get theirs from their backend)."""
    target = f"user {user.get_username()}" if user is not None else "single sign-on"
    after = {"method": "sso", "provider": provider_name(), **({"reason": reason} if reason else {})}
    try:
        record(action, request=request, actor=user, target=target, after=after)
    except Exception:  # the audit trail never blocks a login
        log.exception("audit record %s failed", action)


def _failure(request, reason: str):
    messages.error(request, f"Sign-in with {provider_name()} failed: {reason}")
    _audit("login.failure", request, None, reason=reason[:500])
    return HttpResponseRedirect(settings.LOGIN_URL)


class SsoStart(OIDCAuthenticationRequestView):
    """``/oidc/authenticate/?next=...``: off to the provider (a 404 when single sign-on is off)."""

    def __init__(self, *args, **kwargs):
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)  # settings read in get()

    @staticmethod
    def get_settings(attr, *args):
        return oidc_setting(attr, *args)

    def get(self, request):
        if not enabled():
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider().authorization_endpoint
        except ProviderUnavailable as error:
            log.warning("single sign-on: %s", error)
            return _failure(request, "the provider is unreachable")
        self.OIDC_RP_CLIENT_ID = settings.STRATA_OIDC_CLIENT_ID
        return super().get(request)


class SsoCallback(OIDCAuthenticationCallbackView):
    """``/oidc/callback/``: the provider's answer; logs the user in, or back to the login page saying why."""

    @staticmethod
    def get_settings(attr, *args):
        return oidc_setting(attr, *args)

    def get(self, request):
        if not enabled():
            raise Http404("single sign-on is not configured")
        try:
            return super().get(request)
        except SuspiciousOperation as error:  # a state this browser did not start: an old or a forged answer
            return _failure(request, str(error))

    @property
    def success_url(self):
        next_url = self.request.session.get("oidc_login_next")
        if next_url and url_has_allowed_host_and_scheme(next_url, {self.request.get_host()},
                                                        require_https=self.request.is_secure()):
            return next_url
        return settings.LOGIN_REDIRECT_URL

    def login_success(self):
        response = super().login_success()
        _audit("login.success", self.request, self.user)
        return response

    def login_failure(self):
        reason = getattr(self.request, FAILURE_ATTR, None)
        if reason is None and self.request.GET.get("error"):
            reason = self.request.GET.get("error_description") or self.request.GET["error"]
        elif reason is None and getattr(self, "user", None) is not None and not self.user.is_active:
            reason = "this user is deactivated"
        return _failure(self.request, reason or "the sign-in was not completed; try again")


urlpatterns = [
    path("authenticate/", SsoStart.as_view(), name="oidc_authentication_init"),
    path("callback/", SsoCallback.as_view(), name=CALLBACK_ROUTE),
]
