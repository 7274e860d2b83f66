"""The node protocol's bodies and answers about one attempt (claim, report, finish, its files, its children):
what the node's worker and the attempt's own processes send to :mod:`strata.jobs.api.node_views`."""

from rest_framework import serializers

from components.runtime.shared.protocol import FINISH_OUTCOMES
from strata.cluster.api.serializers import clean_reports
from strata.cluster.models import Device


class AttemptCallSerializer(serializers.Serializer):
    node = serializers.UUIDField()
    token = serializers.CharField(max_length=64)


class ChildrenMetricsSerializer(AttemptCallSerializer):
    # child job id -> the cursor its points are read after (0: from the first); at most 1000 children a call
    after = serializers.DictField(child=serializers.IntegerField(min_value=0), allow_empty=True)
    limit = serializers.IntegerField(min_value=1, max_value=5000, required=False, default=1000)

    def validate_after(self, value):
        import uuid

        if len(value) > 1000:
            raise serializers.ValidationError("at most 1000 children a call")
        bad = []
        for key in value:
            try:
                uuid.UUID(str(key))
            except ValueError:
                bad.append(str(key)[:40])
        if bad:
            raise serializers.ValidationError(f"not job ids: {', '.join(bad)}")
        return value


class LogItemSerializer(serializers.Serializer):
    level = serializers.CharField(max_length=16, required=False, default="info")
    message = serializers.CharField(max_length=10000, allow_blank=True, trim_whitespace=False)


class MetricItemSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    step = serializers.IntegerField(min_value=0)
    value = serializers.FloatField()


class ReportSerializer(AttemptCallSerializer):
    logs = LogItemSerializer(many=True, required=False, default=list, max_length=5000)
    metrics = MetricItemSerializer(many=True, required=False, default=list, max_length=20000)
    reports = serializers.DictField(required=False, default=dict, help_text=(
        "{plugin: payload} about this attempt, each checked by that plugin's report schema (ReportSchema.attempt)."))

    def validate_reports(self, value):
        return clean_reports(value, "attempt")
    endpoint = serializers.RegexField(r"^[A-Za-z0-9.\-\[\]:]{1,200}:\d{1,5}$", required=False,
                                      help_text="host:port where the attempt answers requests (kinds with an endpoint).")


class FinishSerializer(AttemptCallSerializer):
    # The outcomes of components.runtime.shared.protocol (the node's worker reports them): service_lost means the node
    # service hosting the attempt died under it (requeued without a failure, up to a limit).
    outcome = serializers.ChoiceField(choices=list(FINISH_OUTCOMES))
    reason = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)


class ClaimDeviceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=Device.Kind.choices)
    index = serializers.IntegerField()
    memory = serializers.IntegerField()
    share = serializers.FloatField()


class ClaimWorkerSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    node = serializers.UUIDField()
    device = ClaimDeviceSerializer(allow_null=True, help_text=(
        "The GPU share of this worker; null for a worker that holds no GPU (a job with gpus: 0 runs on the "
        "node's CPUs)."))
    cpus = serializers.FloatField(required=False, help_text="CPUs reserved for the worker on the node, if any.")
    memory = serializers.IntegerField(required=False, help_text="Host memory (bytes) reserved with them.")


class AttemptCredentialSerializer(serializers.Serializer):
    credential = serializers.CharField(help_text="An attempt credential (strata.accounts.attempt_credentials): "
                                                 "the bearer value for this attempt's own routes.")
    expires = serializers.FloatField(help_text="When it expires (unix seconds): renew it before.")


class ClaimAnswerSerializer(serializers.Serializer):
    attempt = serializers.UUIDField()
    number = serializers.IntegerField()
    job = serializers.UUIDField()
    job_name = serializers.CharField()
    kind = serializers.CharField()
    spec = serializers.DictField(help_text="The job's normalized spec.")
    resources = serializers.DictField(help_text="The job's normalized resources.")
    time_limit = serializers.IntegerField(help_text="Seconds.")
    world_size = serializers.IntegerField()
    allocations = ClaimWorkerSerializer(many=True)
    priority = serializers.IntegerField()
    stop = serializers.BooleanField()
    secrets = serializers.DictField(child=serializers.CharField(), help_text=(
        "The values of the team's secrets the spec names in environment.secrets, {NAME: value} ({} when none): "
        "for the attempt's environment only."))
    credential = AttemptCredentialSerializer(help_text="What the attempt's processes authenticate with.")
    team = serializers.IntegerField(help_text="The job's team (a sandboxed attempt runs as the team's own uid).")
    reads_user_output = serializers.BooleanField(help_text=(
        "The job reads artifacts a team's own code wrote (a source job's): it runs as that code does, in its own "
        "sandboxed processes, never in a node service shared with other teams' attempts."))


class StopAnswerSerializer(serializers.Serializer):
    stop = serializers.BooleanField(help_text="The attempt must stop (cancelled, preempted, or ended).")


class FinishAnswerSerializer(serializers.Serializer):
    job_state = serializers.CharField()


class StoredArtifactSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
