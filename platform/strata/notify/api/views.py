"""``/api/v1/webhooks/`` and ``/api/v1/email-subscriptions/``: a team's notification targets, for its team-admins
(a cluster admin too). Another team's target is a 404; a team the caller sees without the team-admin role, a
JSON 403 naming the role."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from strata.accounts import roles
from strata.accounts.models import Team
from strata.accounts.selectors import visible_team_ids
from strata.api.permissions import IsUser
from strata.notify import services
from strata.notify.api.serializers import (
    DeliverySerializer,
    EmailSubscriptionCreateSerializer,
    EmailSubscriptionSerializer,
    WebhookCreatedSerializer,
    WebhookCreateSerializer,
    WebhookSerializer,
    WebhookUpdateSerializer,
)
from strata.notify.models import Delivery, EmailSubscription, Webhook

TEAM = OpenApiParameter("team", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False,
                        description="Only this team's (a slug).")


def admin_team(request, slug) -> Team:
    """The team a new target goes to: the named one (a 400 on ``team`` if the caller cannot see it, as a submit's
    team is, a 403 without the team-admin role there), else the caller's only team-admin team (a 400 on ``team``
    otherwise)."""
    if slug is not None and not isinstance(slug, str):
        raise serializers.ValidationError({"team": ["a team slug"]})
    visible = visible_team_ids(request)
    if slug or len(visible) == 1:  # named, or the caller's only team (a token's): the role there decides
        team = (Team.objects.filter(slug=slug, id__in=visible) if slug else Team.objects.filter(pk=visible[0])).first()
        if team is None and slug:
            raise serializers.ValidationError({"team": [f"unknown team {slug!r}"]})
        roles.require(request, team, roles.TEAM_ADMIN, "manage its notifications")
        assert team is not None
        return team
    ids = roles.team_ids_with(request, roles.TEAM_ADMIN)
    if len(ids) != 1:
        raise serializers.ValidationError({"team": ["required: you are a team-admin of several teams" if ids
                                                    else "you are a team-admin of no team"]})
    return Team.objects.get(pk=ids[0])


class _TargetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                     viewsets.GenericViewSet):
    permission_classes = [IsUser]
    model: type[Webhook] | type[EmailSubscription] = Webhook
    kind = "webhook"

    def get_queryset(self):
        queryset = self.model.objects.select_related("team", "created_by")
        if self.action == "list":
            queryset = queryset.filter(team_id__in=roles.team_ids_with(self.request, roles.TEAM_ADMIN))
            if slug := self.request.query_params.get("team"):
                team = Team.objects.filter(slug=slug, id__in=visible_team_ids(self.request)).first()
                roles.require(self.request, team, roles.TEAM_ADMIN, "list its notifications")
                queryset = queryset.filter(team__slug=slug)
            return queryset.order_by("team__slug", "id")
        return queryset.filter(team_id__in=visible_team_ids(self.request))

    def get_object(self):
        target = super().get_object()
        roles.require(self.request, target.team, roles.TEAM_ADMIN, "manage its notifications")
        return target

    def perform_destroy(self, instance):
        before = dict(self.get_serializer(instance).data)
        team, pk = instance.team, instance.pk
        with transaction.atomic():
            instance.delete()
            if self.kind == "webhook":
                services.audit("webhook.delete", request=self.request, team=team, target=f"webhook {pk}",
                               before=before)

    @extend_schema(request=None, responses={202: DeliverySerializer})
    @action(detail=True, methods=["post"])
    def test(self, request, pk=None):
        """Send a ``webhook.test`` notification to this target now (queued on the notify queue), whatever it
        subscribes to and even when disabled; answers the delivery (follow it in ``deliveries/``)."""
        delivery = services.send_test(self.get_object())
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: DeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None):
        """The target's deliveries, newest first: status, tries, the last answer's code, error and duration."""
        target = self.get_object()
        field = "webhook" if isinstance(target, Webhook) else "email"
        queryset = Delivery.objects.filter(**{field: target}).order_by("-created_at", "-id")
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(DeliverySerializer(page, many=True).data)


@extend_schema_view(list=extend_schema(parameters=[TEAM]))
class WebhookViewSet(_TargetViewSet):
    """A team's webhooks: each event it subscribes to is POSTed to its URL, signed with its secret
    (``Strata-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">``; docs/architecture.md, Notifications)."""

    serializer_class = WebhookSerializer
    model = Webhook
    kind = "webhook"

    @extend_schema(request=WebhookCreateSerializer, responses={201: OpenApiResponse(
        WebhookCreatedSerializer, description="The new webhook, with its secret: shown this once.")})
    def create(self, request, *args, **kwargs):
        """Create a webhook: ``{url, format?: json|slack, events?: [...], enabled?, team?}``."""
        body = request.data if isinstance(request.data, dict) else {}
        errors: dict[str, list[str]] = {}
        team = None
        try:
            team = admin_team(request, body.get("team") or request.query_params.get("team"))
        except serializers.ValidationError as error:
            errors.update(error.detail)  # type: ignore[arg-type]
        if not isinstance(request.data, dict):
            errors["non_field_errors"] = ["a JSON object"]
        unknown = sorted(set(body) - {"url", "format", "events", "enabled", "team"})
        for name in unknown:
            errors[name] = ["unknown field"]
        if team is not None:
            try:
                with transaction.atomic():
                    hook, secret = services.webhook_create(team, url=body.get("url"),
                                                           format=body.get("format", "json"),
                                                           events=body.get("events"),
                                                           enabled=body.get("enabled", True), user=request.user)
                    services.audit("webhook.create", request=request, team=team, target=f"webhook {hook.pk}",
                                   after={"url": hook.url, "format": hook.format, "events": hook.events,
                                          "enabled": hook.enabled})
            except services.NotifyRejected as error:
                errors.update({field: [message] for field, message in error.errors.items()})
        if errors:
            raise serializers.ValidationError(errors)
        return Response({**WebhookSerializer(hook).data, "secret": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookUpdateSerializer, responses={200: WebhookSerializer})
    def partial_update(self, request, *args, **kwargs):
        """Change a webhook's ``events`` or ``enabled`` (its URL and secret stay: create another to change them)."""
        hook = self.get_object()
        body = request.data if isinstance(request.data, dict) else {}
        errors: dict[str, list[str]] = {}
        for name in sorted(set(body) - {"events", "enabled"}):
            errors[name] = ["unknown field (only events and enabled change)"]
        problems: dict[str, str] = {}
        events = services.clean_events(body["events"], problems) if "events" in body else hook.events
        if "enabled" in body and not isinstance(body["enabled"], bool):
            problems["enabled"] = "true or false"
        errors.update({field: [message] for field, message in problems.items()})
        if errors:
            raise serializers.ValidationError(errors)
        hook.events, hook.enabled = events, body.get("enabled", hook.enabled)
        hook.save(update_fields=["events", "enabled"])
        return Response(WebhookSerializer(hook).data)


@extend_schema_view(list=extend_schema(parameters=[TEAM]))
class EmailSubscriptionViewSet(_TargetViewSet):
    """A team's e-mail subscriptions: each event an address subscribes to is mailed to it (EMAIL_* settings)."""

    serializer_class = EmailSubscriptionSerializer
    model = EmailSubscription
    kind = "email_subscription"

    @extend_schema(request=EmailSubscriptionCreateSerializer, responses={201: EmailSubscriptionSerializer})
    def create(self, request, *args, **kwargs):
        """Subscribe an address: ``{address, events?: [...], team?}``."""
        body = request.data if isinstance(request.data, dict) else {}
        errors: dict[str, list[str]] = {}
        team = None
        try:
            team = admin_team(request, body.get("team") or request.query_params.get("team"))
        except serializers.ValidationError as error:
            errors.update(error.detail)  # type: ignore[arg-type]
        for name in sorted(set(body) - {"address", "events", "team"}):
            errors[name] = ["unknown field"]
        if team is not None:
            try:
                entry = services.email_create(team, address=body.get("address"), events=body.get("events"),
                                              user=request.user)
            except services.NotifyRejected as error:
                errors.update({field: [message] for field, message in error.errors.items()})
        if errors:
            raise serializers.ValidationError(errors)
        return Response(EmailSubscriptionSerializer(entry).data, status=status.HTTP_201_CREATED)
