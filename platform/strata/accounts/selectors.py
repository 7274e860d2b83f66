"""Reads for accounts: which teams a request may see."""

from __future__ import annotations

from strata.accounts.models import ApiToken, Membership, Team


def request_token(request) -> ApiToken | None:
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiToken) else None


def visible_team_ids(request) -> list[int]:
    """Team ids the caller may read: a token sees its one team; a browser session sees the user's teams."""
    user = request.user
    if not user or not user.is_authenticated:
        return []
    token = request_token(request)
    if token is not None:
        return [token.team_id] if token.kind == ApiToken.Kind.USER and token.team_id else []
    if user.is_staff:
        return list(Team.objects.values_list("id", flat=True))
    return list(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def is_node_request(request) -> bool:
    token = request_token(request)
    return token is not None and token.kind == ApiToken.Kind.NODE
