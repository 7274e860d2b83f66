"""Time series of device utilization and memory: raw samples from node heartbeats and their rollups.

Three tiers, so a chart over any range reads a bounded number of rows:

* ``DeviceSample``: one row per device per heartbeat (~3 s), kept ``STRATA_TELEMETRY_RAW_DAYS`` (2 days);
* ``DeviceRollup`` at ``resolution=60``: one row per device per minute, kept 8 days;
* ``DeviceRollup`` at ``resolution=3600``: one row per device per hour, kept
  ``STRATA_TELEMETRY_RETENTION_DAYS`` (35 days).

``ReportSeries`` rows are the plugins' time series from the generic report channel (the ``series`` part of a
node report, see ``components.runtime.contract.plugins.ReportParts``: who ran when on a device, for example); they are
kept as long as raw samples.

``RollupWatermark`` records, per resolution, up to where rollups are complete (see
:func:`strata.telemetry.services.rollups_update`).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from strata.cluster.models import Device


class DeviceSample(models.Model):
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="samples")
    time = models.DateTimeField(default=timezone.now)
    utilization = models.FloatField()
    memory_used = models.BigIntegerField()

    class Meta:
        # (device, time) serves one device's series; (time) serves the all-device rollup and pruning scans.
        indexes = [models.Index(fields=["device", "time"]), models.Index(fields=["time"], name="telemetry_sample_time")]
        ordering = ["time"]


class DeviceRollup(models.Model):
    """One device over one time bucket ``[time, time + resolution)``: mean and peak utilization, mean memory
    used and how many raw samples the bucket summarizes (the weight when buckets are combined further)."""

    class Resolution(models.IntegerChoices):
        MINUTE = 60
        HOUR = 3600

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="rollups")
    resolution = models.PositiveIntegerField(choices=Resolution.choices)
    time = models.DateTimeField(help_text="Start of the bucket (UTC, aligned to the resolution).")
    utilization_mean = models.FloatField()
    utilization_max = models.FloatField()
    memory_used_mean = models.BigIntegerField()
    samples = models.PositiveIntegerField()

    class Meta:
        ordering = ["resolution", "time"]
        constraints = [models.UniqueConstraint(fields=["device", "resolution", "time"], name="one_rollup_per_bucket")]
        indexes = [models.Index(fields=["resolution", "time"], name="telemetry_rollup_res_time")]

    def __str__(self) -> str:
        return f"{self.device_id}@{self.resolution}s {self.time:%Y-%m-%d %H:%M}"


class RollupWatermark(models.Model):
    """Rollups of ``resolution`` are complete for every bucket that starts before ``until``."""

    resolution = models.PositiveIntegerField(primary_key=True, choices=DeviceRollup.Resolution.choices)
    until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.resolution}s rollups complete until {self.until:%Y-%m-%d %H:%M}"


class ReportSeries(models.Model):
    """One row ``[start, end)`` of a plugin's time series, about a device and/or an attempt of the node that
    reported it, with the plugin's own ``data``."""

    plugin = models.CharField(max_length=40)
    device = models.ForeignKey(Device, on_delete=models.CASCADE, null=True, blank=True, related_name="report_series")
    # The jobs app's models by name ("app.Model"), not by import: the cluster's heartbeat stores these rows, and
    # the cluster layer may not import the jobs layer (pyproject.toml, the layers contract).
    attempt = models.ForeignKey("jobs.Attempt", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="report_series")
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, null=True, blank=True, related_name="report_series")
    start = models.DateTimeField()
    end = models.DateTimeField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["start"]
        indexes = [models.Index(fields=["plugin", "start"], name="telemetry_series_plugin_start"),
                   models.Index(fields=["plugin", "device", "start"], name="telemetry_series_device_start"),
                   models.Index(fields=["plugin", "job", "start"], name="telemetry_series_job_start"),
                   models.Index(fields=["start"], name="telemetry_series_start")]

    def __str__(self) -> str:
        return f"{self.plugin} {self.device_id}/{self.attempt_id} {self.start:%H:%M:%S}"
