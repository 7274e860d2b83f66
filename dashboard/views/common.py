"""What every dashboard view shares: team scoping, the cluster-admin check and JSON replies."""

from __future__ import annotations

import json
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404

from strata.accounts.models import Team
from strata.accounts.selectors import visible_team_ids
from strata.audit.selectors import may_read as audit_may_read
from strata.jobs.models import Job
from strata.jobs.selectors import jobs_visible

__all__ = ["login_required", "live_login_required", "admin_required", "scoped_job", "visible_teams", "json_reply", "page_context"]


def visible_teams(request):
    return Team.objects.filter(id__in=visible_team_ids(request)).order_by("slug")


def scoped_job(request, job_id) -> Job:
    """The job if the viewer may see it; a job of a foreign team is a 404, exactly like a missing one."""
    return get_object_or_404(jobs_visible(visible_team_ids(request)), pk=job_id)


def admin_required(view):
    """Cluster admins (staff) only. Anyone else gets a 403; anonymous users are sent to log in."""

    @login_required
    def wrapped(request, *args, **kwargs):
        if not request.user.is_staff:
            raise PermissionDenied("cluster admins only")
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


def live_login_required(view):
    """For endpoints the page script polls: an expired session is a 401 (the script reloads the page, which
    goes to the login form), never a redirect whose login HTML would be swapped into the page."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return json_reply({"detail": "authentication required"}, status=401)
        return view(request, *args, **kwargs)

    return wrapped


def json_reply(data, status: int = 200) -> JsonResponse:
    # allow_nan=False: a NaN loss must reach the browser as null, never as invalid JSON.
    return JsonResponse(data, status=status, safe=False, json_dumps_params={"allow_nan": False})


def page_context(request, section: str, **extra) -> dict:
    """The template context every page starts from: the active nav section and the viewer's teams (and whether to
    link the audit log: asked only when the template shows the link)."""
    return {"section": section, "teams": visible_teams(request), "audit_link": lambda: audit_may_read(request),
            **extra}


def figure_json(figure: dict) -> str:
    """A plotly figure as compact JSON for a <script type="application/json"> block."""
    return json.dumps(figure, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def not_found() -> Http404:
    return Http404("not found")
