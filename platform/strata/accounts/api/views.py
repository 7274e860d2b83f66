from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from strata.accounts import services
from strata.accounts.api.serializers import TeamSerializer, TokenCreateSerializer, TokenSerializer
from strata.accounts.models import ApiToken, Team
from strata.accounts.selectors import request_token, visible_team_ids
from strata.api.permissions import IsUser


class TeamViewSet(viewsets.ReadOnlyModelViewSet):
    permission_classes = [IsUser]
    serializer_class = TeamSerializer
    lookup_field = "slug"

    def get_queryset(self):
        return Team.objects.filter(id__in=visible_team_ids(self.request))


class TokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The caller's own API tokens. The raw token is returned once, at creation."""

    permission_classes = [IsUser]
    serializer_class = TokenSerializer

    def get_queryset(self):
        return ApiToken.objects.filter(user=self.request.user).select_related("team").order_by("-created_at", "id")

    @extend_schema(request=TokenCreateSerializer, responses={201: dict})
    def create(self, request, *args, **kwargs):
        serializer = TokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        team = None
        if data["kind"] == ApiToken.Kind.USER:
            slug = data.get("team")
            current = request_token(request)
            if slug is None and current is not None:
                team = current.team
            else:
                team = Team.objects.filter(slug=slug, id__in=visible_team_ids(request)).first() if slug else None
            if team is None:
                raise serializers.ValidationError({"team": ["a team you belong to is required"]})
        try:
            token, raw = services.token_create(request.user, team=team, kind=data["kind"], name=data["name"],
                                               ttl_days=data.get("ttl_days"))
        except PermissionError as error:
            raise serializers.ValidationError({"kind": [str(error)]}) from None
        return Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.token_revoke(instance)
