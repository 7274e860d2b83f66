"""Time series of device utilization and memory, sampled from node heartbeats."""

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
        indexes = [models.Index(fields=["device", "time"])]
        ordering = ["time"]
