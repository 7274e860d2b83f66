"""A team's members, as its team-admins manage them: add a user, change a role, remove a member, set a member's own
limits inside the team's quota. Who may call these is the views' question (``strata.accounts.roles``); these keep
the team's rules: a team always keeps one team-admin (a cluster admin may still remove the last), a removed
member's tokens of the team stop working, and a member's limits are numbers within the ceilings given (the team's
quota, which the layer above reads)."""

from __future__ import annotations

import math

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from strata.accounts.models import ApiToken, Membership, Team

LIMIT_FIELDS = ("max_concurrent_jobs", "max_gpus")


class MemberRejected(ValueError):
    """A change the team's rules refuse: ``errors`` maps each field at fault to a message (a 400, or a 409 when
    ``conflict``)."""

    def __init__(self, errors: dict[str, str], *, conflict: bool = False):
        self.errors, self.conflict = errors, conflict
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))


def member_entry(membership: Membership) -> dict:
    """A member as the API, the CLI and the dashboard show one."""
    return {"username": membership.user.username, "team": membership.team.slug, "role": membership.role,
            "max_concurrent_jobs": membership.max_concurrent_jobs, "max_gpus": membership.max_gpus}


def members_of(team: Team):
    return Membership.objects.filter(team=team).select_related("user", "team").order_by("user__username")


def role_problem(role) -> str | None:
    if role not in Membership.Role.values:
        return f"one of {', '.join(Membership.Role.values)}"
    return None


def limit_problems(values: dict, ceilings: dict) -> dict[str, str]:
    """Every bad per-user limit in ``values`` (``max_concurrent_jobs``: a whole number >= 0; ``max_gpus``: a
    number >= 0; null: no per-user limit), each at most its ceiling in ``ceilings`` (the team's quota; a missing
    or null ceiling: none)."""
    problems = {}
    for field in LIMIT_FIELDS:
        if field not in values or values[field] is None:
            continue
        value = values[field]
        whole = field == "max_concurrent_jobs"
        if isinstance(value, bool) or not isinstance(value, int | float) or (whole and not isinstance(value, int)) \
                or not math.isfinite(value) or value < 0:
            problems[field] = ("a whole number >= 0, or null for no per-user limit" if whole else
                               "a number >= 0 (GPUs, fractional), or null for no per-user limit")
            continue
        ceiling = ceilings.get(field)
        if ceiling is not None and value > ceiling + (0 if whole else 1e-9):
            problems[field] = f"must not exceed the team's quota ({field} {ceiling:g})"
    return problems


def _admins_left(team: Team, without: Membership) -> int:
    return Membership.objects.filter(team=team, role=Membership.Role.TEAM_ADMIN).exclude(pk=without.pk).count()


@transaction.atomic
def member_add(team: Team, username: str, role: str = Membership.Role.MEMBER) -> Membership:
    """Add the existing user ``username`` to ``team`` with ``role``. A user already in the team is a conflict
    (change their role instead)."""
    errors = {}
    user = get_user_model().objects.filter(username=username).first() if isinstance(username, str) else None
    if user is None:
        errors["username"] = "no such user (a cluster admin creates users: strata user create)"
    if problem := role_problem(role):
        errors["role"] = problem
    if errors:
        raise MemberRejected(errors)
    if Membership.objects.filter(team=team, user=user).exists():
        raise MemberRejected({"username": f"{username} is already in team {team.slug}"}, conflict=True)
    return Membership.objects.create(team=team, user=user, role=role)


@transaction.atomic
def member_update(membership: Membership, values: dict, ceilings: dict, *, cluster_admin: bool = False) -> Membership:
    """Change a member's ``role`` and/or own limits (``max_concurrent_jobs``, ``max_gpus``; null clears one).
    The team's last team-admin keeps the role unless a cluster admin changes it."""
    membership = Membership.objects.select_for_update().select_related("user", "team").get(pk=membership.pk)
    errors = limit_problems(values, ceilings)
    if "role" in values and (problem := role_problem(values["role"])):
        errors["role"] = problem
    if errors:
        raise MemberRejected(errors)
    role = values.get("role", membership.role)
    if membership.role == Membership.Role.TEAM_ADMIN and role != membership.role and not cluster_admin \
            and not _admins_left(membership.team, membership):
        raise MemberRejected({"role": f"{membership.user.username} is the last team-admin of "
                                      f"{membership.team.slug}: make another member team-admin first"},
                             conflict=True)
    membership.role = role
    for field in LIMIT_FIELDS:
        if field in values:
            setattr(membership, field, values[field])
    membership.save()
    return membership


@transaction.atomic
def member_remove(membership: Membership, *, cluster_admin: bool = False) -> int:
    """Remove a member from the team and revoke their API tokens of the team (a token is scoped to one team: it
    would keep working otherwise). Their jobs stay, for the team to see or cancel. Returns how many tokens were
    revoked. The team's last team-admin stays unless a cluster admin removes them."""
    from strata.accounts import services

    membership = Membership.objects.select_for_update().select_related("user", "team").get(pk=membership.pk)
    if membership.role == Membership.Role.TEAM_ADMIN and not cluster_admin \
            and not _admins_left(membership.team, membership):
        raise MemberRejected({"username": f"{membership.user.username} is the last team-admin of "
                                          f"{membership.team.slug}: make another member team-admin first"},
                             conflict=True)
    revoked = 0
    for token in ApiToken.objects.filter(user=membership.user, team=membership.team, kind=ApiToken.Kind.USER,
                                         revoked_at__isnull=True, expires_at__gt=timezone.now()):
        revoked += services.token_revoke(token)
    membership.delete()
    return revoked
