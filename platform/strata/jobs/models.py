"""Jobs, their attempts, allocations, events, logs, metrics and artifacts."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from strata.accounts.models import Team
from strata.cluster.models import Device, Node


class JobState(models.TextChoices):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# States that hold (or are about to hold) quota: admitted and not finished.
ADMITTED_STATES = frozenset({JobState.QUEUED, JobState.SCHEDULED, JobState.RUNNING, JobState.PREEMPTED})


class StoredFiles(models.Model):
    """Files a team uploaded, kept in the artifact storage under ``storage_key`` (abstract: code bundles and
    data sets)."""

    digest = models.CharField(max_length=64)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    expanded_size = models.BigIntegerField(help_text="Bytes of its files, unpacked.")
    file_count = models.PositiveIntegerField()
    files = models.JSONField(default=list, help_text="[{path, size}] sorted by path.")
    storage_key = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class CodeBundle(StoredFiles):
    """A team's project directory as one content-addressed archive (``components.runtime.shared.bundles``): the SHA-256
    of its canonical bytes names it, so a team's identical uploads are stored once. Kept while a job uses it
    (``Job.code`` protects it)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="code_bundles")
    size = models.BigIntegerField(help_text="Bytes of the archive (gzip'd tar).")

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["team", "digest"], name="one_code_bundle_per_digest")]

    def __str__(self) -> str:
        return f"code {self.digest[:12]} of {self.team_id}"


class DataSet(StoredFiles):
    """A team's uploaded data (one file, or a directory as a canonical gzip'd tar made by
    ``components.runtime.shared.bundles``), named uniquely in the team and mounted read-only into jobs
    (``spec.data.mount``). Its SHA-256 (of the stored bytes) is what a job's resolved spec names."""

    class Format(models.TextChoices):
        ARCHIVE = "archive"  # a directory, as a gzip'd tar
        FILE = "file"  # one file, stored as it is

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="data_sets")
    name = models.CharField(max_length=64)
    format = models.CharField(max_length=16, choices=Format.choices)
    size = models.BigIntegerField(help_text="Bytes stored (the archive, or the file).")

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_data_set_per_name")]

    def __str__(self) -> str:
        return f"data {self.name} ({self.digest[:12]}) of {self.team_id}"


class DataUpload(models.Model):
    """A chunked, resumable upload of a :class:`DataSet` in progress: chunks arrive in any order, each checked
    against its SHA-256, and are stored until ``complete`` assembles and verifies the whole."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="data_uploads")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=64)
    format = models.CharField(max_length=16, choices=DataSet.Format.choices)
    file_name = models.CharField(max_length=255, blank=True, help_text="The file's name (format file).")
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    chunk_size = models.BigIntegerField()
    received = models.JSONField(default=dict, help_text="{chunk index: its sha256}, of the chunks stored.")
    # A direct upload's multipart upload in the object store (strata.jobs.data: chunk n is part n + 1 of the data
    # set's own key); empty where the chunks go through the control plane.
    store_upload = models.CharField(max_length=1024, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    @property
    def chunk_count(self) -> int:
        return max(1, -(-self.size // self.chunk_size))

    def __str__(self) -> str:
        return f"upload {self.pk} of {self.name}"


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="jobs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    kind = models.CharField(max_length=64)
    name = models.CharField(max_length=200)
    spec = models.JSONField(default=dict)
    # The team's code bundle the job runs (a project submitted with --code), or null for built-in code.
    code = models.ForeignKey(CodeBundle, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    # The team's data sets the job mounts (spec.data.mount, resolved at submit): one is not deleted while an
    # unfinished job mounts it.
    data_sets = models.ManyToManyField(DataSet, blank=True, related_name="jobs")
    # Normalized: {"gpus": float per worker, "gpu_memory": bytes per worker or null, "workers": int}, plus "cpus" and
    # "memory" (per worker, reserved on the node) when the job reserves CPUs (a gpus: 0 job always does)
    resources = models.JSONField(default=dict)
    priority = models.IntegerField(default=0)
    # Child jobs: a running job may submit jobs of its own team (a sweep's trials, ranks); cancelling it cancels them.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    # A nested child runs inside its parent's allocation (a sweep's trials within the sweep's GPUs): admitted
    # without the team's quota (the parent holds it) and placed only on the devices its parent's attempt holds.
    nested = models.BooleanField(default=False, db_default=False)
    # A held job stays where it is in the queue but is never placed until released (a running job that is held
    # is preempted first, with a checkpoint). Its parent holds and releases a trial between rungs.
    held = models.BooleanField(default=False, db_default=False)
    # The job's retention policy (strata.jobs.keep: checkpoints, artifacts_days), over its team's and the cluster's;
    # a child job without one follows its parent's. Null: none of its own.
    keep = models.JSONField(null=True, blank=True)
    max_attempts = models.PositiveIntegerField(default=3)
    time_limit = models.PositiveIntegerField(help_text="Seconds an attempt may run.", default=3600)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING, db_index=True)
    reason = models.CharField(max_length=500, blank=True)
    failures = models.PositiveIntegerField(default=0, help_text="Attempts that failed (preemption and node loss excluded).")
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_digest = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Log lines not kept (strata.jobs.log_search): past STRATA_MAX_LOG_LINES_PER_JOB (never stored, from the
    # first one's time on) and removed by the retention collector (every line before log_trimmed_before).
    log_lines_dropped = models.BigIntegerField(default=0, db_default=0)
    log_dropped_after = models.DateTimeField(null=True, blank=True)
    log_lines_trimmed = models.BigIntegerField(default=0, db_default=0)
    log_trimmed_before = models.DateTimeField(null=True, blank=True)
    # Foresight (strata.scheduling.eta): a waiting job's latest start-time estimate (expected start, 80 % interval,
    # what it waits for, what would make it run now) and when it was computed; the first estimate it got, kept
    # beside started_at for calibration.
    eta = models.JSONField(null=True, blank=True)
    eta_at = models.DateTimeField(null=True, blank=True)
    eta_first = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="one_job_per_idempotency_key",
            )
        ]
        indexes = [models.Index(fields=["team", "state"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def gpus(self) -> float:
        return float(self.resources.get("gpus", 0)) * int(self.resources.get("workers", 1))

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Attempt(models.Model):
    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        PREEMPTED = "preempted"
        NODE_LOST = "node_lost"
        TIME_LIMIT = "time_limit"
        SERVICE_LOST = "service_lost"  # the node service hosting it died (protocol.SERVICE_LOST): requeued
        USER_ERROR = "user_error"  # the job's own deterministic error (protocol.USER_ERROR): failed, not retried

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    node = models.ForeignKey(Node, null=True, on_delete=models.SET_NULL, related_name="attempts")
    node_session = models.UUIDField(null=True)
    fencing_token = models.CharField(max_length=64)
    gpu_share = models.FloatField(default=0.0, help_text="GPUs held by this attempt, summed over its devices.")
    created_at = models.DateTimeField(default=timezone.now)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True, help_text="Last time the dispatch was sent.")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    exit_reason = models.CharField(max_length=500, blank=True)
    # The generic report channel: each plugin's latest report about this attempt, {plugin: {"time": unix s,
    # "payload": ...}} plus, when it came with a node report, "node" and "device" (ids; device may be null).
    # From attempt reports (ReportSchema.attempt) and from the attempts' parts of node reports
    # (ReportSchema.parts); kept after the attempt ends. Null when no plugin reported about it (the scheduler
    # writes attempts with raw multi-row inserts, so new columns are nullable).
    reports = models.JSONField(null=True, blank=True)
    # The device memory (bytes) a plugin last measured this attempt to use (ReportParts.attempts' "memory"):
    # the scheduler reserves it for the job's next attempt. Null when never measured.
    measured_memory = models.BigIntegerField(null=True, blank=True)
    # Where the attempt serves requests ("host:port"), for kinds that answer requests; null otherwise. Nullable
    # for the same reason as ``reports``.
    endpoint = models.CharField(max_length=255, null=True, blank=True)
    # Where the ranks of a multi-worker attempt meet ("host:port" of rank 0's store): the port rank 0 published
    # on the address its node registered. Null until published (and for the same reason as ``reports``).
    rendezvous = models.CharField(max_length=300, null=True, blank=True)

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="one_attempt_number_per_job")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.job_id}"

    @property
    def active(self) -> bool:
        return self.ended_at is None

    def billed_seconds(self, now=None) -> float:
        """GPU-seconds: time held from dispatch to end, times the share held."""
        if self.dispatched_at is None:
            return 0.0
        end = self.ended_at or now or timezone.now()
        return max(0.0, (end - self.dispatched_at).total_seconds()) * self.gpu_share


class Allocation(models.Model):
    """A share of one device held by one worker of an attempt, from dispatch until the attempt ends."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="allocations")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="allocations")
    rank = models.PositiveIntegerField(default=0)
    share = models.FloatField()
    memory = models.BigIntegerField()
    active = models.BooleanField(default=True, db_index=True)
    # Carved out of the parent's allocation on the same device (a nested child's): the cluster's free capacity
    # does not change, so capacity counts skip it.
    nested = models.BooleanField(default=False, db_default=False)
    # Since when the device's node has not listed the (started) attempt among those it runs, in its heartbeats;
    # null while it does. After a node lease of that, the node no longer runs it (its worker died and forgot it,
    # say): cluster.services.node_heartbeat ends it as for a lost node.
    unreported_since = models.DateTimeField(null=True, blank=True)
    # When the device's node claimed the attempt (null until then): each node claims its part of an attempt once;
    # a second claim (a duplicate or republished dispatch) is refused, so an attempt never runs twice on a node.
    claimed_at = models.DateTimeField(null=True, blank=True)


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.CASCADE)
    time = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=32)  # "state", "scheduling", "attempt", ...
    message = models.CharField(max_length=1000)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]


class LogLine(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_lines")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.CASCADE)
    time = models.DateTimeField(default=timezone.now)
    level = models.CharField(max_length=16, default="info")
    message = models.TextField()
    # The worker rank that wrote the line (its "[rank N] " prefix, strata.jobs.log_search.rank_of); None: the
    # node agent or the control plane. Searched with full-text and grep indexes (migration 0019_log_search; on
    # PostgreSQL a generated column message_tsv depends on message: altering message's type must drop it first).
    rank = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "time"], name="jobs_logline_job_time")]


class MetricPoint(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_points")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    step = models.BigIntegerField()
    value = models.FloatField()
    time = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "name", "step"])]


class Artifact(models.Model):
    class Kind(models.TextChoices):
        ARTIFACT = "artifact"
        CHECKPOINT = "checkpoint"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.SET_NULL)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ARTIFACT)
    name = models.CharField(max_length=255)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["job", "kind", "name"], name="one_artifact_per_name")]


class JobToken(models.Model):
    """A job's access token: what callers of the job's own services (an RPC endpoint it runs, say) present.

    Only the SHA-256 digest is stored; the raw value is shown once, at creation. A token works while it is
    neither revoked nor expired; the job's running attempts fetch the digests of the working ones
    (``GET /node/attempts/{id}/tokens/``), so a revoked token stops working within their refresh interval.
    Only kinds whose ``KindSpec.accepts_tokens`` is true have tokens.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="job_tokens")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())


class PluginRecord(models.Model):
    """One named record of a plugin's collection (``components.runtime.contract.collections``), owned by a team: e.g. a
    dataset registered once and named by jobs. ``body`` is what the collection's ``validate`` returned."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    collection = models.CharField(max_length=40)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="plugin_records")
    name = models.CharField(max_length=64)
    body = models.JSONField(default=dict)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="plugin_records")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["collection", "name"]
        constraints = [models.UniqueConstraint(fields=["collection", "team", "name"],
                                               name="plugin_record_unique_name")]


class Participant(models.Model):
    """A machine outside the cluster that joined a running job (a volunteer's peer), for kinds whose
    ``KindSpec.accepts_participants`` is true.

    It joins with one of the job's access tokens and then authenticates with a secret of its own (256 random bits;
    only the SHA-256 digest is stored). It stays ``active`` while it heartbeats within the lease
    (``STRATA_PARTICIPANT_LEASE_S``): an active participant counts its ``gpus`` against the team's quota and is
    billed for them. It ends ``left`` (it said so), ``stopped`` (evicted, its token revoked or expired, or the job
    ended) or ``lost`` (its lease expired).
    """

    class State(models.TextChoices):
        ACTIVE = "active"
        LEFT = "left"
        STOPPED = "stopped"
        LOST = "lost"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="participants")
    token = models.ForeignKey(JobToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="participants")
    name = models.CharField(max_length=100)
    gpus = models.FloatField(default=0.0)
    info = models.JSONField(default=dict, blank=True)  # what the participant says about itself (an address...)
    metrics = models.JSONField(default=dict, blank=True)  # its latest numeric metrics, {name: value}
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE, db_index=True)
    reason = models.CharField(max_length=500, blank=True)
    secret_digest = models.CharField(max_length=64, unique=True)
    joined_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["joined_at", "id"]
        indexes = [models.Index(fields=["job", "state"])]

    def __str__(self) -> str:
        return f"participant {self.name} of {self.job_id}"
