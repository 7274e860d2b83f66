from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from strata.accounts.selectors import visible_team_ids
from strata.api.permissions import IsClusterAdmin, IsUser
from strata.quotas.api.serializers import QuotaSerializer, QuotaUsageSerializer
from strata.quotas.models import Quota
from strata.quotas.services import quota_update, team_usage


class QuotaViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Quotas of the caller's teams; only cluster admins may change them."""

    serializer_class = QuotaSerializer
    lookup_field = "team__slug"
    lookup_url_kwarg = "team"

    def get_permissions(self):
        return [IsClusterAdmin()] if self.action in {"update", "partial_update"} else [IsUser()]

    def get_queryset(self):
        return Quota.objects.filter(team_id__in=visible_team_ids(self.request)).select_related("team").order_by("team__slug")

    def perform_update(self, serializer):
        # The shared service: validates, saves, admits the PENDING jobs a raised limit allows, requests a pass.
        change = quota_update(serializer.instance.team_id, serializer.validated_data, request=self.request)
        serializer.instance = change.quota

    @extend_schema(responses=QuotaUsageSerializer)
    @action(detail=True, methods=["get"])
    def usage(self, request, team=None):
        quota = self.get_object()
        return Response({"team": quota.team.slug, "quota": QuotaSerializer(quota).data, "usage": team_usage(quota.team_id)})
