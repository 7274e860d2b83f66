"""The plugin's scheduler hook (light: the scheduler imports it): smaller sieves first.

Among one team's queued ``primes`` jobs of equal priority, the one with the smallest ``limit`` goes first
(shortest job first, which lowers the mean completion time of a batch of sieves); ties keep FIFO. Jobs of other
kinds keep their places.
"""

from __future__ import annotations

from typing import ClassVar

from components.runtime.contract.policies import QueuedJob, QueueOrder


class SmallestLimitFirst(QueueOrder):
    kinds: ClassVar[tuple[str, ...]] = ("primes",)

    def key(self, job: QueuedJob) -> tuple[int, float]:
        return int(job.spec.get("limit") or 0), job.queued_at
