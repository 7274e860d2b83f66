"""A team's members (``/team/members/``): who is in the team, their role and their own limits inside the team's
quota. Every role of the team sees the page; a team-admin (or a cluster admin) also adds users, changes roles and
limits, and removes members, through the same services and rules as ``/api/v1/teams/{slug}/members/``
(``strata.accounts.members``; limits checked against the team's quota). Another team is a 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from dashboard.views.common import login_required, page_context, visible_teams
from strata.accounts import members, roles
from strata.accounts.models import Membership
from strata.quotas.api.members import team_ceilings


def _team(request):
    """The team of the page: ``?team=slug`` (one the viewer can see; any other is a 404), else the first."""
    teams = list(visible_teams(request))
    slug = request.GET.get("team") or (request.POST.get("team") if request.method == "POST" else None)
    if slug:
        team = next((candidate for candidate in teams if candidate.slug == slug), None)
        if team is None:
            raise Http404("no such team")
        return team, teams
    return (teams[0] if teams else None), teams


def _limit(value: str, whole: bool):
    """A form's limit box: empty is no limit (None); anything else a number (the services check its range)."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        return int(value) if whole else float(value)
    except ValueError:
        return value  # named by members.limit_problems


def _page(request, team, teams, *, status: int = 200, errors=None):
    rows = list(members.members_of(team)) if team is not None else []
    if team is not None:  # what each member's admitted jobs hold now (against their own limits)
        from strata.quotas.services import member_limits

        held = member_limits(team.pk, everyone=True)
        for row in rows:
            load = held.get(row.user_id)
            row.held_jobs, row.held_gpus = (load.jobs, load.gpus) if load else (0, 0.0)
    manage = team is not None and roles.has_role(request, team, roles.TEAM_ADMIN)
    context = page_context(request, "members", team=team, member_teams=teams, members=rows, manage=manage,
                           role_choices=Membership.Role.values, errors=errors or {},
                           role=roles.role_in(request, team) if team is not None else None,
                           ceilings=team_ceilings(team) if team is not None else {})
    return render(request, "dashboard/members.html", context, status=status)


def _audit(action, request, team, target, before, after):
    from strata.audit.services import record

    record(action, request=request, team=team, target=target, before=before, after=after)


@login_required
@require_http_methods(["GET", "POST"])
def members_page(request):
    team, teams = _team(request)
    if request.method == "GET" or team is None:
        return _page(request, team, teams)
    roles.require_page(request, team, roles.TEAM_ADMIN, "manage its members")
    here = f"{reverse('dashboard:team-members')}?{urlencode({'team': team.slug})}"
    action = request.POST.get("action")
    username = request.POST.get("username", "").strip()
    try:
        with transaction.atomic():
            if action == "add":
                membership = members.member_add(team, username, request.POST.get("role") or Membership.Role.MEMBER)
                _audit("membership.add", request, team, f"user {username}", None, members.member_entry(membership))
                messages.success(request, f"Added {username} to {team.slug} as {membership.role}")
                return redirect(here)
            membership = members.members_of(team).filter(user__username=username).first()
            if membership is None:
                messages.error(request, f"No member {username} in team {team.slug}")
                return _page(request, team, teams, status=404)
            before = members.member_entry(membership)
            if action == "remove":
                revoked = members.member_remove(membership, cluster_admin=request.user.is_staff)
                _audit("membership.remove", request, team, f"user {username}", before, {"tokens_revoked": revoked})
                messages.success(request, f"Removed {username} from {team.slug}")
                return redirect(here)
            values = {"role": request.POST.get("role") or membership.role,
                      "max_concurrent_jobs": _limit(request.POST.get("max_concurrent_jobs", ""), True),
                      "max_gpus": _limit(request.POST.get("max_gpus", ""), False)}
            membership = members.member_update(membership, values, team_ceilings(team),
                                               cluster_admin=request.user.is_staff)
            after = members.member_entry(membership)
            if after["role"] != before["role"]:
                _audit("membership.role", request, team, f"user {username}", {"role": before["role"]},
                       {"role": after["role"]})
            limits = members.LIMIT_FIELDS
            if any(after[field] != before[field] for field in limits):
                _audit("member_limits.change", request, team, f"user {username}",
                       {f: before[f] for f in limits}, {f: after[f] for f in limits})
    except members.MemberRejected as error:
        messages.error(request, f"Not changed: {error}")
        return _page(request, team, teams, status=409 if error.conflict else 400, errors=error.errors)
    from strata.celery import request_pass
    from strata.quotas.services import admit_pending

    if admit_pending(team.pk):
        transaction.on_commit(request_pass)
    messages.success(request, f"Updated {username} in {team.slug}")
    return redirect(here)


urlpatterns = [
    path("team/members/", members_page, name="team-members"),
]
