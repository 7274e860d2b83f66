"""A team's MLflow tracking server (``/team/tracking/``), for its team-admins: where the team's jobs are mirrored
(URL, experiment, an optional token typed into a password box, never shown again), how the mirroring goes (the
last sync, the last error and the next try while the server fails) and the latest mirrored runs.

It goes through the same ``strata.tracking.services`` as ``/api/v1/tracking/`` (and records the same
``tracking.change`` audit entries); a team the viewer cannot see is a 404, one where they are not team-admin a
403.
"""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from dashboard.views.common import login_required, page_context
from strata.accounts import roles
from strata.accounts.models import Team
from strata.tracking import services
from strata.tracking.api import audit, audit_state
from strata.tracking.models import JobMirror, TrackingServer

RECENT_RUNS = 20


def _teams(request):
    return list(Team.objects.filter(id__in=roles.team_ids_with(request, roles.TEAM_ADMIN)).order_by("slug"))


def _team(request, teams):
    slug = request.GET.get("team") or (request.POST.get("team") if request.method == "POST" else None)
    if slug:
        team = Team.objects.filter(slug=slug).first()
        roles.require_page(request, team, roles.TEAM_ADMIN, action="configure the team's MLflow tracking server")
        return team
    return teams[0] if teams else None


def _page(request, team, teams, *, errors=None, form=None, status: int = 200):
    server = TrackingServer.objects.filter(team=team).select_related("team", "updated_by").first() if team else None
    runs = (JobMirror.objects.filter(team=team).select_related("job").order_by("-updated_at")[:RECENT_RUNS]
            if team else [])
    context = page_context(request, "tracking", team=team, admin_teams=teams, server=server,
                           described=services.describe(server), runs=runs, errors=errors or {},
                           form=form or {"url": server.url if server else "",
                                         "experiment": server.experiment if server else ""},
                           default_experiment=services.default_experiment(team) if team else "")
    return render(request, "dashboard/tracking.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def tracking_page(request):
    teams = _teams(request)
    team = _team(request, teams)
    if request.method == "GET" or team is None:
        return _page(request, team, teams)
    here = f"{reverse('dashboard:team-tracking')}?{urlencode({'team': team.slug})}"
    before = audit_state(TrackingServer.objects.filter(team=team).first())
    if request.POST.get("action") == "clear":
        if services.server_clear(team):
            audit(request, team, before, None)
            messages.success(request, f"Tracking server of {team.slug} removed: jobs are no longer mirrored")
        return redirect(here)
    url = request.POST.get("url", "").strip()
    experiment = request.POST.get("experiment", "").strip() or None
    token = request.POST.get("token", "")
    token_value = "" if request.POST.get("remove_token") else (token if token else None)
    errors = services.problems(url=url, experiment=experiment, token=token_value)
    if errors:
        messages.error(request, "Tracking server not saved: check the highlighted fields.")
        return _page(request, team, teams, errors=errors, form={"url": url, "experiment": experiment or ""},
                     status=400)
    server, created = services.server_set(team, url=url, experiment=experiment, token=token_value,
                                          user=request.user)
    audit(request, team, before, audit_state(server))
    messages.success(request, f"Tracking server of {team.slug} {'set' if created else 'updated'}: jobs are mirrored "
                              f"to experiment {server.experiment}")
    return redirect(here)


urlpatterns = [
    path("team/tracking/", tracking_page, name="team-tracking"),
]
