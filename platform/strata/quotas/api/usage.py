"""``GET /api/v1/usage/`` (every team the caller sees: allocated against used GPU-hours of its current budget
period) and ``GET /api/v1/usage/<team>/`` (one team: totals, its idlest jobs, its budget and the forecast;
``?format=csv``: every job of the period as CSV). Reads: any role of the team; another team is a 404. Computed by
``strata.quotas.usage``."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

from django.http import HttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.accounts import roles
from strata.accounts.models import Team
from strata.accounts.selectors import visible_team_ids
from strata.api.error_answers import error_response
from strata.api.permissions import IsUser
from strata.quotas.usage import RATE_HOURS, TOP_IDLE, billing_csv, team_billing

MAX_LIMIT = 1000
AGO = re.compile(r"^(\d+(?:\.\d+)?)([mhd])$")
UNITS = {"m": 60, "h": 3600, "d": 86400}
PARAMETERS = [
    OpenApiParameter("since", str, description="Start: ISO 8601, or a time ago such as 24h, 7d, 90m (default: "
                                               "the start of the team's budget period)."),
    OpenApiParameter("until", str, description="End: ISO 8601 or a time ago (default: now)."),
    OpenApiParameter("limit", int, description=f"How many jobs, idlest first (default {TOP_IDLE}, at most "
                                               f"{MAX_LIMIT}; the CSV has every job)."),
    OpenApiParameter("rate_hours", float, description=f"The forecast's rate is measured over the last this many "
                                                      f"hours (default {RATE_HOURS:g})."),
    OpenApiParameter("format", str, description="csv: every job of the range as CSV."),
]


def _moment(value: str, now):
    match = AGO.match(value.strip())
    if match:
        try:
            return now - timedelta(seconds=float(match.group(1)) * UNITS[match.group(2)])
        except OverflowError:
            raise ValueError("a time ago within the calendar, such as 24h or 7d") from None
    try:
        parsed = parse_datetime(value.strip())
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError("an ISO 8601 time, or a time ago such as 24h or 7d")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def usage_params(query, now) -> dict:
    """since, until, limit and rate_hours from the query; a ValidationError (400) names every bad one."""
    errors, params = {}, {"since": None, "until": None, "limit": TOP_IDLE, "rate_hours": RATE_HOURS}
    for name in ("since", "until"):
        if query.get(name):
            try:
                params[name] = _moment(query[name], now)
            except ValueError as error:
                errors[name] = [str(error)]
    for name, kind, low, high in (("limit", int, 0, MAX_LIMIT), ("rate_hours", float, 0.1, 24 * 366)):
        if query.get(name) not in (None, ""):
            try:
                value = kind(query[name])
                if not low <= value <= high:
                    raise ValueError
                params[name] = value
            except ValueError:
                errors[name] = [f"a number from {low} to {high}"]
    if params["since"] and params["until"] and params["since"] >= params["until"] and "since" not in errors:
        errors["since"] = ["must be before until"]
    if errors:
        raise serializers.ValidationError(errors)
    return params


class TeamUsageView(APIView):
    """One team's allocated against used GPU-hours, its idlest jobs, and its budget with the forecast."""

    permission_classes = [IsUser]

    def perform_content_negotiation(self, request, force=False):
        if request.query_params.get("format") == "csv":
            return JSONRenderer(), JSONRenderer.media_type  # errors as JSON; the CSV is written by get()
        return super().perform_content_negotiation(request, force)

    @extend_schema(operation_id="usage_team", parameters=PARAMETERS,
                   responses={200: OpenApiTypes.OBJECT, 400: error_response(400),
                              404: error_response(404, "A team that does not exist or that the caller cannot see.")})
    def get(self, request, team):
        found = Team.objects.filter(slug=team).first()
        roles.require(request, found, roles.VIEWER, action="read its usage")
        now = timezone.now()
        params = usage_params(request.query_params, now)
        csv = request.query_params.get("format") == "csv"
        billing = team_billing(found, params["since"], params["until"], rate_hours=params["rate_hours"],
                               top=None if csv else params["limit"], now=now)
        if csv:
            response = HttpResponse(billing_csv(billing), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = f'attachment; filename="usage-{found.slug}-{now:%Y%m%d}.csv"'
            return response
        return Response(billing)


class UsageListView(APIView):
    """Every team the caller sees: allocated against used GPU-hours (no jobs), and its budget."""

    permission_classes = [IsUser]

    @extend_schema(operation_id="usage_list", parameters=PARAMETERS[:2],
                   responses={200: OpenApiTypes.OBJECT, 400: error_response(400)})
    def get(self, request):
        now = timezone.now()
        params = usage_params(request.query_params, now)
        teams = Team.objects.filter(pk__in=visible_team_ids(request)).order_by("slug")
        return Response({"results": [team_billing(team, params["since"], params["until"], top=0, now=now)
                                     for team in teams]})
