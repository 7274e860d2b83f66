from rest_framework import serializers

from strata.cluster.models import Device, DevicePool, Node


class PoolSerializer(serializers.Serializer):
    name = serializers.CharField(read_only=True)
    sharing_policy = serializers.ChoiceField(choices=DevicePool.Policy.choices)
    nodes = serializers.IntegerField(read_only=True)
    devices = serializers.IntegerField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)


class DeviceSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Device
        fields = ["id", "node", "index", "kind", "name", "virtual", "memory_total", "utilization", "memory_used",
                  "updated_at"]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    devices = DeviceSerializer(many=True, read_only=True)
    lease_valid = serializers.BooleanField(read_only=True)

    cpus = serializers.FloatField(read_only=True, allow_null=True,
                                  help_text="CPUs the node reported (shared by jobs that reserve CPUs); null if none.")
    memory = serializers.IntegerField(read_only=True, allow_null=True,
                                      help_text="Host memory (bytes) the node reported; null if none.")

    class Meta:
        model = Node
        fields = ["id", "name", "hostname", "state", "labels", "registered_at", "last_heartbeat", "lease_expires_at",
                  "lease_valid", "cpus", "memory", "devices"]
        read_only_fields = fields


class DeviceReportSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=1024)
    kind = serializers.ChoiceField(choices=[(Device.Kind.CUDA, "cuda"), (Device.Kind.VIRTUAL, "virtual")])
    name = serializers.CharField(max_length=200, required=False, default="")
    memory_total = serializers.IntegerField(min_value=1)


class RegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=255, required=False, default="")
    address = serializers.CharField(max_length=255, required=False, default="")
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False, default=dict)
    devices = DeviceReportSerializer(many=True)
    info = serializers.DictField(required=False, default=dict)
    cpus = serializers.FloatField(min_value=0.001, max_value=1_000_000, required=False, allow_null=True, default=None,
                                  help_text="CPUs the node offers to jobs that reserve CPUs; without it, none.")
    memory = serializers.IntegerField(min_value=0, max_value=2**60, required=False, allow_null=True, default=None,
                                      help_text="Host memory (bytes) the node offers to such jobs.")


class SampleSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0)
    utilization = serializers.FloatField(min_value=0, max_value=100)
    memory_used = serializers.IntegerField(min_value=0)
    time = serializers.FloatField(required=False, help_text=(
        "When the sample was taken (Unix s): an agent that renews its lease with node/renew/ sends the samples of "
        "several beats in one full heartbeat. Absent: the heartbeat's time."))


def clean_reports(value: dict, scope: str) -> dict:
    from strata.cluster.services import reports_clean

    clean, errors = reports_clean(value, scope)
    if errors:
        raise serializers.ValidationError(errors)
    return clean


class HeartbeatSerializer(serializers.Serializer):
    node = serializers.UUIDField()
    session = serializers.UUIDField()
    samples = SampleSerializer(many=True, required=False, default=list, max_length=4096)
    attempts = serializers.ListField(child=serializers.UUIDField(format="hex_verbose"), required=False, default=list,
                                     max_length=1024)
    reports = serializers.DictField(required=False, default=dict, help_text=(
        "The generic report channel: {plugin: payload}, each payload checked by that plugin's report schema "
        "(ReportSchema.node); a refused payload is a 400 naming reports.<plugin>.<field>."))

    def validate_reports(self, value):
        return clean_reports(value, "node")


# --- answers of the node protocol, for the OpenAPI schema (the views build these as plain dicts) -----------

class RegisterAnswerSerializer(serializers.Serializer):
    node = serializers.UUIDField(help_text="The node's id: send it with every later call.")
    session = serializers.UUIDField(help_text="This registration's session; a newer one makes heartbeats 409.")
    queue = serializers.CharField(help_text="The broker queue the node's worker consumes.")
    broker_url = serializers.CharField()
    broker_prefix = serializers.CharField(allow_null=True, allow_blank=True)
    heartbeat_seconds = serializers.FloatField()
    lease_seconds = serializers.FloatField()


class StalledSerializer(serializers.Serializer):
    attempts = serializers.IntegerField(help_text="Attempts dispatched to the node and not claimed in time.")
    after_seconds = serializers.FloatField(help_text="How long a dispatch may wait for its claim.")


class HeartbeatAnswerSerializer(serializers.Serializer):
    lease_seconds = serializers.FloatField()
    stop = serializers.ListField(child=serializers.CharField(), help_text="Attempts the node must stop.")
    sharing_policy = serializers.ChoiceField(choices=DevicePool.Policy.choices,
                                             help_text="The GPU-sharing policy of the node's pool.")
    state = serializers.ChoiceField(choices=Node.State.choices, help_text=(
        "The node's state: draining after POST node/drain/ (no new work is placed on it) until it leaves or "
        "registers again."))
    attempts_left = serializers.IntegerField(required=False, help_text=(
        "Only while draining: the attempts that still hold a device on the node (0: it may leave)."))
    telemetry_seconds = serializers.FloatField(required=False, help_text=(
        "How often the agent sends a full heartbeat (batched samples, reports); in between it renews its lease with "
        "POST node/renew/ (node, session, attempts), which answers as this does. Absent: every beat is full."))
    stalled = StalledSerializer(required=False, help_text=(
        "Only when attempts dispatched to the node were not claimed within `after_seconds`: its worker takes no "
        "work, and the agent restarts it."))


class NodeSessionSerializer(serializers.Serializer):
    """A node's call about itself (drain, leave), fenced like a heartbeat: its id and current session."""

    node = serializers.UUIDField()
    session = serializers.UUIDField()


class DrainAnswerSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=Node.State.choices)
    attempts_left = serializers.IntegerField(help_text="The attempts that still hold a device on the node.")
    lease_seconds = serializers.FloatField()


class LeaveAnswerSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=Node.State.choices)
    released = serializers.IntegerField(help_text="The attempts ended (or shrunk) as for a lost node.")
