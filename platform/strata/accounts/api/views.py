from __future__ import annotations

from django.db.models import Q
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from strata.accounts import roles, services, team_secrets
from strata.accounts.api.serializers import (
    SecretSerializer,
    SecretSetSerializer,
    TeamSerializer,
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenSerializer,
)
from strata.accounts.models import ApiToken, Secret, Team
from strata.accounts.selectors import (
    TeamChoiceError,
    member_team,
    member_team_ids,
    request_token,
    visible_team_ids,
)
from strata.api.permissions import IsUser


class TeamViewSet(viewsets.ReadOnlyModelViewSet):
    permission_classes = [IsUser]
    serializer_class = TeamSerializer
    lookup_field = "slug"

    def get_queryset(self):
        return Team.objects.filter(id__in=visible_team_ids(self.request))


@extend_schema_view(destroy=extend_schema(parameters=[OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH)]))
class TokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The caller's own API tokens. The raw token is returned once, at creation.

    A request with a bearer token sees and manages only its user's tokens of that token's team, and can create
    only user tokens of that team that expire no later than itself (revoked with it). Node tokens are listed,
    created and revoked only by cluster admins from a browser session. Every role may hold tokens (a token does
    no more than its user's role allows); a team-admin also lists and revokes the user tokens of their team's
    members (a token: of its own team), a cluster admin those of every team.
    """

    permission_classes = [IsUser]
    serializer_class = TokenSerializer

    def get_queryset(self):
        tokens = ApiToken.objects.select_related("team").order_by("-created_at", "id")
        current = request_token(self.request)
        # The user tokens of the teams where the caller is a team-admin (a cluster admin: every team it sees).
        managed = Q(kind=ApiToken.Kind.USER, team_id__in=roles.team_ids_with(self.request, roles.TEAM_ADMIN))
        if current is not None:
            return tokens.filter(Q(user=self.request.user, kind=ApiToken.Kind.USER, team_id=current.team_id)
                                 | managed)
        if self.request.user.is_staff:
            return tokens.filter(Q(user=self.request.user) | Q(kind=ApiToken.Kind.NODE) | managed)
        return tokens.filter(Q(user=self.request.user, kind=ApiToken.Kind.USER) | managed)

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenCreatedSerializer})
    def create(self, request, *args, **kwargs):
        serializer = TokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        current = request_token(request)
        team = None
        if data["kind"] == ApiToken.Kind.USER:
            slug = data.get("team")
            if slug is None and current is not None:
                team = current.team
            else:
                team = Team.objects.filter(slug=slug, id__in=visible_team_ids(request)).first() if slug else None
            if team is None:
                raise serializers.ValidationError({"team": ["a team you belong to is required"]})
        try:
            token, raw = services.token_create(request.user, team=team, kind=data["kind"], name=data["name"],
                                               ttl_days=data.get("ttl_days"), parent=current, request=request)
        except services.TokenRefused as error:
            raise serializers.ValidationError({error.field: [error.message]}) from None
        return Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.token_revoke(instance, request=self.request)


SECRET_TEAM = OpenApiParameter("team", str, description="The team (slug); default: the token's team or your only "
                                                       "team.")


@extend_schema_view(list=extend_schema(parameters=[SECRET_TEAM]), retrieve=extend_schema(parameters=[SECRET_TEAM]),
                    destroy=extend_schema(parameters=[SECRET_TEAM]))
class SecretViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                    viewsets.GenericViewSet):
    """The team's secrets: names, who set them and when; never a value. A job gets the values it names in
    ``spec.environment.secrets`` as environment variables.

    Scoped like tokens: a user token manages its own team's secrets only, a browser session those of the user's
    teams (a cluster admin's session too: no other team's); another team's secret is a 404. Every role of the
    team lists the names; setting and deleting one needs the team-admin role (a JSON 403 otherwise)."""

    permission_classes = [IsUser]
    serializer_class = SecretSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]{1,200}"

    def get_queryset(self):
        queryset = Secret.objects.filter(team_id__in=member_team_ids(self.request)).select_related(
            "team", "created_by", "updated_by").order_by("team__slug", "name")
        if team := self.request.query_params.get("team"):
            queryset = queryset.filter(team__slug=team)
        return queryset

    def get_object(self):
        found = list(self.get_queryset().filter(name=self.kwargs["name"])[:2])
        if len(found) != 1:
            raise Http404("no such secret" if not found else "several of your teams have a secret of this name: "
                                                              "add ?team=slug")
        return found[0]

    @extend_schema(request=SecretSetSerializer,
                   responses={201: OpenApiResponse(SecretSerializer, description="A new secret."),
                              200: OpenApiResponse(SecretSerializer, description="The secret's value was replaced.")})
    def create(self, request, *args, **kwargs):
        """Create or replace a secret: ``{name, value, team?}``. The answer never carries the value."""
        serializer = SecretSetSerializer(data=request.data)
        errors = {} if serializer.is_valid() else dict(serializer.errors)
        body = request.data if isinstance(request.data, dict) else {}
        slug = body.get("team") or request.query_params.get("team") or None
        team = None
        try:
            team = member_team(request, slug if isinstance(slug, str) else None)
        except TeamChoiceError as error:
            errors["team"] = [str(error)]
        else:
            roles.require(request, team, roles.TEAM_ADMIN, "set its secrets")
        if not errors:
            try:
                secret, created = team_secrets.secret_set(team, serializer.validated_data["name"],
                                                          serializer.validated_data["value"], user=request.user,
                                                          request=request)
            except team_secrets.SecretRejected as error:
                errors = {field: [message] for field, message in error.errors.items()}
        if errors:
            raise serializers.ValidationError(errors)
        return Response(SecretSerializer(secret).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def perform_destroy(self, instance):
        roles.require(self.request, instance.team, roles.TEAM_ADMIN, "delete its secrets")
        team_secrets.secret_delete(instance, request=self.request)
