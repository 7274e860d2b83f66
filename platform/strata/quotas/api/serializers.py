from rest_framework import serializers

from strata.quotas.models import Quota
from strata.quotas.services import QUOTA_FIELDS, QuotaInvalid, quota_clean


def _limit_field(name: str) -> serializers.Field:
    """A serializer field whose type and bounds come from the one table of quota rules (QUOTA_FIELDS)."""
    kind, nullable, minimum, maximum = QUOTA_FIELDS[name]
    field_class = serializers.IntegerField if kind is int else serializers.FloatField
    return field_class(min_value=minimum, max_value=maximum, allow_null=nullable, required=False)


class ByteSizeField(serializers.Field):
    """Bytes, or a size such as "16GiB" (parsed by quota_clean, like the web editor); null is unlimited."""

    def __init__(self, quota_field: str = "max_gpu_memory", **kwargs):
        super().__init__(**kwargs)
        self.quota_field = quota_field

    def to_internal_value(self, data):
        try:
            return quota_clean({self.quota_field: data})[self.quota_field]
        except QuotaInvalid as error:
            raise serializers.ValidationError(error.errors[self.quota_field]) from None

    def to_representation(self, value):
        return value


class DataRootsField(serializers.ListField):
    """The team's data roots: absolute directories on the nodes (strata.quotas.roots), checked by quota_clean."""

    def __init__(self, **kwargs):
        from strata.quotas.roots import MAX_PATH, MAX_ROOTS

        super().__init__(child=serializers.CharField(max_length=MAX_PATH, trim_whitespace=False),
                         max_length=MAX_ROOTS, allow_empty=True, required=False,
                         help_text="Directories on the nodes under which the team may register data by path "
                                   "(absolute; set by cluster admins). Never the platform's own state.", **kwargs)


class QuotaSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    max_gpus = _limit_field("max_gpus")
    max_gpu_memory = ByteSizeField(allow_null=True, required=False)
    max_cpus = _limit_field("max_cpus")
    max_memory = ByteSizeField("max_memory", allow_null=True, required=False)
    max_storage_bytes = ByteSizeField("max_storage_bytes", allow_null=True, required=False, help_text=(
        "Bytes the team may keep stored (artifacts, checkpoints, code bundles, data sets, unfinished uploads); "
        "a store past it is a 413. Null: unlimited."))
    # Checked by quota_clean in validate(), which names each bad part (keep.checkpoints.best, ...).
    keep = serializers.JSONField(allow_null=True, required=False, help_text=(
        "The team's retention policy, under a job's own keep and over the cluster's defaults: {checkpoints: "
        "latest | all | {best: N, metric, mode}, artifacts_days: N | null}; null: the cluster's."))
    max_concurrent_jobs = _limit_field("max_concurrent_jobs")
    gpu_hours = _limit_field("gpu_hours")
    window_hours = _limit_field("window_hours")
    budget_gpu_hours = _limit_field("budget_gpu_hours")
    budget_period_days = _limit_field("budget_period_days")
    weight = _limit_field("weight")
    priority = _limit_field("priority")
    data_roots = DataRootsField()

    class Meta:
        model = Quota
        fields = ["id", "team", "max_gpus", "max_gpu_memory", "max_cpus", "max_memory", "max_storage_bytes",
                  "max_concurrent_jobs", "gpu_hours", "window_hours", "budget_gpu_hours", "budget_period_days", "priority", "weight", "keep", "data_roots"]
        read_only_fields = ["id", "team"]

    def validate(self, attrs):
        try:
            return quota_clean(attrs)
        except QuotaInvalid as error:
            raise serializers.ValidationError({field: [message] for field, message in error.errors.items()}) from None


class StorageSerializer(serializers.Serializer):
    artifacts = serializers.IntegerField(help_text="Artifacts of the team's jobs (models, outputs).")
    checkpoints = serializers.IntegerField(help_text="Checkpoints of the team's jobs.")
    code = serializers.IntegerField(help_text="Code bundles.")
    data = serializers.IntegerField(help_text="Data sets.")
    uploads = serializers.IntegerField(help_text="Chunks of unfinished data uploads.")
    total = serializers.IntegerField()


class UsageSerializer(serializers.Serializer):
    """What a team holds now and has used (quotas.services.team_usage); for the OpenAPI schema."""

    jobs = serializers.IntegerField(help_text="Admitted jobs not finished yet.")
    gpus = serializers.FloatField(help_text="GPUs they hold or ask for, and the GPUs of the active participants.")
    gpu_memory = serializers.IntegerField(help_text="Bytes of GPU memory they hold or ask for.")
    gpu_hours_window = serializers.FloatField(help_text="GPU-hours used in the last window_hours.")
    gpu_hours_total = serializers.FloatField()
    cpus = serializers.FloatField(help_text="CPUs the admitted jobs reserve (jobs with gpus: 0, and GPU jobs that "
                                            "state cpus).")
    memory = serializers.IntegerField(help_text="Bytes of host memory they reserve.")
    cpu_hours_window = serializers.FloatField(help_text="CPU-hours used in the last window_hours.")
    cpu_hours_total = serializers.FloatField()
    window_hours = serializers.FloatField()
    pending = serializers.IntegerField(help_text="Jobs waiting for quota.")
    participants = serializers.IntegerField(help_text="Active participants of the team's jobs (machines outside "
                                                      "the cluster that joined them).")
    storage = StorageSerializer(help_text="Bytes the team keeps stored, by part, and their total (what "
                                          "max_storage_bytes caps).")


class QuotaUsageSerializer(serializers.Serializer):
    team = serializers.CharField()
    quota = QuotaSerializer()
    usage = UsageSerializer()
