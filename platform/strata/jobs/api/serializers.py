from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from components.runtime.contract.registry import UnknownKind, get_kind
from components.runtime.contract.spec import SpecError
from components.runtime.shared.credentials import SUBJECT_PATTERN
from components.runtime.shared.units import parse_bytes, parse_duration
from strata.api.values import safe_name, value_problems
from strata.jobs.data import missing_chunks, upload_deadline
from strata.jobs.elastic import floor_problems, with_kind_default
from strata.jobs.keep import KeepInvalid, keep_clean
from strata.jobs.models import (
    TERMINAL_STATES,
    Allocation,
    Artifact,
    Attempt,
    CodeBundle,
    DataSet,
    DataUpload,
    Job,
    JobEvent,
    JobState,
    JobToken,
    LogLine,
    MetricPoint,
    Participant,
)

SUBMIT_FIELDS = {"name", "kind", "team", "priority", "max_attempts", "time_limit", "resources", "spec", "code", "keep"}
RESOURCE_FIELDS = {"gpus", "gpu_memory", "workers", "node_labels", "cpus", "memory", "elastic"}
ELASTIC_FIELDS = {"min_share", "min_workers"}
MIN_GPUS = 0.001  # the smallest share the scheduler places
MAX_GPU_MEMORY = 2**50  # 1 PiB: far above any device, far below what a 64-bit column holds
MIN_CPUS = 0.001  # the smallest CPU reservation the scheduler places (it counts thousandths of CPUs)
MAX_CPUS = 4096
MAX_MEMORY = 2**50  # host memory per worker: as for gpu_memory
MAX_NAMED_UNKNOWN = 100  # a body of 10,000 unknown fields is answered naming the first ones


def normalize_resources(value) -> dict:
    """Validate a resource request; errors are keyed ``resources.<field>``."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise serializers.ValidationError({"resources": ["must be an object"]})
    errors = {}
    for name in value:
        if name not in RESOURCE_FIELDS:
            errors[f"resources.{safe_name(str(name))}"] = [f"unknown field; allowed: {', '.join(sorted(RESOURCE_FIELDS))}"]
    memory = None
    if value.get("gpu_memory") is not None:
        try:
            memory = parse_bytes(value["gpu_memory"])
            if memory <= 0:
                raise ValueError("must be positive")
            if memory > MAX_GPU_MEMORY:
                raise ValueError(f"must be at most {MAX_GPU_MEMORY // 2**50} PiB")
        except ValueError as error:
            errors["resources.gpu_memory"] = [str(error)]
    default_gpus = 0.0 if memory else 1.0
    gpus = value.get("gpus", default_gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, int | float) or gpus != gpus:
        errors["resources.gpus"] = ["must be a number"]
        gpus = 0.0
    elif gpus < 0 or gpus > 64:
        errors["resources.gpus"] = ["must be between 0 and 64"]
    elif gpus > 1 and int(gpus) != gpus:
        errors["resources.gpus"] = ["above 1 must be a whole number of GPUs"]
    elif 0 < gpus < MIN_GPUS:
        errors["resources.gpus"] = [f"must be at least {MIN_GPUS} (a thousandth of a GPU)"]
    workers = value.get("workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
        errors["resources.workers"] = ["must be an integer between 1 and 256"]
    labels = value.get("node_labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str | int) for k, v in labels.items()):
        errors["resources.node_labels"] = ["must be an object of label: value"]
    # gpus: 0 without gpu_memory is a job that holds no GPU: it reserves CPUs (1 unless it says) on a node.
    gpu_free = isinstance(gpus, int | float) and not isinstance(gpus, bool) and gpus == 0 \
        and value.get("gpu_memory") is None
    cpus, host_memory = _cpu_resources(value, errors, gpu_free)
    elastic = _elastic(value.get("elastic"), gpus, workers, errors)
    if errors:
        raise serializers.ValidationError(errors)
    result = {"gpus": float(gpus), "gpu_memory": memory, "workers": int(workers)}
    if cpus is not None:
        result.update(cpus=cpus, memory=host_memory)
    if labels:
        result["node_labels"] = {k: str(v) for k, v in labels.items()}
    if elastic:
        result["elastic"] = elastic
    return result


def _elastic(value, gpus, workers, errors: dict) -> dict | None:
    """``resources.elastic``: how far the job may be shrunk instead of preempted (``min_share``: GPUs per worker,
    at most ``gpus``; ``min_workers``: at most ``workers``), adding to ``errors`` what is wrong with it."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        errors["resources.elastic"] = ["must be an object with min_share (GPUs per worker) and/or min_workers"]
        return None
    result: dict = {}
    for name in value:
        if name not in ELASTIC_FIELDS:
            errors[f"resources.elastic.{safe_name(str(name))}"] = [
                f"unknown field; allowed: {', '.join(sorted(ELASTIC_FIELDS))}"]
    numeric = isinstance(gpus, int | float) and not isinstance(gpus, bool)
    if "min_share" in value:
        share = value["min_share"]
        if isinstance(share, bool) or not isinstance(share, int | float) or share != share:
            errors["resources.elastic.min_share"] = ["must be a number"]
        elif numeric and not MIN_GPUS <= share <= gpus:
            errors["resources.elastic.min_share"] = [f"must be between {MIN_GPUS} and the job's gpus ({gpus:g})"]
        elif numeric and gpus > 1 and int(share) != share:
            errors["resources.elastic.min_share"] = ["must be a whole number of GPUs when gpus is above 1"]
        else:
            result["min_share"] = float(share)
    if "min_workers" in value:
        fewest = value["min_workers"]
        if isinstance(fewest, bool) or not isinstance(fewest, int) or fewest < 1:
            errors["resources.elastic.min_workers"] = ["must be an integer of at least 1"]
        elif isinstance(workers, int) and not isinstance(workers, bool) and fewest > workers:
            errors["resources.elastic.min_workers"] = [f"must be at most the job's workers ({workers})"]
        else:
            result["min_workers"] = fewest
    return result


def _cpu_resources(value: dict, errors: dict, gpu_free: bool) -> tuple[float | None, int | None]:
    """``(cpus, memory bytes or None)`` each worker reserves on its node, adding to ``errors`` what is wrong with
    them. A job that holds no GPU reserves 1 CPU unless it says otherwise; a GPU job reserves CPUs (and host
    memory) only when it states them: (None, None) then."""
    cpus = value.get("cpus")
    if cpus is None and value.get("memory") is None and not gpu_free:
        return None, None
    if cpus is None:
        cpus = 1.0
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or cpus != cpus:
        errors["resources.cpus"] = ["must be a number"]
    elif not MIN_CPUS <= cpus <= MAX_CPUS:
        errors["resources.cpus"] = [f"must be between {MIN_CPUS} (a thousandth of a CPU) and {MAX_CPUS}"]
    host_memory = None
    if value.get("memory") is not None:
        try:
            host_memory = parse_bytes(value["memory"])
            if host_memory <= 0:
                raise ValueError("must be positive")
            if host_memory > MAX_MEMORY:
                raise ValueError(f"must be at most {MAX_MEMORY // 2**50} PiB")
        except ValueError as error:
            errors["resources.memory"] = [str(error)]
    if "resources.cpus" in errors:
        return None, host_memory
    return float(cpus), host_memory


KEEP_HELP = ("The job's retention policy, over its team's and the cluster's (a child job without one follows its "
             "parent's): {checkpoints: latest | all | {best: N, metric, mode}, artifacts_days: N | null}; null: none "
             "of its own. docs/operations.md, Retention.")


class JobSubmitSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    kind = serializers.CharField(max_length=64)
    team = serializers.SlugField(max_length=64, required=False)
    priority = serializers.IntegerField(min_value=-100, max_value=100, default=0)
    max_attempts = serializers.IntegerField(min_value=1, max_value=20, default=3)
    time_limit = serializers.JSONField(required=False)
    resources = serializers.JSONField(required=False)
    spec = serializers.JSONField(required=False)
    code = serializers.CharField(required=False, allow_null=True, max_length=71, help_text=(
        "The team's code bundle to run (its SHA-256 digest from POST /api/v1/code/, or a unique prefix of 12+ "
        "digits); the job's working directory holds its files. A child job runs its parent's unless it names one."))
    keep = serializers.JSONField(required=False, allow_null=True, help_text=KEEP_HELP)

    def to_internal_value(self, data):
        """Every bad field at once: the envelope's fields, ``resources`` and the kind's ``spec`` are all checked
        before anything is reported (text that cannot be stored is refused first: the other checks could
        echo it)."""
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["expected a JSON object"]})
        errors = {field: [message] for field, message in value_problems(data).items()}
        unknown = sorted(set(data) - SUBMIT_FIELDS, key=str)
        errors.update({safe_name(str(name)): ["unknown or read-only field"] for name in unknown[:MAX_NAMED_UNKNOWN]})
        if len(unknown) > MAX_NAMED_UNKNOWN:
            errors["non_field_errors"] = [f"and {len(unknown) - MAX_NAMED_UNKNOWN} more unknown fields"]
        if errors:
            raise serializers.ValidationError(errors)
        attrs = {}
        try:
            attrs = super().to_internal_value(data)
        except serializers.ValidationError as error:
            errors.update(error.detail)
        try:
            resources = normalize_resources(data.get("resources"))
        except serializers.ValidationError as error:
            errors.update(error.detail)
        spec = None
        if "kind" not in errors:
            try:
                spec = get_kind(data["kind"]).validate(data.get("spec") or {})
            except SpecError as error:
                errors.update({field: [message] for field, message in error.errors.items()})
        if spec is not None and "resources" not in errors and not any(key.startswith("resources.") for key in errors):
            # What the normalized spec needs of the resources (a gang of at least N workers, say).
            kind_spec = get_kind(data["kind"])
            problems = kind_spec.resource_problems(spec, resources)
            errors.update({field: [message] for field, message in problems.items()})
            # An elastic job must be able to run at the size it may be shrunk to; a kind's default fills in.
            errors.update({field: [message] for field, message in floor_problems(kind_spec, spec, resources).items()})
            resources = with_kind_default(kind_spec, spec, resources)
        keep = None
        try:
            objective = get_kind(data["kind"]).objective(spec) if spec is not None else False
            keep = keep_clean(data.get("keep"), objective=objective)
        except KeepInvalid as error:
            errors.update({field: [message] for field, message in error.errors.items()})
        if errors:
            raise serializers.ValidationError(errors)
        return {**attrs, "resources": resources, "spec": spec, "keep": keep}

    def validate_kind(self, value):
        try:
            get_kind(value)
        except UnknownKind as error:
            raise serializers.ValidationError(f"unknown kind {value!r}; known kinds: {', '.join(error.known)}") from None
        return value

    def validate_code(self, value):
        if value is None:
            return None
        text = value.strip().lower().removeprefix("sha256:")
        if not 12 <= len(text) <= 64 or any(c not in "0123456789abcdef" for c in text):
            raise serializers.ValidationError("must be a code bundle's SHA-256 digest, or a prefix of 12+ hex digits "
                                              "(POST /api/v1/code/ returns it)")
        return text

    def validate_time_limit(self, value):
        if value is None:
            return 3600
        try:
            seconds = parse_duration(value)
        except ValueError as error:
            raise serializers.ValidationError(str(error)) from None
        if not 1 <= seconds <= settings.STRATA_MAX_TIME_LIMIT_SECONDS:
            raise serializers.ValidationError(f"must be between 1 s and {settings.STRATA_MAX_TIME_LIMIT_SECONDS} s")
        return int(seconds)

    def validate(self, attrs):
        attrs.setdefault("time_limit", 3600)
        attrs.setdefault("name", f"{attrs['kind']}-job")
        return attrs


class AllocationSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="device.node.name", read_only=True)
    device_index = serializers.IntegerField(source="device.index", read_only=True)
    device_kind = serializers.CharField(source="device.kind", read_only=True)

    class Meta:
        model = Allocation
        fields = ["rank", "node", "device_index", "device_kind", "share", "memory", "active", "nested"]
        read_only_fields = fields


class AttemptSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", default=None, read_only=True)
    allocations = AllocationSerializer(many=True, read_only=True)
    # Declared so the schema allows "" (read-only model fields lose allow_blank): blank until the attempt ends.
    outcome = serializers.ChoiceField(choices=Attempt.Outcome.choices, allow_blank=True, read_only=True,
                                      help_text="How the attempt ended; empty while it has not.")
    reports = serializers.SerializerMethodField(help_text=(
        "The generic report channel: each plugin's latest report about this attempt, {plugin: {time (unix s), "
        "payload, device (id or null)}}, as the plugin's report schema normalized it; {} when none."))
    measured_memory = serializers.IntegerField(read_only=True, allow_null=True, help_text=(
        "Device memory (bytes) a plugin last measured this attempt to use; null when never measured."))

    class Meta:
        model = Attempt
        fields = ["id", "number", "node", "gpu_share", "dispatched_at", "started_at", "ended_at", "outcome",
                  "exit_reason", "endpoint", "measured_memory", "reports", "allocations"]
        read_only_fields = fields

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "object", "properties": {
        "time": {"type": "number"}, "payload": {}, "device": {"type": "integer", "nullable": True}}}})
    def get_reports(self, attempt):
        return {plugin: {"time": entry.get("time"), "payload": entry.get("payload"), "device": entry.get("device")}
                for plugin, entry in (attempt.reports or {}).items() if isinstance(entry, dict)}


class JobListShareSerializer(serializers.ListSerializer):
    """Loads the shares of a whole page of jobs at once (a fixed number of queries, not one per job)."""

    def to_representation(self, data):
        from strata.jobs.selectors import job_shares

        jobs = list(data.all() if hasattr(data, "all") else data)
        self.context.setdefault("job_shares", {}).update(job_shares(jobs))
        return super().to_representation(jobs)


class JobSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    attempts = AttemptSerializer(many=True, read_only=True)
    share = serializers.SerializerMethodField(
        help_text="The job's share of a shared GPU (its latest attempt's fractional allocation: GPUs, memory, "
                  "device, its pool's sharing policy, the memory measured); null for whole-GPU jobs and jobs not "
                  "placed yet. What plugins measured about the attempt is in attempts[].reports.")
    endpoint = serializers.SerializerMethodField()
    parent = serializers.UUIDField(source="parent_id", read_only=True, allow_null=True,
                                   help_text="The job that submitted this one (child jobs), or null.")
    children = serializers.SerializerMethodField(help_text="Jobs this job submitted: id, name, kind, state.")
    nested = serializers.BooleanField(read_only=True, help_text=(
        "A child that runs inside its parent's own allocation (a sweep's trial): no quota of its own."))
    held = serializers.BooleanField(read_only=True, help_text="Held: queued but not placed until released.")
    code = serializers.SerializerMethodField(help_text="The code bundle the job runs: digest, size (archive), "
                                                       "expanded_size and file_count; null for built-in code.")
    keep = serializers.JSONField(read_only=True, help_text=KEEP_HELP)
    logs_trimmed = serializers.SerializerMethodField(help_text=(
        "Log lines not kept (strata.jobs.log_search): trimmed (removed by the retention policy, every line before "
        "trimmed_before), dropped (past the line cap, from dropped_after on) and a one-line notice; null if none."))
    eta = serializers.SerializerMethodField(help_text=(
        "A waiting job's start-time estimate (strata.scheduling.eta): start (median), low and high (the 80 % "
        "interval), in_seconds/low_seconds/high_seconds from computed_at, waits_for (reason, jobs), run_now (what "
        "would make it run now), runtime (its predicted run time); null when it does not wait or has none yet."))

    class Meta:
        model = Job
        fields = ["id", "name", "kind", "team", "owner", "state", "reason", "priority", "max_attempts", "failures",
                  "time_limit", "resources", "spec", "code", "keep", "created_at", "updated_at", "queued_at", "started_at",
                  "finished_at", "share", "endpoint", "parent", "children", "nested", "held", "attempts",
                  "logs_trimmed", "eta"]
        read_only_fields = fields
        list_serializer_class = JobListShareSerializer

    @extend_schema_field({"type": "object", "nullable": True})
    def get_eta(self, job):
        # Stored by the scheduler's foresight (strata.scheduling.eta, a higher layer); shown only while it waits.
        return job.eta if job.eta and job.state in (JobState.PENDING, JobState.QUEUED) else None

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "trimmed": {"type": "integer"}, "trimmed_before": {"type": "string", "format": "date-time", "nullable": True},
        "dropped": {"type": "integer"}, "dropped_after": {"type": "string", "format": "date-time", "nullable": True},
        "notice": {"type": "string"}}})
    def get_logs_trimmed(self, job):
        from strata.jobs.log_search import trimmed_notice

        return trimmed_notice(job)

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "digest": {"type": "string"}, "size": {"type": "integer"}, "expanded_size": {"type": "integer"},
        "file_count": {"type": "integer"}}})
    def get_code(self, job):
        from strata.jobs.selectors import code_summary

        return code_summary(job.code)

    @extend_schema_field({"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"}, "name": {"type": "string"}, "kind": {"type": "string"},
        "state": {"type": "string"}}}})
    def get_children(self, job):
        return [{"id": str(pk), "name": name, "kind": kind, "state": state} for pk, name, kind, state in
                job.children.order_by("created_at").values_list("id", "name", "kind", "state")[:1000]]

    @extend_schema_field({"type": "string", "nullable": True,
                          "description": "host:port of the job's endpoint while it runs (kinds that answer requests); null otherwise."})
    def get_endpoint(self, job):
        from strata.jobs.selectors import serving_endpoint

        return serving_endpoint(job)

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "gpus": {"type": "number"}, "gpu_memory": {"type": "integer"}, "device": {"type": "string"},
        "shared": {"type": "boolean"}, "policy": {"type": "string"},
        "measured_memory": {"type": "integer", "nullable": True}}})
    def get_share(self, job):
        from strata.jobs.selectors import job_shares

        shares = self.context.get("job_shares") if isinstance(self.context, dict) else None
        if shares is not None and job.pk in shares:
            return shares[job.pk]
        return job_shares([job])[job.pk]


class JobListSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        fields = [f for f in JobSerializer.Meta.fields if f not in ("attempts", "endpoint", "children")]
        read_only_fields = fields


class JobTokenSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = JobToken
        fields = ["id", "name", "prefix", "created_by", "created_at", "expires_at", "revoked_at", "active"]
        read_only_fields = fields


class JobTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    expires_in_s = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=60,
                                            max_value=366 * 86400,
                                            help_text="Seconds until it stops working (none: until revoked).")


class JobTokenCreatedSerializer(JobTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The raw token, shown this once.")

    class Meta(JobTokenSerializer.Meta):
        fields = [*JobTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class CredentialSerializer(serializers.Serializer):
    """A job credential (``components.runtime.shared.credentials``): a signed statement that its holder may act as
    ``subject`` in the job until ``expires``."""

    credential = serializers.CharField(help_text="base64url(claims JSON).base64url(Ed25519 signature)")
    public_key = serializers.CharField(help_text="The job's public key, hex of its 32 raw bytes: check with it.")
    expires = serializers.FloatField(help_text="Unix seconds.")
    issued = serializers.FloatField(help_text="Unix seconds.")


class CredentialRequestMixin(serializers.Serializer):
    subject = serializers.RegexField(SUBJECT_PATTERN, max_length=256, help_text=(
        "The identity the credential is for, e.g. rsa:<hash of a public key> or p2p:<peer id>: 1 to 256 characters "
        "of letters, digits and :._/+=-."))


class ParticipantSerializer(serializers.Serializer):
    """A participant of a job, as ``jobs.participants.participant_entry`` shows it."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    gpus = serializers.FloatField()
    state = serializers.ChoiceField(choices=Participant.State.choices, help_text=(
        "active, left, stopped (evicted, its token revoked or expired, or the job ended) or lost (missed its "
        "lease)."))
    reason = serializers.CharField(allow_blank=True)
    info = serializers.DictField(help_text="What the participant says about itself (an address, a version...).")
    metrics = serializers.DictField(child=serializers.FloatField(), help_text="Its latest metrics.")
    joined_at = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)


class ParticipantJoinSerializer(serializers.Serializer):
    """The body of a join (documentation: ``jobs.participants.join_fields`` checks it)."""

    job = serializers.UUIDField(help_text="The running job to join.")
    name = serializers.CharField(max_length=100, required=False, allow_blank=True,
                                 help_text="A name for this participant (default: p-<8 hex digits>).")
    gpus = serializers.FloatField(min_value=0, max_value=64, required=False, default=0.0,
                                  help_text="The GPUs it brings: they count against the team's max_gpus.")
    info = serializers.DictField(required=False, help_text="What it says about itself (at most 8 KiB of JSON).")


class JoinedJobSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    spec = serializers.DictField()
    state = serializers.CharField()


class ParticipantJoinedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    gpus = serializers.FloatField()
    secret = serializers.CharField(help_text=(
        "The participant's secret, shown this once: send it as 'Authorization: Bearer <secret>' on its heartbeats "
        "and its leave."))
    job = JoinedJobSerializer()
    payload = serializers.DictField(help_text="What the job's kind hands a joining participant "
                                              "(KindSpec.participant_payload).")
    public_key = serializers.CharField(help_text="The job's credential key (hex): check the job's credentials.")
    heartbeat_s = serializers.FloatField(help_text="Heartbeat this often.")
    lease_s = serializers.FloatField(help_text="A participant not heard from for this long is lost.")


class ParticipantHeartbeatSerializer(serializers.Serializer):
    """The body of a heartbeat (documentation: ``jobs.participants.heartbeat_fields`` checks it)."""

    metrics = serializers.DictField(child=serializers.FloatField(), required=False, help_text=(
        "Its latest metrics (at most 64, names of 1 to 64 characters, finite numbers); they replace the stored "
        "ones."))
    info = serializers.DictField(required=False, help_text="Replaces what it said about itself (at most 8 KiB).")
    subject = serializers.RegexField(SUBJECT_PATTERN, max_length=256, required=False, help_text=(
        "Ask for a job credential for this identity (answered as credential while the answer is run)."))


class ParticipantHeartbeatAnswerSerializer(serializers.Serializer):
    state = serializers.CharField(help_text="run, or stop (then leave: the reason says why).")
    reason = serializers.CharField(allow_blank=True)
    credential = CredentialSerializer(required=False, help_text="For subject, when one was asked for.")


class ParticipantLeftSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["id", "time", "kind", "message", "data"]
        read_only_fields = fields


class LogLineSerializer(serializers.ModelSerializer):
    attempt = serializers.UUIDField(source="attempt_id", read_only=True)

    class Meta:
        model = LogLine
        fields = ["id", "time", "level", "message", "attempt", "rank"]
        read_only_fields = fields


class MetricPointSerializer(serializers.ModelSerializer):
    class Meta:
        model = MetricPoint
        fields = ["id", "name", "step", "value", "time"]
        read_only_fields = fields


class ArtifactSerializer(serializers.ModelSerializer):
    class Meta:
        model = Artifact
        fields = ["id", "name", "kind", "size", "sha256", "created_at"]
        read_only_fields = fields


class CodeBundleSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", default=None, read_only=True)
    jobs = serializers.SerializerMethodField(help_text="How many jobs use it (it is kept while any exists).")

    class Meta:
        model = CodeBundle
        fields = ["digest", "team", "owner", "size", "expanded_size", "file_count", "created_at", "jobs"]
        read_only_fields = fields

    def get_jobs(self, bundle) -> int:
        return bundle.jobs.count()


class CodeBundleDetailSerializer(CodeBundleSerializer):
    class Meta(CodeBundleSerializer.Meta):
        fields = [*CodeBundleSerializer.Meta.fields, "files"]
        read_only_fields = fields


class DataSetSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", default=None, read_only=True)
    jobs = serializers.SerializerMethodField(help_text="How many unfinished jobs mount it (it is kept while any "
                                                       "does).")

    class Meta:
        model = DataSet
        fields = ["name", "team", "owner", "digest", "format", "size", "expanded_size", "file_count", "created_at",
                  "jobs"]
        read_only_fields = fields

    def get_jobs(self, data_set) -> int:
        return data_set.jobs.exclude(state__in=TERMINAL_STATES).count()


class DataSetDetailSerializer(DataSetSerializer):
    class Meta(DataSetSerializer.Meta):
        fields = [*DataSetSerializer.Meta.fields, "files"]
        read_only_fields = fields


class DataUploadCreateSerializer(serializers.Serializer):
    """``POST /api/v1/uploads/`` (checked by ``strata.jobs.data.upload_fields``; this types the schema)."""

    name = serializers.RegexField(r"^[a-z0-9][a-z0-9._-]{0,63}$", help_text="The data set's name in the team.")
    size = serializers.IntegerField(min_value=1, help_text="Bytes of the whole upload.")
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", help_text="SHA-256 of the whole upload (hex).")
    chunk_size = serializers.IntegerField(min_value=1024, help_text="Bytes per chunk (the last may be shorter).")
    format = serializers.ChoiceField(DataSet.Format.choices, default="archive",
                                     help_text="archive: a directory as a tar.gz; file: one file as it is.")
    file = serializers.CharField(required=False, help_text="With format file: the file's name.")
    team = serializers.CharField(required=False, help_text="The team (slug); default: the token's team.")


class DataUploadPartSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, help_text="The chunk's index, from 0.")
    md5 = serializers.CharField(help_text="The chunk's MD5, base64: it is sent with it as Content-MD5.")


class DataUploadPartsSerializer(serializers.Serializer):
    """``POST /api/v1/uploads/{id}/parts/`` (checked by ``strata.jobs.data.direct_parts``; this types the
    schema)."""

    parts = DataUploadPartSerializer(many=True, required=False, help_text="The chunks to sign (at most 1000).")


class DataUploadPartURLSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    length = serializers.IntegerField(help_text="The chunk's bytes: exactly these go to the URL.")
    url = serializers.URLField(help_text="A presigned PUT URL of the object store.")


class DataUploadSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    file = serializers.CharField(source="file_name", read_only=True)
    chunks = serializers.IntegerField(source="chunk_count", read_only=True, help_text="How many chunks in all.")
    received = serializers.SerializerMethodField(help_text="The indices of the chunks stored, sorted.")
    missing = serializers.SerializerMethodField(help_text="The indices of the chunks still to send, sorted.")
    direct = serializers.SerializerMethodField(
        help_text="Whether the chunks go straight to the object store: POST .../parts/ for a presigned URL per "
                  "chunk (else PUT each to .../chunks/{index}/).")
    expires_at = serializers.SerializerMethodField(
        help_text="When the upload expires, with its chunks, unless completed by then (STRATA_UPLOAD_EXPIRY_HOURS "
                  "after it started).")

    class Meta:
        model = DataUpload
        fields = ["id", "name", "team", "format", "file", "size", "sha256", "chunk_size", "chunks", "received",
                  "missing", "direct", "created_at", "updated_at", "expires_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.DateTimeField())
    def get_expires_at(self, upload) -> str:
        return serializers.DateTimeField().to_representation(upload_deadline(upload))

    def get_received(self, upload) -> list[int]:
        return sorted(int(index) for index in upload.received)

    def get_missing(self, upload) -> list[int]:
        return missing_chunks(upload)

    def get_direct(self, upload) -> bool:
        return bool(upload.store_upload)


class DataUploadPartsAnswerSerializer(serializers.Serializer):
    urls = DataUploadPartURLSerializer(many=True)
    expires_s = serializers.IntegerField(help_text="Seconds each URL stays valid (STRATA_PRESIGN_EXPIRY_S).")
    upload = DataUploadSerializer(help_text="The upload as the store now has it (its missing chunks).")
