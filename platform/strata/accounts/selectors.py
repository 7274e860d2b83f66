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


def member_team_ids(request) -> list[int]:
    """Team ids whose members-only data (the team's secrets) the caller may manage: a user token's one team; a
    browser session, the user's own teams. Unlike :func:`visible_team_ids`, a cluster admin's session gets no
    other team's (as with tokens, where an admin sees only their own)."""
    user = request.user
    if not user or not user.is_authenticated:
        return []
    token = request_token(request)
    if token is not None:
        return [token.team_id] if token.kind == ApiToken.Kind.USER and token.team_id else []
    return list(Membership.objects.filter(user=user).values_list("team_id", flat=True))


class TeamChoiceError(ValueError):
    """The request names no team it may use (a 400 on ``team``)."""


def member_team(request, slug: str | None) -> Team:
    """The team a write of members-only data goes to: the named one if the caller is a member (a token: its own
    team only); without a name, the token's team, or the caller's only team."""
    team_ids = member_team_ids(request)
    if slug is None:
        if len(team_ids) == 1:
            return Team.objects.get(pk=team_ids[0])
        raise TeamChoiceError("required: you belong to several teams" if team_ids else "you belong to no team")
    team = Team.objects.filter(slug=slug, id__in=team_ids).first()
    if team is None:
        raise TeamChoiceError(f"unknown team {slug!r}")
    return team
