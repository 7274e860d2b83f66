"""Per-team limits (a null limit means unlimited) and the team's granted data roots."""

from __future__ import annotations

from django.db import models

from strata.accounts.models import Team


class Quota(models.Model):
    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    max_gpus = models.FloatField(null=True, blank=True, help_text="GPUs held at once (fractional).")
    max_gpu_memory = models.BigIntegerField(null=True, blank=True, help_text="GPU memory held at once, bytes.")
    max_cpus = models.FloatField(null=True, blank=True, help_text="CPUs reserved at once (fractional).")
    max_memory = models.BigIntegerField(null=True, blank=True, help_text="Host memory reserved at once, bytes.")
    max_concurrent_jobs = models.PositiveIntegerField(null=True, blank=True)
    gpu_hours = models.FloatField(null=True, blank=True, help_text="GPU-hours per rolling window.")
    window_hours = models.FloatField(default=168.0, help_text="Length of the rolling GPU-hours window.")
    budget_gpu_hours = models.FloatField(null=True, blank=True, help_text=(
        "GPU-hours (allocated) the team may spend per budget period; forecast, never enforced (strata.quotas.usage)."))
    budget_period_days = models.PositiveIntegerField(null=True, blank=True, help_text=(
        "Length of the budget period in days, counted from 1970-01-01 UTC; null: the calendar month (UTC)."))
    priority = models.IntegerField(default=0, help_text="Added to the priority of the team's jobs.")
    weight = models.FloatField(default=1.0, help_text="Fair-share weight across teams.")
    max_storage_bytes = models.BigIntegerField(null=True, blank=True, help_text=(
        "Bytes the team may keep stored: artifacts, checkpoints, code bundles, data sets and unfinished uploads."))
    keep = models.JSONField(null=True, blank=True, help_text=(
        "The team's retention policy (strata.jobs.keep), over the cluster's defaults and under a job's own."))
    data_roots = models.JSONField(default=list, blank=True,
                                  help_text="Directories on the nodes under which the team may register data "
                                            "(absolute, normalized paths; strata.quotas.roots).")

    def __str__(self) -> str:
        return f"quota of {self.team}"
