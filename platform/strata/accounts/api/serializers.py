from rest_framework import serializers

from components.runtime.contract.project import secret_name_problem
from strata.accounts.models import ApiToken, Secret, Team
from strata.accounts.team_secrets import MAX_VALUE_BYTES, value_problem


class TeamSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = ["id", "slug", "name", "created_at"]
        read_only_fields = fields


class TokenSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True,
                                        help_text="The team a user token is scoped to; null for node tokens.")
    user = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                        help_text="Whose token it is (a team-admin also sees their members').")

    class Meta:
        model = ApiToken
        fields = ["id", "kind", "name", "prefix", "team", "user", "created_at", "expires_at", "revoked_at",
                  "last_used_at"]
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


class SecretSerializer(serializers.ModelSerializer):
    """A team secret as every answer shows it: never its value."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    updated_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True,
                                              help_text="Who set the current value.")

    class Meta:
        model = Secret
        fields = ["name", "team", "created_by", "created_at", "updated_by", "updated_at"]
        read_only_fields = fields


class TextField(serializers.CharField):
    """A string, never a number or a boolean turned into one."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class SecretSetSerializer(serializers.Serializer):
    name = TextField(max_length=200, help_text=(
        "An environment variable name: 1 to 64 of A-Z, 0-9 and _, not starting with a digit; never one Strata or "
        "Python sets (STRATA_*, RANK, PATH, PYTHON*, LD_* ...)."))
    value = TextField(trim_whitespace=False, write_only=True,
                                  help_text=f"The value (text, at most {MAX_VALUE_BYTES // 1024} KiB). Never shown "
                                            "again by any answer.")
    team = serializers.SlugField(required=False, help_text="The team (slug); default: the token's team or your "
                                                           "only team.")

    def validate_name(self, value):
        if problem := secret_name_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_value(self, value):
        if problem := value_problem(value):
            raise serializers.ValidationError(problem)
        return value


class MemberSerializer(serializers.Serializer):
    """A member of a team: their role and their own limits inside the team's quota (null: none)."""

    username = serializers.CharField(read_only=True)
    team = serializers.CharField(read_only=True)
    role = serializers.ChoiceField(choices=["viewer", "member", "team-admin"], read_only=True)
    max_concurrent_jobs = serializers.IntegerField(read_only=True, allow_null=True,
                                                   help_text="The user's admitted jobs in the team at once.")
    max_gpus = serializers.FloatField(read_only=True, allow_null=True,
                                      help_text="GPUs the user's jobs in the team hold at once.")


class MemberAddSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=["viewer", "member", "team-admin"], default="member")


class MemberChangeSerializer(serializers.Serializer):
    """Any of: a new role; per-user limits (null clears one; each at most the team's quota)."""

    role = serializers.ChoiceField(choices=["viewer", "member", "team-admin"], required=False)
    max_concurrent_jobs = serializers.IntegerField(min_value=0, allow_null=True, required=False)
    max_gpus = serializers.FloatField(min_value=0, allow_null=True, required=False)
