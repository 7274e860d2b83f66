"""``/api/v1/tracking/``: a team's MLflow tracking server, for its team-admins (GET, PUT, DELETE).

The team is ``?team=slug`` (or ``team`` in a PUT's body); without one, the token's team or the caller's only team.
A team the caller cannot see is a 404, a lower role than team-admin a 403. The token is write-only: answers say
``token_set`` only. Every change is recorded in the audit log as ``tracking.change`` (never the token).
"""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.accounts import roles
from strata.accounts.models import Team
from strata.accounts.selectors import TeamChoiceError, member_team, visible_team_ids
from strata.api.error_answers import error_response
from strata.api.permissions import IsUser
from strata.tracking import services
from strata.tracking.models import TrackingServer

TEAM = OpenApiParameter("team", str, description="The team (slug); default: the token's team or your only team.")
FIELDS = {"url", "experiment", "token", "team"}
NO_TEAM = error_response(404, "No such team (or another team's).")

TrackingAnswer = inline_serializer("TrackingServer", {
    "team": serializers.CharField(), "configured": serializers.BooleanField(),
    "url": serializers.CharField(required=False), "experiment": serializers.CharField(required=False),
    "experiment_id": serializers.CharField(required=False, allow_null=True),
    "token_set": serializers.BooleanField(required=False),
    "configured_at": serializers.DateTimeField(required=False),
    "updated_by": serializers.CharField(required=False, allow_null=True),
    "synced_at": serializers.DateTimeField(required=False, allow_null=True),
    "error": serializers.CharField(required=False, allow_null=True),
    "error_at": serializers.DateTimeField(required=False, allow_null=True),
    "failures": serializers.IntegerField(required=False),
    "retry_at": serializers.DateTimeField(required=False, allow_null=True),
    "runs": serializers.IntegerField(required=False), "runs_active": serializers.IntegerField(required=False),
})
TrackingSet = inline_serializer("TrackingServerSet", {
    "url": serializers.CharField(help_text="The tracking server's base URL (http or https)."),
    "experiment": serializers.CharField(required=False, help_text="The experiment's name; default strata-<team>."),
    "token": serializers.CharField(required=False, allow_blank=True,
                                   help_text="A bearer token for the server; empty removes it; absent keeps it."),
    "team": serializers.CharField(required=False),
})


def answer(team: Team, server: TrackingServer | None) -> dict:
    described = services.describe(server)
    return {"team": team.slug, "configured": False} if described is None else {**described, "configured": True}


def audit_state(server: TrackingServer | None) -> dict | None:
    if server is None:
        return None
    return {"url": server.url, "experiment": server.experiment, "token_set": bool(server.token_ciphertext)}


def audit(request, team: Team, before, after) -> None:
    try:
        from strata.audit.services import record
    except ImportError:  # the audit app is optional to this one
        return
    record("tracking.change", request=request, team=team, target=f"tracking {team.slug}", before=before, after=after)


class TrackingView(APIView):
    """A team's MLflow tracking server: where its jobs' params, metrics, artifacts and cost are mirrored."""

    permission_classes = [IsUser]

    def team(self, request, slug) -> Team:
        if slug is not None and not isinstance(slug, str):
            raise serializers.ValidationError({"team": ["must be a team's slug"]})
        if slug:
            team = Team.objects.filter(slug=slug, id__in=visible_team_ids(request)).first()
            if team is None:
                raise Http404("no such team")
        else:
            try:
                team = member_team(request, None)
            except TeamChoiceError as error:
                raise serializers.ValidationError({"team": [str(error)]}) from None
        roles.require(request, team, roles.TEAM_ADMIN, action="configure the team's MLflow tracking server")
        return team

    @extend_schema(parameters=[TEAM], responses={200: TrackingAnswer, 404: NO_TEAM})
    def get(self, request):
        team = self.team(request, request.query_params.get("team"))
        return Response(answer(team, TrackingServer.objects.filter(team=team).select_related("team", "updated_by")
                                     .first()))

    @extend_schema(parameters=[TEAM], request=TrackingSet,
                   responses={201: OpenApiResponse(TrackingAnswer, description="The team's new tracking server."),
                              200: OpenApiResponse(TrackingAnswer, description="The server was replaced."),
                              404: NO_TEAM})
    def put(self, request):
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
        errors = {field: ["unknown field"] for field in sorted(set(body) - FIELDS)}
        slug = body.get("team") or request.query_params.get("team") or None
        try:
            team = self.team(request, slug)
        except serializers.ValidationError as error:
            raise serializers.ValidationError({**errors, **error.detail}) from None
        errors.update({field: [message] for field, message in services.problems(
            url=body.get("url"), experiment=body.get("experiment"), token=body.get("token")).items()})
        if errors:
            raise serializers.ValidationError(errors)
        before = audit_state(TrackingServer.objects.filter(team=team).first())
        server, created = services.server_set(team, url=body["url"], experiment=body.get("experiment"),
                                              token=body.get("token"), user=request.user)
        audit(request, team, before, audit_state(server))
        return Response(answer(team, server), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[TEAM], responses={204: None,
                                                 404: error_response(404, "No such team, or it has no tracking "
                                                                          "server.")})
    def delete(self, request):
        team = self.team(request, request.query_params.get("team"))
        before = audit_state(TrackingServer.objects.filter(team=team).first())
        if not services.server_clear(team):
            raise Http404(f"team {team.slug} has no tracking server")
        audit(request, team, before, None)
        return Response(status=status.HTTP_204_NO_CONTENT)
