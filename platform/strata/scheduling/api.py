"""The scheduler's own API: how well its start-time estimates held (strata.scheduling.eta)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.api.permissions import IsClusterAdmin


class EtaCalibrationView(APIView):
    """Of the jobs that started after a first start-time estimate (in the last ``days``, 30 by default), the
    coverage of the 80 % interval and the median absolute error, over all, by kind and by queue length (cluster
    admins)."""

    permission_classes = [IsClusterAdmin]

    @extend_schema(parameters=[OpenApiParameter("days", float, description="How far back (default 30).")],
                   responses={200: {"type": "object"}})
    def get(self, request):
        from strata.scheduling.eta import calibration

        raw = request.query_params.get("days", "30")
        try:
            days = float(raw)
            if not 0 < days <= 3650:
                raise ValueError
        except ValueError:
            raise serializers.ValidationError({"days": ["a number of days in (0, 3650]"]}) from None
        return Response(calibration(since=timezone.now() - timedelta(days=days)))


class WhatIfView(APIView):
    """Replay the last ``days`` of submissions under proposed quotas and nodes beside the current settings
    (strata.scheduling.whatif; cluster admins). A malformed body gets a 400 naming every bad field."""

    permission_classes = [IsClusterAdmin]

    @extend_schema(request={"application/json": {"type": "object"}}, responses={200: {"type": "object"}})
    def post(self, request):
        from strata.scheduling.whatif import WhatIfInvalid, what_if

        try:
            return Response(what_if(request.data))
        except WhatIfInvalid as error:
            raise serializers.ValidationError({name: [text] for name, text in error.errors.items()}) from None
