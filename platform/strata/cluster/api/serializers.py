from rest_framework import serializers

from strata.cluster.models import Device, Node


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

    class Meta:
        model = Node
        fields = ["id", "name", "hostname", "state", "labels", "registered_at", "last_heartbeat", "lease_expires_at",
                  "lease_valid", "devices"]
        read_only_fields = fields


class DeviceReportSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=1024)
    kind = serializers.ChoiceField(choices=Device.Kind.choices)
    name = serializers.CharField(max_length=200, required=False, default="")
    memory_total = serializers.IntegerField(min_value=1)


class RegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=255, required=False, default="")
    address = serializers.CharField(max_length=255, required=False, default="")
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False, default=dict)
    devices = DeviceReportSerializer(many=True)
    info = serializers.DictField(required=False, default=dict)


class SampleSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0)
    utilization = serializers.FloatField(min_value=0, max_value=100)
    memory_used = serializers.IntegerField(min_value=0)


class HeartbeatSerializer(serializers.Serializer):
    node = serializers.UUIDField()
    session = serializers.UUIDField()
    samples = SampleSerializer(many=True, required=False, default=list)
    attempts = serializers.ListField(child=serializers.UUIDField(format="hex_verbose"), required=False, default=list,
                                     max_length=1024)


class AttemptCallSerializer(serializers.Serializer):
    node = serializers.UUIDField()
    token = serializers.CharField(max_length=64)


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


class FinishSerializer(AttemptCallSerializer):
    outcome = serializers.ChoiceField(choices=["succeeded", "failed", "time_limit"])
    reason = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)
