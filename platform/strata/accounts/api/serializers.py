from rest_framework import serializers

from strata.accounts.models import ApiToken, Team


class TeamSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = ["id", "slug", "name", "created_at"]
        read_only_fields = fields


class TokenSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True,
                                        help_text="The team a user token is scoped to; null for node tokens.")

    class Meta:
        model = ApiToken
        fields = ["id", "kind", "name", "prefix", "team", "created_at", "expires_at", "revoked_at", "last_used_at"]
        read_only_fields = fields


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, default="")
    team = serializers.SlugField(required=False)
    kind = serializers.ChoiceField(choices=ApiToken.Kind.choices, default=ApiToken.Kind.USER)
    ttl_days = serializers.FloatField(min_value=0.001, max_value=3650, required=False)


class TokenCreatedSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The raw token. Shown once, never stored.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields
