"""Bearer-token authentication: hashed at rest, expiring, revocable, scoped to one team."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from strata.accounts import attempt_credentials, node_tokens
from strata.accounts.models import ApiToken, token_digest


def bearer_value(request, keyword: str = "Bearer") -> str | None:
    """The raw value of an ``Authorization: Bearer <value>`` header; None without one. AuthenticationFailed for a
    malformed header or a value that is not text."""
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower() != keyword.lower().encode():
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
    try:
        return header[1].decode()
    except UnicodeError as error:
        raise exceptions.AuthenticationFailed("Token is not valid text.") from error


MAX_TOKEN_DEPTH = 64


def _ancestors_live(parent_id, now) -> bool:
    """Whether every token above a child token (its parent, that one's parent, ...) is neither revoked nor
    expired. A chain deeper than MAX_TOKEN_DEPTH (or a cycle) counts as dead."""
    for _ in range(MAX_TOKEN_DEPTH):
        row = ApiToken.objects.filter(pk=parent_id).values_list("revoked_at", "expires_at", "parent_id").first()
        if row is None:
            return True  # a deleted parent took its children with it (on_delete=CASCADE)
        revoked_at, expires_at, parent_id = row
        if revoked_at is not None or expires_at <= now:
            return False
        if parent_id is None:
            return True
    return False


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        raw = bearer_value(request, self.keyword)
        if raw is None:
            return None
        if attempt_credentials.is_attempt_credential(raw):
            # An attempt's processes: no user, and only their own attempt's node routes let them in
            # (strata.api.permissions.IsNodeOrOwnAttempt).
            from django.contrib.auth.models import AnonymousUser

            try:
                return AnonymousUser(), attempt_credentials.check(raw)
            except attempt_credentials.CredentialRefused as error:
                raise exceptions.AuthenticationFailed(str(error)) from None
        digest = token_digest(raw)
        cached = node_tokens.lookup(digest)
        if cached is not None:  # a node token checked within STRATA_NODE_TOKEN_CACHE_SECONDS (accounts.node_tokens)
            return cached
        token = ApiToken.objects.select_related("user", "team").filter(digest=digest).first()
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("Token has been revoked.")
        now = timezone.now()
        if token.expires_at <= now:
            raise exceptions.AuthenticationFailed("Token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User is inactive.")
        if token.parent_id is not None and not _ancestors_live(token.parent_id, now):
            # token_revoke cascades, but a parent revoked by a write that did not (the admin's form, a child
            # created while its parent was being revoked) must not leave a working child behind.
            raise exceptions.AuthenticationFailed("Token has been revoked.")
        if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        if token.kind == ApiToken.Kind.NODE:
            node_tokens.remember(digest, token.user, token)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword
