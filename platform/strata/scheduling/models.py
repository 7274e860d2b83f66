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
