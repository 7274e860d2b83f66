"""A team's secrets (``/team/secrets/``): their names, who set each and when; set one (the value typed into a
password box, never shown again) or delete one.

It goes through the same ``accounts.team_secrets`` services as ``/api/v1/secrets/`` and is scoped the same way:
the teams the viewer belongs to (a cluster admin too: no other team's); another team is a 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from components.runtime.contract.project import secret_name_problem
from dashboard.views.common import login_required, page_context
from strata.accounts import roles, team_secrets
from strata.accounts.models import Secret, Team
from strata.accounts.selectors import member_team_ids


def _page(request, team, *, errors=None, name: str = "", status: int = 200):
    rows = (Secret.objects.filter(team=team).select_related("created_by", "updated_by").order_by("name")
            if team is not None else [])
    context = page_context(request, "secrets", team=team, member_teams=_teams(request), secrets=rows,
                           manage=team is not None and roles.has_role(request, team, roles.TEAM_ADMIN),
                           errors=errors or {}, name=name, max_kib=team_secrets.MAX_VALUE_BYTES // 1024)
    return render(request, "dashboard/secrets.html", context, status=status)


def _teams(request):
    return list(Team.objects.filter(id__in=member_team_ids(request)).order_by("slug"))


def _team(request):
    """The team of the page: ``?team=slug`` (one the viewer belongs to; any other is a 404), else the first."""
    teams = _teams(request)
    slug = request.GET.get("team") or (request.POST.get("team") if request.method == "POST" else None)
    if slug:
        team = next((candidate for candidate in teams if candidate.slug == slug), None)
        if team is None:  # another team's page is indistinguishable from a missing one
            raise Http404("no such team")
        return team
    return teams[0] if teams else None


@login_required
@require_http_methods(["GET", "POST"])
def secrets_page(request):
    team = _team(request)
    if request.method == "GET" or team is None:
        return _page(request, team)
    roles.require_page(request, team, roles.TEAM_ADMIN, "set or delete its secrets")
    here = f"{reverse('dashboard:team-secrets')}?{urlencode({'team': team.slug})}"
    name = request.POST.get("name", "").strip()
    if request.POST.get("action") == "delete":
        deleted = Secret.objects.filter(team=team, name=name).first()
        if deleted is None:
            messages.error(request, f"No secret {name} in team {team.slug}")
            return _page(request, team, status=404)
        team_secrets.secret_delete(deleted, request=request)
        messages.success(request, f"Secret {name} of {team.slug} deleted")
        return redirect(here)
    value = request.POST.get("value", "")
    errors = {field: problem for field, problem in (("name", secret_name_problem(name)),
                                                     ("value", team_secrets.value_problem(value))) if problem}
    if errors:
        messages.error(request, "Secret not saved: check the highlighted fields.")
        return _page(request, team, errors=errors, name=name, status=400)
    _, created = team_secrets.secret_set(team, name, value, user=request.user, request=request)
    messages.success(request, f"Secret {name} of {team.slug} {'created' if created else 'replaced'}: jobs that "
                              "name it in environment.secrets get it from their next attempt on")
    return redirect(here)


urlpatterns = [
    path("team/secrets/", secrets_page, name="team-secrets"),
]
