"""The scheduler's own rows: named leases that make exactly one scheduler replica the leader."""

from __future__ import annotations

from django.db import models


class Lease(models.Model):
    """A named lease held by one process at a time (``scheduling.leader``): ``holder`` is
    ``host:pid:random``, valid until ``expires_at``; ``epoch`` grows by one each time the holder changes, so a
    leader can tell that it lost the lease in between (and a metric can count hand-overs)."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=255, blank=True, default="")
    epoch = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name}: {self.holder or '(free)'} (epoch {self.epoch}, until {self.expires_at:%H:%M:%S})"


class LostWork(models.Model):
    """The work one attempt lost when it had to stop (``strata.scheduling.lost_work``): preempted by a
    higher-priority job (or held), shrunk (restarted smaller instead of preempted), or lost with its node. One row
    per such attempt, recorded when it ends; the team's usage report sums them (``strata.quotas.usage``).

    ``steps`` is the attempt's last reported metric step minus the step reached at the job's latest checkpoint
    (everything the attempt did when there was none; null when it reported no steps); ``seconds`` the time from
    that checkpoint (or the attempt's start) to its end (0 when the checkpoint came at or after the last step);
    ``gpu_seconds`` that times the attempt's GPU share."""

    class Cause(models.TextChoices):
        PREEMPTED = "preempted"
        SHRUNK = "shrunk"
        NODE_LOST = "node_lost"

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="lost_work")
    attempt = models.OneToOneField("jobs.Attempt", on_delete=models.CASCADE, related_name="lost_work")
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="lost_work")
    cause = models.CharField(max_length=16, choices=Cause.choices)
    time = models.DateTimeField(db_index=True, help_text="When the attempt ended.")
    steps = models.BigIntegerField(null=True, blank=True, help_text="Steps lost; null when the job reports none.")
    seconds = models.FloatField(default=0.0, help_text="Seconds of work lost (since the checkpoint or the start).")
    gpu_seconds = models.FloatField(default=0.0, help_text="seconds times the attempt's GPU share.")
    checkpoint = models.BooleanField(default=False, help_text="Whether the job had a checkpoint to resume from.")
    checkpoint_step = models.BigIntegerField(null=True, blank=True, help_text="The step reached at that checkpoint.")

    class Meta:
        indexes = [models.Index(fields=["team", "time"])]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} {self.cause}: {self.steps} steps, {self.gpu_seconds:.0f} GPU-s lost"
