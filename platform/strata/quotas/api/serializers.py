from rest_framework import serializers

from strata.quotas.models import Quota


class QuotaSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    max_gpus = serializers.FloatField(min_value=0, allow_null=True, required=False)
    gpu_hours = serializers.FloatField(min_value=0, allow_null=True, required=False)
    window_hours = serializers.FloatField(min_value=0.01, max_value=24 * 366, required=False)
    weight = serializers.FloatField(min_value=0.001, max_value=1000, required=False)
    priority = serializers.IntegerField(min_value=-100, max_value=100, required=False)

    class Meta:
        model = Quota
        fields = ["id", "team", "max_gpus", "max_gpu_memory", "max_concurrent_jobs", "gpu_hours", "window_hours",
                  "priority", "weight"]
        read_only_fields = ["id", "team"]
