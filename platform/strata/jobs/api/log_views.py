"""Log search over the API (``strata.jobs.log_search``): the filters of ``GET /api/v1/jobs/<id>/logs/`` and
``GET /api/v1/logs/search/``, across the jobs of the caller's teams. Reads: any role of a team may search its
jobs' logs; another team's lines never appear (its job is a 404 on the job's route). A malformed parameter is a
400 naming every bad one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db.models import F
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.accounts.selectors import visible_team_ids
from strata.api.error_answers import error_response
from strata.api.pagination import StrataPagination
from strata.api.permissions import IsUser
from strata.jobs import log_search
from strata.jobs.models import Job, LogLine
from strata.jobs.selectors import JOB_FILTERS, JobFilterInvalid, jobs_filtered, jobs_visible

TRIMMED_HEADER = "Strata-Logs-Trimmed"

FILTERS = [
    OpenApiParameter("q", str, description="Words to find, ranked (web-search syntax: \"a phrase\", OR, -without)."),
    OpenApiParameter("grep", str, description="A regular expression matched anywhere in a line (PostgreSQL: POSIX "
                                              "advanced; SQLite: Python's re)."),
    OpenApiParameter("fixed", bool, description="grep is a literal substring, not a regular expression."),
    OpenApiParameter("icase", bool, description="grep ignores case."),
    OpenApiParameter("since", str, description="Lines at or after: an ISO 8601 time, or a duration before now "
                                               "(15m, 2h, 1d)."),
    OpenApiParameter("until", str, description="Lines at or before (as since)."),
    OpenApiParameter("rank", str, description="Only lines of these worker ranks (comma-separated)."),
]


class LogHitSerializer(serializers.Serializer):
    """One line found: where it matched (``highlights``: [start, end] character offsets in ``message``;
    ``snippet``: the line around its first match, each match between ``**``) and, with q, its ``score``."""

    id = serializers.IntegerField()
    job = serializers.UUIDField()
    job_name = serializers.CharField(required=False)
    attempt = serializers.UUIDField(allow_null=True)
    rank = serializers.IntegerField(allow_null=True)
    time = serializers.DateTimeField()
    level = serializers.CharField()
    message = serializers.CharField()
    highlights = serializers.ListField(child=serializers.ListField(child=serializers.IntegerField()))
    snippet = serializers.CharField()
    score = serializers.FloatField(required=False)


class LogSearchPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = LogHitSerializer(many=True)


def log_query(request) -> log_search.LogQuery:
    try:
        return log_search.query_from(request.query_params)
    except log_search.QueryInvalid as error:
        raise serializers.ValidationError({name: [message] for name, message in error.errors.items()}) from None


@contextmanager
def refusals(using: str, query: log_search.LogQuery) -> Iterator[None]:
    """Run a search; a pattern the database refuses, or a search too long, is a 400 naming q or grep."""
    try:
        with log_search.refusals(using, query):
            yield
    except log_search.QueryInvalid as error:
        raise serializers.ValidationError({name: [message] for name, message in error.errors.items()}) from None


def trimmed_headers(job: Job) -> dict[str, str]:
    notice = log_search.trimmed_notice(job)
    return {TRIMMED_HEADER: notice["notice"]} if notice else {}


def job_logs(request, job: Job, *, after: int, limit: int, plain) -> Response:
    """A job's lines after id ``after``, oldest first, at most ``limit``: as ``plain`` serializes them when no
    filter is given (the log stream), else narrowed by the filters, each with where it matched. When lines were
    not kept, the ``Strata-Logs-Trimmed`` header says so."""
    query = log_query(request)
    lines = job.log_lines.filter(id__gt=after)
    if not query.filtering:
        return Response(plain(lines.order_by("id")[:limit], many=True).data, headers=trimmed_headers(job))
    lines = log_search.filtered(lines, query).order_by("id")[:limit]
    with refusals(lines.db, query):
        found = list(lines)
    return Response([log_search.hit(line, query) for line in found], headers=trimmed_headers(job))


class LogSearchView(APIView):
    """Search the logs of the caller's teams' jobs: ``q`` (words, ranked by relevance) and/or ``grep`` (a
    pattern; newest first without q; with neither, every line), narrowed by time, rank and the job list's
    filters (team, state, kind, owner, parent) or one ``job``. Paginated (``page``, ``page_size``)."""

    permission_classes = [IsUser]

    @extend_schema(operation_id="logs_search",
                   parameters=[*FILTERS, OpenApiParameter("job", str, description="Only this job's lines (id)."),
                               *(OpenApiParameter(name, str, description=f"Only jobs matching the job list's "
                                                                         f"{name} filter.") for name in JOB_FILTERS),
                               OpenApiParameter("page", int), OpenApiParameter("page_size", int)],
                   responses={200: LogSearchPageSerializer, 400: error_response(400)})
    def get(self, request):
        query = log_query(request)
        errors = {}
        jobs = jobs_visible(visible_team_ids(request))
        try:
            jobs = jobs_filtered(jobs, {name: request.query_params.get(name) for name in JOB_FILTERS})
        except JobFilterInvalid as error:
            errors[error.field] = [error.message]
        if job_id := request.query_params.get("job", "").strip():
            try:
                jobs = jobs.filter(pk=serializers.UUIDField().to_internal_value(job_id))
            except serializers.ValidationError:
                errors["job"] = ["must be a job id"]
        if errors:
            raise serializers.ValidationError(errors)
        lines = LogLine.objects.filter(job__in=jobs.order_by().values("pk")).annotate(job_name=F("job__name"))
        lines = log_search.ranked(lines, query)
        paginator = StrataPagination()
        with refusals(lines.db, query):
            page = paginator.paginate_queryset(lines, request, view=self) or []
        return paginator.get_paginated_response([log_search.hit(line, query) for line in page])
