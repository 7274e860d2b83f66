from __future__ import annotations

from rest_framework import serializers

from strata.notify.models import EVENTS, Delivery, EmailSubscription, Webhook


class WebhookSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS))

    class Meta:
        model = Webhook
        fields = ["id", "team", "url", "format", "events", "enabled", "created_by", "created_at"]
        read_only_fields = fields


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(help_text="The signing secret (whsec_...): shown this once, never again.")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookCreateSerializer(serializers.Serializer):
    """The body of a create (each bad field is named in the 400)."""

    url = serializers.URLField(max_length=2000)
    format = serializers.ChoiceField(choices=Webhook.Format.choices, default="json")
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS), required=False,
                                   help_text="Default: every event.")
    enabled = serializers.BooleanField(default=True)
    team = serializers.CharField(required=False, help_text="A team slug (default: your only team-admin team).")


class WebhookUpdateSerializer(serializers.Serializer):
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS), required=False)
    enabled = serializers.BooleanField(required=False)


class EmailSubscriptionSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS))

    class Meta:
        model = EmailSubscription
        fields = ["id", "team", "address", "events", "enabled", "created_by", "created_at"]
        read_only_fields = fields


class EmailSubscriptionCreateSerializer(serializers.Serializer):
    address = serializers.EmailField()
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS), required=False)
    team = serializers.CharField(required=False)


class DeliverySerializer(serializers.ModelSerializer):
    target = serializers.SerializerMethodField()

    class Meta:
        model = Delivery
        fields = ["id", "event", "target", "status", "attempts", "response_code", "error", "duration_ms",
                  "created_at", "updated_at", "next_attempt_at", "finished_at", "payload"]
        read_only_fields = fields

    def get_target(self, delivery: Delivery) -> str:
        return f"webhook {delivery.webhook_id}" if delivery.webhook_id else f"email {delivery.email_id}"
