"""``GET /api/v1/audit/`` (JSON, paginated; ``?format=csv``: the whole filtered log as CSV) and
``GET /api/v1/audit/export.csv``: the audit log to cluster admins (every entry) and team-admins (their teams'
entries). A malformed filter is a 400 naming every bad one; a member or viewer gets a 403."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, generics, serializers
from rest_framework.renderers import JSONRenderer

from strata.api.error_answers import error_response
from strata.api.permissions import IsUser
from strata.audit.selectors import (
    FILTERS,
    REFUSED,
    AuditFilterInvalid,
    csv_rows,
    entries_filtered,
    entries_readable,
    entry_data,
)

PARAMETERS = [OpenApiParameter(name, str, description=description) for name, description in FILTERS.items()]


class AuditEntrySerializer(serializers.Serializer):
    """One audit log entry: who (``actor``: the user's name, kept after the user is deleted), in which team, did
    what (``action``, dotted) to what (``target``), the changed values ``before`` and ``after``, and from where."""

    id = serializers.IntegerField()
    time = serializers.DateTimeField()
    actor = serializers.CharField(allow_null=True)
    actor_id = serializers.IntegerField(allow_null=True)
    team = serializers.CharField(allow_null=True)
    action = serializers.CharField()
    target = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    address = serializers.CharField(allow_null=True)
    user_agent = serializers.CharField()

    def to_representation(self, instance):
        return super().to_representation(entry_data(instance))


class AuditLogView(generics.ListAPIView):
    """The audit log, newest first, filtered by ``action`` (prefix), ``actor``, ``team``, ``target`` (prefix),
    ``since`` and ``until``; ``?format=csv`` streams every matching entry as CSV (no pages)."""

    permission_classes = [IsUser]
    serializer_class = AuditEntrySerializer
    export = False  # the export.csv route: always CSV

    def perform_content_negotiation(self, request, force=False):
        if self.export or request.query_params.get("format") == "csv":
            return JSONRenderer(), JSONRenderer.media_type  # errors as JSON; the CSV is streamed by list()
        return super().perform_content_negotiation(request, force)

    def get_queryset(self):
        entries = entries_readable(self.request)
        if entries is None:
            raise exceptions.PermissionDenied(REFUSED)
        try:
            return entries_filtered(entries, self.request.query_params)
        except AuditFilterInvalid as error:
            raise serializers.ValidationError({name: [message] for name, message in error.errors.items()}) from None

    @extend_schema(operation_id="audit_list",
                   parameters=[*PARAMETERS, OpenApiParameter("format", str, description="csv: every matching entry, "
                                                                                  "as CSV (no pages).")],
                   responses={200: AuditEntrySerializer(many=True), 400: error_response(400),
                              403: error_response(403)})
    def get(self, request, *args, **kwargs):
        if self.export or request.query_params.get("format") == "csv":
            return csv_response(self.get_queryset())
        return self.list(request, *args, **kwargs)


class AuditExportView(AuditLogView):
    """Every audit log entry the filters match, newest first, as CSV (streamed; ``time, actor, team, action,
    target, before, after, address, user_agent``; before and after as JSON)."""

    export = True

    @extend_schema(operation_id="audit_export_csv", parameters=PARAMETERS,
                   responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="The CSV export."),
                              400: error_response(400), 403: error_response(403)})
    def get(self, request, *args, **kwargs):
        return csv_response(self.get_queryset())


def csv_response(entries) -> StreamingHttpResponse:
    response = StreamingHttpResponse(csv_rows(entries.iterator(chunk_size=2000)), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="strata-audit-{timezone.now():%Y%m%d-%H%M%S}.csv"'
    return response
