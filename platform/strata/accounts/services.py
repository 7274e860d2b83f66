"""Writes for users, teams and tokens."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from strata.accounts.models import ApiToken, Membership, Team, token_digest


@transaction.atomic
def team_create(slug: str, name: str | None = None) -> Team:
    from strata.quotas.models import Quota

    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    Quota.objects.get_or_create(team=team)
    return team


def membership_set(user, team: Team, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    return membership


def user_create(username: str, password: str | None = None, *, admin: bool = False, email: str = ""):
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        user = User.objects.create_user(username=username, email=email, password=password)
    elif password:
        user.set_password(password)
    user.is_staff = user.is_superuser = admin
    user.save()
    return user


def token_create(user, *, team: Team | None = None, kind: str = ApiToken.Kind.USER, name: str = "",
                 ttl_days: float | None = None) -> tuple[ApiToken, str]:
    """Create a token and return it with its raw value, which is never stored and cannot be shown again."""
    if kind == ApiToken.Kind.USER:
        if team is None:
            raise ValueError("a user token must be scoped to a team")
        if not user.is_staff and not Membership.objects.filter(user=user, team=team).exists():
            raise PermissionError(f"{user} is not a member of team {team.slug}")
    elif not user.is_staff:
        raise PermissionError("only cluster admins can create node tokens")
    prefix, raw = ApiToken.generate()
    days = settings.STRATA_TOKEN_TTL_DAYS if ttl_days is None else ttl_days
    token = ApiToken.objects.create(
        kind=kind, name=name, prefix=prefix, digest=token_digest(raw), user=user,
        team=team if kind == ApiToken.Kind.USER else None,
        expires_at=timezone.now() + timedelta(days=days),
    )
    return token, raw


def token_revoke(token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
