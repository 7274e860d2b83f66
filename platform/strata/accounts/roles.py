"""Roles within a team: what a caller may do in a team they can see.

Ranks, lowest first: ``viewer`` (reads the team's jobs, data, quota, members), ``member`` (submits; manages their
own jobs, tokens, code, data), ``team-admin`` (every job of the team, its tokens, secrets, members and per-user
limits). A cluster admin (``is_staff``) is above every team role in every team the request can see (a token: its
own team only; a browser session: every team).

One place decides: a view asks :func:`require` (the API: a 404 for a team the caller cannot see, a JSON 403 naming
the role needed for one it can) or :func:`has_role` / :func:`role_in` (the dashboard, templates); the permission
class :class:`TeamRole` does the same for a view whose URL names the team (``<slug>``). :func:`may_manage` is the
rule for one object owned by a user (a job, a token, a code bundle): its owner with ``member``, anyone else with
``team-admin``.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions
from rest_framework.permissions import BasePermission

from strata.accounts.models import Membership, Team
from strata.accounts.selectors import is_node_request, visible_team_ids

VIEWER: str = "viewer"  # the values of Membership.Role (checked in tests/platform/accounts/test_roles.py)
MEMBER: str = "member"
TEAM_ADMIN: str = "team-admin"
CLUSTER_ADMIN = "cluster-admin"  # no membership role: ``is_staff``, above every team role

# Lowest first; a role includes everything the roles before it may do.
RANKS = {VIEWER: 1, MEMBER: 2, TEAM_ADMIN: 3, CLUSTER_ADMIN: 4}
TEAM_ROLES = (VIEWER, MEMBER, TEAM_ADMIN)


class RoleRequired(exceptions.PermissionDenied):
    """The caller sees the team but lacks the role (an API 403 with a JSON ``detail`` naming it)."""

    def __init__(self, team: Team, minimum: str, actual: str | None, action: str = ""):
        what = f" to {action}" if action else ""
        detail = (f"the {minimum} role in team {team.slug} is needed{what}; you are "
                  f"{'a ' + actual if actual else 'not a member'} there")
        self.team, self.minimum, self.actual = team, minimum, actual
        super().__init__(detail)


def _check(minimum: str) -> int:
    if minimum not in RANKS:
        raise ValueError(f"unknown role {minimum!r}: one of {', '.join(RANKS)}")
    return RANKS[minimum]


def _team_id(team: Team | int) -> int:
    return team if isinstance(team, int) else team.pk


def user_role(user, team: Team | int) -> str | None:
    """``user``'s role in ``team`` regardless of the credential used: cluster-admin for staff, else the
    membership's role, else None."""
    if user is None or not user.is_authenticated:
        return None
    if user.is_staff:
        return CLUSTER_ADMIN
    return Membership.objects.filter(user=user, team_id=_team_id(team)).values_list("role", flat=True).first()


def role_in(request, team: Team | int) -> str | None:
    """The caller's role in ``team``: None where the request cannot see the team (a token of another team, a
    node token, no login), ``cluster-admin`` for a cluster admin, else the membership's role."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or is_node_request(request):
        return None
    if _team_id(team) not in visible_team_ids(request):
        return None
    return user_role(user, team)


def has_role(request, team: Team | int, minimum: str) -> bool:
    """Whether the caller holds at least ``minimum`` (viewer, member, team-admin, cluster-admin) in ``team``."""
    role = role_in(request, team)
    return role is not None and RANKS[role] >= _check(minimum)


def require(request, team: Team | None, minimum: str, action: str = "") -> str:
    """Return the caller's role in ``team`` if it is at least ``minimum``. A team the caller cannot see (or None)
    raises Http404 (exactly like a missing one); a visible team with a lower role raises :class:`RoleRequired`
    (DRF answers a JSON 403; the dashboard catches it with :func:`require_page`)."""
    needed = _check(minimum)
    role = role_in(request, team) if team is not None else None
    if team is None or role is None:
        raise Http404("no such team")
    if RANKS[role] < needed:
        raise RoleRequired(team, minimum, role, action)
    return role


def require_page(request, team: Team | None, minimum: str, action: str = "") -> str:
    """:func:`require` for the dashboard: Django's PermissionDenied (a 403 page) instead of DRF's."""
    try:
        return require(request, team, minimum, action)
    except RoleRequired as error:
        raise DjangoPermissionDenied(str(error.detail)) from None


def team_ids_with(request, minimum: str) -> list[int]:
    """The ids of the teams the request can see where the caller holds at least ``minimum``."""
    needed = _check(minimum)
    ids = visible_team_ids(request)
    user = request.user
    if not ids or is_node_request(request):
        return []
    if user.is_staff:
        return ids if RANKS[CLUSTER_ADMIN] >= needed else []
    allowed = [role for role, rank in RANKS.items() if rank >= needed]
    return list(Membership.objects.filter(user=user, team_id__in=ids, role__in=allowed)
                .values_list("team_id", flat=True))


def may_manage(request, team: Team | int, owner_id: int | None) -> bool:
    """Whether the caller may change an object of ``team`` owned by user ``owner_id`` (a job, a job's access
    token, a code bundle, a data set): its owner with ``member``, anyone with ``team-admin``."""
    role = role_in(request, team)
    if role is None:
        return False
    if RANKS[role] >= RANKS[TEAM_ADMIN]:
        return True
    return RANKS[role] >= RANKS[MEMBER] and owner_id is not None and owner_id == request.user.pk


def require_manage(request, team: Team, owner_id: int | None, action: str = "") -> str:
    """:func:`may_manage` or a JSON 403 (the object is visible, so never a 404 here) naming the role needed: member
    for the caller's own object (a viewer's), team-admin for anyone else's."""
    role = require(request, team, VIEWER)
    if may_manage(request, team, owner_id):
        return role
    own = owner_id is not None and owner_id == request.user.pk
    minimum = MEMBER if own else TEAM_ADMIN
    what = action or "change what another user owns"
    raise RoleRequired(team, minimum, role, what)


class TeamRole(BasePermission):
    """A DRF permission for a view whose URL names a team by ``slug`` (or ``team``): subclass it with
    ``minimum`` (a safe method needs ``read_minimum``, default viewer). Unknown or invisible team: 404."""

    minimum = MEMBER
    read_minimum = VIEWER
    message = "A role in this team is required."

    def has_permission(self, request, view):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or is_node_request(request):
            return False
        slug = view.kwargs.get("slug") or view.kwargs.get("team")
        if slug is None:
            return True
        team = Team.objects.filter(slug=slug).first()
        minimum = self.read_minimum if request.method in ("GET", "HEAD", "OPTIONS") else self.minimum
        require(request, team, minimum)
        return True


def role_permission(minimum: str, read_minimum: str = VIEWER) -> type[TeamRole]:
    """``permission_classes = [role_permission("team-admin")]``: a :class:`TeamRole` with those minimums."""
    _check(minimum)
    _check(read_minimum)
    return type(f"TeamRole_{minimum.replace('-', '_')}", (TeamRole,), {"minimum": minimum,
                                                                        "read_minimum": read_minimum})
