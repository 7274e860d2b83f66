"""The jobs pages: the list (with live rows), submit (generated form and YAML/JSON editor), the job detail page
with live logs, events, metric charts and component panels, and cancel / resubmit.

Views stay thin: validation is :mod:`dashboard.forms` over the API's own serializer, writes are
``strata.jobs.services``, reads are scoped to the viewer's teams (another team's job is a 404).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any
from urllib.parse import urlencode

import yaml
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, F, Window
from django.db.models.functions import RowNumber
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from components.runtime.contract import registry
from dashboard import forms, job_figures
from dashboard.panels import DatabasePanelData, render_panels
from dashboard.views.common import (
    figure_json,
    json_reply,
    live_login_required,
    login_required,
    page_context,
    visible_teams,
)
from strata.accounts.models import Membership
from strata.accounts.selectors import visible_team_ids
from strata.api.throttles import SubmitThrottle
from strata.api.values import value_problems
from strata.jobs import log_search, services
from strata.jobs.api.serializers import JobSerializer
from strata.jobs.models import Artifact, Job, JobState
from strata.jobs.selectors import (
    JOB_FILTERS,
    jobs_filtered,
    jobs_visible,
    jobs_with_attempts,
    serving_endpoint,
)

PAGE_SIZE = 50
INITIAL_LOG_LINES = 2000
INITIAL_EVENTS = 500
LIVE_LOG_LINES = 2000
LIVE_EVENTS = 500
LIVE_METRIC_POINTS = 20_000


# --- list ----------------------------------------------------------------------------------------------------

FILTERS = JOB_FILTERS


def _filters(request) -> dict[str, str]:
    return {name: request.GET.get(name, "").strip() for name in FILTERS}


def filtered_jobs(team_ids, filters: dict[str, str]):
    """The jobs list's rows: the API's filters (``jobs.selectors.jobs_filtered``), lenient with bad values."""
    return jobs_filtered(jobs_visible(team_ids), filters, strict=False).order_by("-created_at", "-id")


CHILD_ROWS = 100  # child rows listed under one parent, as the job page lists (the rest: its "all child jobs" link)
CHILD_DEPTH = 3  # levels of children listed under a top-level row


def _nested_rows(matching, top: list[Job]) -> list[dict[str, Any]]:
    """The rows of one page: each top-level job followed by its children that match the filters (oldest first,
    at most CHILD_ROWS each, CHILD_DEPTH levels deep), which the page shows collapsed under it."""
    children: dict[Any, list[Job]] = {}
    totals: dict[Any, int] = {}
    level = [job.pk for job in top]
    for _ in range(CHILD_DEPTH):
        if not level:
            break
        below = matching.filter(parent_id__in=level)
        totals.update(below.order_by().values_list("parent_id").annotate(n=Count("id")))
        ranked = (below.annotate(rank=Window(RowNumber(), partition_by=[F("parent_id")],
                                             order_by=[F("created_at").asc(), F("id").asc()]))
                  .filter(rank__lte=CHILD_ROWS).order_by("created_at", "id"))
        level = []
        for child in ranked:
            children.setdefault(child.parent_id, []).append(child)
            level.append(child.pk)
    rows: list[dict[str, Any]] = []

    def add(job: Job, depth: int, parent: Job | None) -> None:
        below = children.get(job.pk, [])
        rows.append({**_row(job), "depth": depth, "parent": parent.pk if parent else None,
                     "children": totals.get(job.pk, 0), "more": totals.get(job.pk, 0) > len(below)})
        for child in below:
            add(child, depth + 1, job)

    for job in top:
        add(job, 0, None)
    return rows


def _rows_context(request) -> dict[str, Any]:
    filters = _filters(request)
    team_ids = visible_team_ids(request)
    matching = filtered_jobs(team_ids, filters)
    # Paginated over the top-level rows: a job whose parent is listed too comes with its parent (collapsed
    # under it), so a sweep's trials do not crowd the top of the list. Listing one job's children shows them flat.
    top = matching if filters["parent"] else matching.exclude(parent_id__in=matching.order_by().values("id"))
    page = Paginator(top, PAGE_SIZE).get_page(request.GET.get("page"))
    # Jobs per state under the other filters: the state chips above the table.
    counts = dict(filtered_jobs(team_ids, {**filters, "state": ""}).order_by().values_list("state")
                  .annotate(n=Count("id")))
    counts = {state: counts.get(state, 0) for state in JobState.values}
    total = page.paginator.count
    return {
        "filters": filters,
        "page": page,
        "jobs": _nested_rows(matching, list(page.object_list)),
        "range_text": f"{page.start_index()}–{page.end_index()} of {total} job{'s' if total != 1 else ''}"
                      if total else "no jobs",
        "team_ids": team_ids,
        "state_counts": list(counts.items()),
        "counts_json": json.dumps(counts),
    }


def _row(job: Job) -> dict[str, Any]:
    return {"job": job, "gpus": gpu_text(job.resources)}


def _query(filters: dict[str, str], **extra) -> str:
    return urlencode({key: value for key, value in {**filters, **extra}.items() if value})


@login_required
@require_GET
def job_list(request):
    context = _rows_context(request)
    filters = context["filters"]
    owners = (Membership.objects.filter(team_id__in=context["team_ids"]).order_by("user__username")
              .values_list("user__username", flat=True).distinct())
    page = context["page"]
    return render(request, "dashboard/jobs_list.html", page_context(
        request, "jobs", **context,
        states=JobState.values,
        state_links=[(state, count, _query(filters, state=state)) for state, count in context["state_counts"]],
        kinds=sorted(registry.kinds()),
        owners=list(owners),
        rows_url=reverse("dashboard:job-rows"),
        previous_query=_query(filters, page=page.previous_page_number()) if page.has_previous() else None,
        next_query=_query(filters, page=page.next_page_number()) if page.has_next() else None,
        mine_query=_query({**filters, "owner": request.user.username}),
        parent_job=_parent_job(context["team_ids"], filters["parent"]),
    ))


def _parent_job(team_ids, parent: str) -> Job | None:
    """The job whose children the list is filtered to, when the viewer may see it."""
    try:
        return jobs_visible(team_ids).filter(pk=uuid.UUID(parent)).first() if parent else None
    except ValueError:
        return None


@live_login_required
@require_GET
def job_rows(request):
    """The list's ``<tbody>``, for the page to swap in every few seconds."""
    return render(request, "dashboard/jobs_rows.html", _rows_context(request))


# --- submit --------------------------------------------------------------------------------------------------

def _kind(request) -> str:
    kinds = registry.kinds()
    kind = request.GET.get("kind") or request.POST.get("kind") or next(iter(kinds))  # the first registered kind
    if kind not in kinds:
        raise Http404(f"unknown job kind {kind!r}")
    return kind


def _default_team(request, teams) -> str | None:
    mine = list(Membership.objects.filter(user=request.user, team__in=teams).values_list("team__slug", flat=True))
    if len(mine) == 1:
        return mine[0]
    slugs = [team.slug for team in teams]
    return slugs[0] if len(slugs) == 1 else None


def public_url(request) -> str:
    """Where API clients reach this control plane: STRATA_PUBLIC_URL when it is configured, else the host
    this page was requested on (the setting's built-in default names only the local machine)."""
    if os.environ.get("STRATA_PUBLIC_URL"):
        return settings.STRATA_PUBLIC_URL.rstrip("/")
    return request.build_absolute_uri("/").rstrip("/")


def _snippets(request, submission: forms.Submission) -> dict[str, str]:
    document = forms.submit_document(submission)
    return {"yaml": forms.to_yaml(document), "cli": forms.cli_snippet(document),
            "curl": forms.curl_snippet(document, public_url(request))}


def _submit(request, submission: forms.Submission, nonce: str | None) -> Job | None:
    """Submit a valid submission; on a refusal, record the error on the submission and return None."""
    throttle = SubmitThrottle()  # the API's submit rate, counted together with the viewer's API submits
    if not throttle.allow_request(request, None):
        submission.errors["non_field_errors"] = f"too many submits: try again in {throttle.wait() or 1:.0f} s"
        return None
    try:
        job, _ = services.job_submit(user=request.user, team=submission.team, data=submission.data,
                                     idempotency_key=forms.idempotency_key(nonce, submission))
    except services.SubmitRejected as error:
        submission.errors[error.field] = error.message
        return None
    except services.IdempotencyConflict:
        submission.errors["non_field_errors"] = "this page already submitted a different job: reload it"
        return None
    return job


def _submitted(request, job: Job):
    messages.success(request, f"Submitted {job.name}: {job.state.lower()}.")
    return reverse("dashboard:job-detail", args=[job.pk])


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request):
    kind = _kind(request)
    teams = list(visible_teams(request))
    default_team = _default_team(request, teams)
    nonce = request.POST.get("nonce") if request.method == "POST" else None
    if not nonce or not forms.NONCE.match(nonce):
        nonce = uuid.uuid4().hex
    post, errors, code_error = None, {}, ""
    if request.method == "POST":
        post = request.POST.copy()
        try:
            if digest := _upload_code(request):
                post["code"] = digest  # the re-rendered form keeps it: the archive need not be chosen again
        except ValueError as error:
            code_error = str(error)
        document, form_errors = forms.document_from_post(kind, post)
        submission = forms.validate_submission(request, document, form_errors)
        if not code_error and submission.valid and (job := _submit(request, submission, nonce)) is not None:
            return redirect(_submitted(request, job))
        errors = submission.errors
    else:
        initial = forms.build_form(kind, teams, default_team)
        document, form_errors = forms.document_from_post(kind, _initial_post(initial))
        submission = forms.validate_submission(request, document, form_errors)
    form = forms.build_form(kind, teams, default_team, post=post, errors=errors)
    snippets = _snippets(request, submission)
    kind_spec = registry.get_kind(kind)
    return render(request, "dashboard/jobs_new.html", page_context(
        request, "submit", kind=kind, kind_description=kind_spec.description,
        kinds=[(name, spec.description) for name, spec in registry.kinds().items()],
        # The editor starts on the same job as the form (normalized when valid, as typed when not).
        form=form, nonce=nonce, snippets=snippets, editor_text=snippets["yaml"],
        validate_url=reverse("dashboard:job-validate"), code_error=code_error,
        code_limit=settings.STRATA_MAX_CODE_BYTES,
    ))


def _upload_code(request) -> str | None:
    """The digest of the project archive posted with the form (stored as a bundle of the chosen team), or None
    when none was chosen. Raises ValueError naming the problem (the same checks as ``POST /api/v1/code/``)."""
    from strata.jobs.code import CodeRejected, code_store
    from strata.jobs.selectors import SubmitTeamError, submit_team
    from strata.quotas.services import StorageQuotaExceeded

    upload = request.FILES.get("code_archive")
    if upload is None:
        return None
    try:
        team = submit_team(request, request.POST.get("team") or None)
    except SubmitTeamError as error:
        raise ValueError(f"choose the team the code belongs to: {error}") from None
    from strata.accounts import roles

    if not roles.has_role(request, team, roles.MEMBER):
        raise ValueError(f"you are a {roles.role_in(request, team)} in team {team.slug}: uploading code needs the "
                         "member role")
    try:
        bundle, _created = code_store(team=team, user=request.user, source=upload)
    except (CodeRejected, StorageQuotaExceeded) as error:
        raise ValueError(str(error)) from None
    return bundle.digest


def _initial_post(form: dict[str, Any]) -> dict[str, str]:
    """The form's initial values as a POST would carry them (for the first snippets and editor text)."""
    values = {}
    for entry in [*form["common"], *form["spec"]]:
        if entry.control == "checkbox":
            if entry.checked:
                values[entry.name] = "on"
        elif entry.value:
            values[entry.name] = entry.value
    return values


@live_login_required
@require_POST
def job_validate(request):
    """Validate a job document (JSON ``{"document": "<yaml or json>", "submit": bool, "nonce": "..."}``) or the
    submit form's fields (form-encoded) without creating anything, or submit it with ``"submit": true``.

    Always 200 with ``{"valid", "errors", "normalized", "yaml", "cli", "curl"}`` for a document that was read;
    201 with ``{"valid": true, "job_id", "redirect"}`` when it was submitted.
    """
    if request.content_type == "application/json":
        try:
            payload = json.loads(request.body or b"{}")
        except (ValueError, RecursionError):
            return json_reply({"valid": False, "errors": {"document": "the request is not JSON"}}, status=400)
        if not isinstance(payload, dict):
            return json_reply({"valid": False, "errors": {"document": "expected a JSON object"}}, status=400)
        if problems := value_problems(payload):
            return json_reply({"valid": False, "errors": problems}, status=400)
        try:
            document = forms.parse_document(payload.get("document"))
        except forms.DocumentError as error:
            return json_reply({"valid": False, "errors": {"document": str(error)},
                               "location": {"line": error.line, "column": error.column},
                               "normalized": None, "yaml": None, "cli": None, "curl": None})
        submission = forms.validate_submission(request, document)
        want_submit, nonce = payload.get("submit") is True, payload.get("nonce")
    else:
        kind = _kind(request)
        document, form_errors = forms.document_from_post(kind, request.POST)
        submission = forms.validate_submission(request, document, form_errors)
        want_submit, nonce = False, None
    if want_submit and submission.valid:
        job = _submit(request, submission, nonce if isinstance(nonce, str) else None)
        if job is not None:
            return json_reply({"valid": True, "job_id": str(job.pk), "redirect": _submitted(request, job)},
                              status=201)
    snippets = _snippets(request, submission)
    return json_reply({
        "valid": submission.valid,
        "errors": submission.errors,
        "normalized": job_figures.scrub(submission.normalized()),
        "yaml": snippets["yaml"], "cli": snippets["cli"], "curl": snippets["curl"],
    })


# --- detail --------------------------------------------------------------------------------------------------

def _job(request, job_id) -> Job:
    return get_object_or_404(jobs_with_attempts(jobs_visible(visible_team_ids(request))), pk=job_id)


def gpu_text(resources: dict) -> str:
    """The GPUs column: GPUs per worker (× workers); a job that holds no GPU shows its CPUs instead."""
    gpus = float(resources.get("gpus") or 0)
    workers = int(resources.get("workers") or 1)
    text = f"{gpus:g}"
    if gpus <= 0 and not resources.get("gpu_memory") and resources.get("cpus"):
        text = f"{float(resources['cpus']):g} CPU"
    if workers > 1:
        text += f" × {workers}"
    return text


def resources_text(resources: dict) -> str:
    gpus = float(resources.get("gpus") or 0)
    parts = [f"{gpus:g} GPU" + ("s" if gpus > 1 else "")]
    if gpus <= 0 and not resources.get("gpu_memory") and resources.get("cpus"):
        parts = []  # a job that holds no GPU: its CPUs say it all
    if resources.get("gpu_memory"):
        parts.append(f"{forms.format_bytes(int(resources['gpu_memory']))} GPU memory")
    if resources.get("cpus"):
        parts.append(f"{float(resources['cpus']):g} CPU" + ("s" if float(resources["cpus"]) > 1 else ""))
    if resources.get("memory"):
        parts.append(f"{forms.format_bytes(int(resources['memory']))} memory")
    text = ", ".join(parts) + " per worker"
    workers = int(resources.get("workers") or 1)
    text += f" × {workers} workers" if workers > 1 else ""
    if resources.get("node_labels"):
        text += "; on nodes " + ", ".join(f"{k}={v}" for k, v in resources["node_labels"].items())
    return text


def _duration(job: Job) -> str:
    if not job.started_at:
        return ""
    seconds = int(((job.finished_at or timezone.now()) - job.started_at).total_seconds())
    hours, rest = divmod(max(seconds, 0), 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"


def _attempt_rows(job: Job) -> list[dict[str, Any]]:
    rows = []
    for attempt in job.attempts.all():
        devices = []
        for allocation in sorted(attempt.allocations.all(), key=lambda a: (a.rank, a.device_id)):
            device = allocation.device
            where = (f"{device.node.name}:cpu ({allocation.share:g} CPU)" if device.cpu
                     else f"{device.node.name}:gpu{device.index} ({allocation.share:g}, {device.kind})")
            devices.append({
                "text": where,
                "kind": device.kind, "rank": allocation.rank,
                "memory": forms.format_bytes(allocation.memory) if allocation.memory else "",
            })
        rows.append({"attempt": attempt, "devices": devices})
    return rows


def _artifacts(job: Job) -> list[dict[str, Any]]:
    return [{"artifact": artifact,
             "url": reverse("job-download", kwargs={"pk": job.pk, "artifact_id": artifact.pk})}
            for artifact in job.artifacts.filter(kind=Artifact.Kind.ARTIFACT).order_by("name")]


def _log_text(line) -> str:
    time, level, message = line
    prefix = "" if level in ("", "info") else f"[{level}] "
    return f"{timezone.localtime(time):%H:%M:%S}  {prefix}{message}"


def _event(event_id, time, kind, message) -> dict[str, Any]:
    return {"id": event_id, "time": time.isoformat(), "clock": f"{timezone.localtime(time):%H:%M:%S}",
            "kind": kind, "message": message}


def _panels(job: Job, team_ids) -> list[dict[str, Any]]:
    job_data = job_figures.scrub(json.loads(json.dumps(JobSerializer(job).data, default=str)))
    rendered = render_panels("job", DatabasePanelData(team_ids, job, job_data), kind=job.kind)
    panels = []
    for index, panel in enumerate(rendered):
        panel = job_figures.scrub(panel)
        panel["dom_id"] = f"panel-{index}"
        if "figure" in panel:
            panel["figure_json"] = figure_json(panel["figure"])
        panels.append(panel)
    return panels


def _source_job(job: Job) -> Job | None:
    """The first job this one reads from, per its kind's ``KindSpec.sources()`` (same team: submit checked it)."""
    refs = registry.get_kind(job.kind).sources(job.spec) if job.kind in registry.kinds() else []
    return Job.objects.filter(pk=refs[0].job, team_id=job.team_id).only("name").first() if refs else None


CHILDREN_SHOWN = 100


def _tree(job: Job) -> dict[str, Any]:
    """The job's place in its tree: its parent (same team) and its first child jobs, oldest first."""
    children = list(job.children.order_by("created_at", "id").only("id", "name", "state")[:CHILDREN_SHOWN + 1])
    parent = Job.objects.filter(pk=job.parent_id).only("id", "name").first() if job.parent_id else None
    return {"parent_job": parent, "child_jobs": children[:CHILDREN_SHOWN],
            "more_children": len(children) > CHILDREN_SHOWN}


def _expected_start(job: Job) -> str:
    """A waiting job's start-time estimate in words (strata.scheduling.eta; as ``strata submit --wait`` says it)."""
    from strata.cli.eta_text import sentence

    if job.state not in {JobState.PENDING, JobState.QUEUED} or not job.eta:
        return ""
    return sentence(job.eta)


def _fragments(request, job: Job) -> dict[str, str]:
    context = {"job": job, "attempts": _attempt_rows(job), "artifacts": _artifacts(job),
               "checkpoint": job.artifacts.filter(kind=Artifact.Kind.CHECKPOINT).order_by("-created_at").first(),
               "resources": resources_text(job.resources), "duration": _duration(job),
               "time_limit": forms.format_duration(job.time_limit), "endpoint": serving_endpoint(job),
               "source_job": _source_job(job), "expected_start": _expected_start(job), **_tree(job)}
    return {
        "attempts_html": render_to_string("dashboard/jobs_attempts.html", context, request),
        "artifacts_html": render_to_string("dashboard/jobs_artifacts.html", context, request),
        "facts_html": render_to_string("dashboard/jobs_facts.html", context, request),
    }


@login_required
@require_GET
def job_detail(request, job_id):
    team_ids = visible_team_ids(request)
    job = _job(request, job_id)
    metrics_cursor = job_figures.latest_metric_id(job)
    series, metric_values = job_figures.split_series(job_figures.metric_series(job, up_to_id=metrics_cursor))
    charts = [{"chart": chart, "title": job_figures.CHARTS[chart]["title"], "json": figure_json(figure)}
              for chart, figure in job_figures.metric_figures(series).items()]
    for value in metric_values:  # its points, for the page script to draw a line once a second step comes
        value["points_json"] = json.dumps({"x": value.pop("x"), "y": value.pop("y")})
    log_rows = list(job.log_lines.order_by("-id").values_list("id", "time", "level", "message")[:INITIAL_LOG_LINES])
    log_rows.reverse()
    log_total = job.log_lines.count() if len(log_rows) == INITIAL_LOG_LINES else len(log_rows)
    event_rows = list(job.events.order_by("-id").values_list("id", "time", "kind", "message")[:INITIAL_EVENTS])
    event_rows.reverse()
    cursors = {"events": event_rows[-1][0] if event_rows else 0, "logs": log_rows[-1][0] if log_rows else 0,
               "metrics": metrics_cursor}
    live = {"url": reverse("dashboard:job-live", args=[job.pk]), "terminal": job.terminal, "cursors": cursors,
            "charts": job_figures.chart_config(), "interval_ms": 1500}
    return render(request, "dashboard/jobs_detail.html", page_context(
        request, "jobs", job=job, charts=charts, metric_values=metric_values,
        has_children=job.children.exists(),
        logs="\n".join(_log_text(row[1:]) for row in log_rows), log_count=len(log_rows), log_total=log_total,
        logs_trimmed=log_search.trimmed_notice(job),
        events=[_event(*row) for row in event_rows],
        spec_yaml=yaml.safe_dump(job.spec, sort_keys=False, default_flow_style=False, allow_unicode=True),
        panels=_panels(job, team_ids),
        live_json=figure_json(live),
        **_fragments(request, job),
    ))


def _cursor(request, name: str) -> int:
    try:
        return max(0, int(request.GET.get(name) or 0))
    except ValueError:
        raise ValueError(name) from None


@live_login_required
@require_GET
def job_live(request, job_id):
    """What changed since the page's cursors: state, new events, log lines and metric points, and the
    attempts/artifacts/facts fragments; with ``panels=1`` the component panels too."""
    team_ids = visible_team_ids(request)
    job = _job(request, job_id)
    try:
        events_after = _cursor(request, "events_after")
        logs_after = _cursor(request, "logs_after")
        metrics_after = _cursor(request, "metrics_after")
    except ValueError as error:
        return json_reply({"detail": f"{error} must be a non-negative integer id"}, status=400)
    event_rows = list(job.events.filter(id__gt=events_after).order_by("id")
                      .values_list("id", "time", "kind", "message")[:LIVE_EVENTS])
    log_rows = list(job.log_lines.filter(id__gt=logs_after).order_by("id")
                    .values_list("id", "time", "level", "message")[:LIVE_LOG_LINES])
    metrics, metrics_cursor = job_figures.new_metrics(job, metrics_after, LIVE_METRIC_POINTS)
    reply = {
        "state": job.state,
        "reason": job.reason,
        "terminal": job.terminal,
        "failures": job.failures,
        "events": [_event(*row) for row in event_rows],
        "logs": [{"id": row[0], "text": _log_text(row[1:])} for row in log_rows],
        "metrics": metrics,
        "cursors": {"events": event_rows[-1][0] if event_rows else events_after,
                    "logs": log_rows[-1][0] if log_rows else logs_after,
                    "metrics": metrics_cursor},
        # More is waiting than one reply carries: the page asks again at once.
        "more": len(event_rows) == LIVE_EVENTS or len(log_rows) == LIVE_LOG_LINES
                or sum(len(series["x"]) for series in metrics.values()) == LIVE_METRIC_POINTS,
        **_fragments(request, job),
    }
    # Panels re-render every few polls, and at once when the state the page shows is out of date (a job that
    # just finished has its final numbers).
    seen_state = request.GET.get("state")
    if request.GET.get("panels") == "1" or (seen_state and seen_state != job.state):
        reply["panels"] = [{key: value for key, value in panel.items() if key != "figure_json"}
                           for panel in _panels(job, team_ids)]
    return json_reply(reply)


def _managed(request, job_id, action: str):
    """The job (another team's: a 404) if the viewer may change it: its owner (member) or a team-admin; else a
    403 naming the role needed (strata.accounts.roles)."""
    from django.core.exceptions import PermissionDenied

    from strata.accounts import roles

    job = _job(request, job_id)
    try:
        roles.require_manage(request, job.team, job.owner_id, action)
    except roles.RoleRequired as error:
        raise PermissionDenied(str(error.detail)) from None
    return job


@login_required
@require_POST
def job_cancel(request, job_id):
    job = _managed(request, job_id, "cancel it")
    if job.terminal:
        messages.info(request, f"{job.name} already finished ({job.state.lower()}).")
    else:
        job = services.job_cancel(job, reason=f"cancelled by {request.user.username}", request=request)
        messages.success(request, f"Cancelled {job.name}.")
    return redirect("dashboard:job-detail", job.pk)


@login_required
@require_POST
def job_resubmit(request, job_id):
    job = _managed(request, job_id, "resubmit it")
    try:
        new_job = services.job_resubmit(job, user=request.user, request=request)
    except services.SubmitRejected as error:
        messages.error(request, f"Not resubmitted: {error.message}")
        return redirect("dashboard:job-detail", job.pk)
    messages.success(request, f"Resubmitted {job.name} as a new job: {new_job.state.lower()}.")
    return redirect("dashboard:job-detail", new_job.pk)


urlpatterns = [
    path("jobs/", job_list, name="jobs"),
    path("jobs/rows/", job_rows, name="job-rows"),
    path("jobs/new/", job_new, name="job-new"),
    path("jobs/new/validate/", job_validate, name="job-validate"),
    path("jobs/<uuid:job_id>/", job_detail, name="job-detail"),
    path("jobs/<uuid:job_id>/live/", job_live, name="job-live"),
    path("jobs/<uuid:job_id>/cancel/", job_cancel, name="job-cancel"),
    path("jobs/<uuid:job_id>/resubmit/", job_resubmit, name="job-resubmit"),
]
