"""The cluster admins' what-if page (``/manage/quotas/what-if/``), beside the quota editor.

A form (a team, its proposed ``max_gpus`` and fair-share ``weight``, nodes to add or remove, how many days to
replay) runs the same :func:`strata.scheduling.whatif.what_if` as ``POST /api/v1/quotas/what-if/`` and shows its
per-team table (current settings, proposed, and what was recorded). "Apply" saves the proposed quota change through
``quotas.services.quota_update``, the quota editor's own service (validated, audited as ``quota.change``).
"""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods

from dashboard.views.common import admin_required, page_context
from strata.accounts.models import Team
from strata.quotas.services import QuotaInvalid, quota_update
from strata.scheduling.whatif import WhatIfInvalid, what_if

FORM_FIELDS = ("team", "max_gpus", "weight", "days", "add_nodes", "node_gpus", "remove_nodes")
FIGURES = (("wait_p50", "Wait p50 (s)"), ("wait_p90", "Wait p90 (s)"), ("jct_p50", "JCT p50 (s)"),
           ("utilization", "GPU utilization"), ("preemptions", "Preemptions"))


def request_body(form: dict) -> dict:
    """The API body the page's form stands for (blank fields: no change)."""
    body: dict = {"days": form.get("days") or 7}
    changes = {name: form[name] for name in ("max_gpus", "weight") if form.get(name, "") != ""}
    if form.get("team"):
        body["changes"] = {form["team"]: changes}
    nodes: dict = {}
    for name, verb in (("add_nodes", "add"), ("remove_nodes", "remove")):
        raw = form.get(name, "")
        if raw != "":
            try:
                count: object = int(raw)
            except ValueError:
                count = raw  # the API's check names it
            entry: dict = {"count": count}
            if verb == "add" and form.get("node_gpus", "") != "":
                try:
                    entry["gpus"] = int(form["node_gpus"])
                except ValueError:
                    entry["gpus"] = form["node_gpus"]
            nodes[verb] = [entry]
    if nodes:
        body["nodes"] = nodes
    return body


def table_rows(answer: dict) -> list[dict]:
    rows = []
    for team in answer["teams"]:
        figures = []
        for key, title in FIGURES:
            figures.append({"key": key, "title": title, "current": team["current"].get(key),
                            "proposed": team["proposed"].get(key), "actual": team["actual"].get(key, "")})
        rows.append({"team": team["team"], "jobs": team["current"]["jobs"], "figures": figures})
    return rows


@admin_required
@require_http_methods(["GET", "POST"])
def what_if_page(request):
    """The form, and after "Simulate" the comparison; "Apply" saves the proposed quota change (audited)."""
    form = {name: request.POST.get(name, request.GET.get(name, "")) for name in FORM_FIELDS}
    teams = Team.objects.order_by("slug")
    context = page_context(request, "what-if", form=form, team_choices=teams, figures=FIGURES)
    if request.method == "POST" and request.POST.get("action") == "apply":
        team = get_object_or_404(Team, slug=form["team"])
        changes = {name: form[name] for name in ("max_gpus", "weight") if form[name] != ""}
        try:
            change = quota_update(team.pk, changes, request=request)
        except QuotaInvalid as error:
            context["errors"] = {f"changes.{team.slug}.{name}": text for name, text in error.errors.items()}
            return render(request, "dashboard/whatif.html", context, status=400)
        verb = "saved" if change.changed else "unchanged"
        messages.success(request, f"Quota of {team.slug} {verb} ({', '.join(change.changed) or 'no change'}).")
        return redirect(f"{reverse('dashboard:quota-editor')}#team-{team.slug}")
    if request.method == "POST":
        try:
            answer = what_if(request_body(form))
        except WhatIfInvalid as error:
            context["errors"] = error.errors
            return render(request, "dashboard/whatif.html", context, status=400)
        context.update(answer=answer, rows=table_rows(answer),
                       can_apply=bool(form["team"]) and any(form[name] != "" for name in ("max_gpus", "weight")))
    return render(request, "dashboard/whatif.html", context)


urlpatterns = [
    path("manage/quotas/what-if/", what_if_page, name="quota-what-if"),
]
