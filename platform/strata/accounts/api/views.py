from __future__ import annotations

from django.db.models import Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from strata.accounts import services
from strata.accounts.api.serializers import (
    TeamSerializer,
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenSerializer,
)
from strata.accounts.models import ApiToken, Team
from strata.accounts.selectors import request_token, visible_team_ids
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
    created and revoked only by cluster admins from a browser session.
    """

    permission_classes = [IsUser]
    serializer_class = TokenSerializer

    def get_queryset(self):
        tokens = ApiToken.objects.select_related("team").order_by("-created_at", "id")
        current = request_token(self.request)
        if current is not None:
            return tokens.filter(user=self.request.user, kind=ApiToken.Kind.USER, team_id=current.team_id)
        if self.request.user.is_staff:
            return tokens.filter(Q(user=self.request.user) | Q(kind=ApiToken.Kind.NODE))
        return tokens.filter(user=self.request.user, kind=ApiToken.Kind.USER)

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
                                               ttl_days=data.get("ttl_days"), parent=current)
        except services.TokenRefused as error:
            raise serializers.ValidationError({error.field: [error.message]}) from None
        return Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.token_revoke(instance)
