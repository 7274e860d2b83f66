"""The log search page, ``/logs/?q=...&grep=...``: lines of the viewer's teams' jobs (one team, one job) with
these words (ranked) or matching a pattern (newest first), within a time range and of some ranks, the matches
marked. The job page's logs panel searches its own job here (``?job=<id>``). What q and grep mean:
``strata.jobs.log_search`` (the same search as ``GET /api/v1/logs/search/``)."""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import F
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_GET

from dashboard.views.common import login_required, page_context
from strata.accounts.selectors import visible_team_ids
from strata.jobs import log_search
from strata.jobs.models import LogLine
from strata.jobs.selectors import jobs_filtered, jobs_visible

PAGE_SIZE = 50
FIELDS = ("q", "grep", "fixed", "icase", "since", "until", "rank", "team", "job")


def segments(message: str, spans) -> list[tuple[str, bool]]:
    """``message`` cut at its matches: (text, matched) pairs the template escapes and marks."""
    pieces, at = [], 0
    for start, end in spans:
        pieces += [(message[at:start], False), (message[start:end], True)]
        at = end
    pieces.append((message[at:], False))
    return [piece for piece in pieces if piece[0]]


@login_required
@require_GET
def log_search_page(request):
    values = {name: request.GET.get(name, "").strip() for name in FIELDS}
    context = {"values": values, "hits": [], "errors": {}, "page": None, "job": None}
    team_ids = visible_team_ids(request)
    jobs = jobs_filtered(jobs_visible(team_ids), {"team": values["team"]}, strict=False)
    if values["job"]:
        try:
            jobs = jobs.filter(pk=uuid.UUID(values["job"]))
        except ValueError:
            context["errors"]["job"] = "must be a job id"
        context["job"] = jobs.first()
    try:
        query = log_search.query_from(request.GET)
    except log_search.QueryInvalid as error:
        context["errors"].update(error.errors)
        query = None
    if query is not None and (query.filtering or values["job"]) and not context["errors"]:
        lines = LogLine.objects.filter(job__in=jobs.order_by().values("pk")).annotate(job_name=F("job__name"))
        lines = log_search.ranked(lines, query)
        try:
            with log_search.refusals(lines.db, query):
                page = Paginator(lines, PAGE_SIZE).get_page(request.GET.get("page"))
                found = list(page.object_list)
        except log_search.QueryInvalid as error:
            context["errors"].update(error.errors)
        else:
            context["page"] = page
            context["hits"] = [{**log_search.hit(line, query), "segments": segments(
                line.message, log_search.highlights(line.message, query))} for line in found]
            kept = {name: value for name, value in values.items() if value}
            if page.has_previous():
                context["previous_query"] = urlencode({**kept, "page": page.previous_page_number()})
            if page.has_next():
                context["next_query"] = urlencode({**kept, "page": page.next_page_number()})
    if context["job"] is not None:
        context["trimmed"] = log_search.trimmed_notice(context["job"])
    return render(request, "dashboard/log_search.html", page_context(request, "logs", **context))


urlpatterns = [path("logs/", log_search_page, name="log-search")]
