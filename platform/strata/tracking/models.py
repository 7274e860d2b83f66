"""A team's MLflow tracking server, and the mirror of each of its jobs (an MLflow run)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from strata.accounts.models import Team
from strata.jobs.models import Job


class TrackingServer(models.Model):
    """Where a team's jobs are mirrored: an MLflow tracking server (its REST API), an experiment on it, and an
    optional bearer token (encrypted at rest like team secrets: strata.accounts.team_secrets). The mirroring's
    health is kept here too: the last error, how many mirror rounds failed in a row, when the next may run."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="tracking_server")
    url = models.CharField(max_length=500)
    experiment = models.CharField(max_length=250, help_text="The MLflow experiment's name.")
    experiment_id = models.CharField(max_length=64, blank=True, help_text="Found or created on the server.")
    token_ciphertext = models.TextField(blank=True, help_text="The bearer token, a Fernet token; empty: none.")
    configured_at = models.DateTimeField(default=timezone.now,
                                         help_text="Jobs that ended before this are not mirrored.")
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    error = models.CharField(max_length=1000, blank=True, help_text="The last mirror round's error; empty: ok.")
    error_at = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0, help_text="Mirror rounds failed in a row.")
    retry_at = models.DateTimeField(null=True, blank=True, help_text="No mirror round before this (backoff).")
    synced_at = models.DateTimeField(null=True, blank=True, help_text="The last mirror round that succeeded.")
    busy_until = models.DateTimeField(null=True, blank=True,
                                      help_text="A worker runs the team's round until then (or until it ends).")

    def __str__(self) -> str:
        return f"{self.team.slug}: {self.url} ({self.experiment})"


class JobMirror(models.Model):
    """One job's MLflow run: created when the job starts, fed its metric points while it runs (``last_metric``:
    the id of the newest MetricPoint sent), ended with its status and artifacts."""

    class State(models.TextChoices):
        ACTIVE = "active"  # the run exists; metrics are being sent
        DONE = "done"  # the run is ended: final metrics, tags, status and artifacts sent

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="tracking_mirror")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    run_id = models.CharField(max_length=64)
    experiment_id = models.CharField(max_length=64)
    artifact_uri = models.CharField(max_length=1000, blank=True)
    last_metric = models.BigIntegerField(default=0, help_text="The id of the newest MetricPoint sent.")
    state = models.CharField(max_length=8, choices=State.choices, default=State.ACTIVE, db_index=True)
    artifacts = models.JSONField(default=dict, blank=True,
                                 help_text="{artifact id: 'uploaded' | why it was skipped}.")
    error = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["team", "state"], name="tracking_mirror_team_state")]

    def __str__(self) -> str:
        return f"job {self.job_id} -> run {self.run_id} ({self.state})"
