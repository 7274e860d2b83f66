"""The audit log page, ``/audit/``: the entries the viewer may read (a cluster admin every one, a team-admin
their teams'), newest first, with the filters of ``GET /api/v1/audit/`` and a link to the same entries as CSV
(``/api/v1/audit/export.csv``). What is recorded: ``strata.audit``."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponseNotAllowed
from django.shortcuts import render
from django.urls import path, reverse

from dashboard.views.common import login_required, page_context
from strata.accounts.models import Team
from strata.audit.selectors import (
    FILTERS,
    REFUSED,
    AuditFilterInvalid,
    entries_filtered,
    entries_readable,
    readable_team_ids,
)

PAGE_SIZE = 100


def _change(value) -> str:
    return "" if value is None else json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True)


@login_required
def audit_page(request):
    entries = entries_readable(request)
    if entries is None:  # refused before anything else (a POST too)
        raise PermissionDenied(REFUSED)
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET"])
    values = {name: request.GET.get(name, "").strip() for name in FILTERS}
    ids = readable_team_ids(request)
    teams = Team.objects.order_by("slug") if ids is None else Team.objects.filter(id__in=ids).order_by("slug")
    context = {"values": values, "errors": {}, "page": None, "rows": [], "audit_teams": teams}
    try:
        entries = entries_filtered(entries, request.GET)
    except AuditFilterInvalid as error:
        context["errors"] = error.errors
        return render(request, "dashboard/audit.html", page_context(request, "audit", **context), status=400)
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    kept = {name: value for name, value in values.items() if value}
    context.update(
        page=page,
        rows=[{"entry": entry, "before": _change(entry.before), "after": _change(entry.after)}
              for entry in page.object_list],
        csv_url=f"{reverse('audit-export')}?{urlencode(kept)}" if kept else reverse("audit-export"),
        previous_query=urlencode({**kept, "page": page.previous_page_number()}) if page.has_previous() else "",
        next_query=urlencode({**kept, "page": page.next_page_number()}) if page.has_next() else "",
    )
    return render(request, "dashboard/audit.html", page_context(request, "audit", **context))


urlpatterns = [path("audit/", audit_page, name="audit")]
