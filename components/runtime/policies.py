"""Scheduler seams: small pure policy objects plugins contribute through their manifest's ``hooks``.

A hook is a class (instantiated once by the registry, with no arguments) that subclasses one of the seams here.
The scheduler calls it with plain data (never database rows), inside its pass, and must get the same answer
for the same input: no I/O, no clock, no randomness, no mutation of what it is given.

Seams:

- :class:`QueueOrder`: the order of one team's queued jobs of the hook's kinds, among jobs of equal priority.
  The core's order (priority, then FIFO by queue time, teams taking turns by weighted fair share) stays as it
  is for everything else: a hook only permutes the positions its own kinds' jobs already hold.

Light: standard library only (the control plane imports hooks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class QueuedJob:
    """What a queue-order hook sees of a queued job."""

    id: str
    team_id: int
    kind: str
    priority: int
    queued_at: float  # unix seconds
    resources: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)


class Policy:
    """Base of every scheduler hook. ``kinds``: the job kinds the hook applies to (None: every kind)."""

    kinds: ClassVar[tuple[str, ...] | None] = None

    def applies(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


class QueueOrder(Policy):
    """Orders queued jobs of :attr:`kinds` among themselves (equal priority, one team): lower keys go first."""

    def key(self, job: QueuedJob) -> tuple[Any, ...] | float:
        """A sort key; the default keeps FIFO (the time the job was queued)."""
        return job.queued_at


def reorder(jobs: list[QueuedJob], hooks: list[QueueOrder]) -> list[QueuedJob]:
    """``jobs`` (one team's queue in the core's order) with each hook's kinds permuted by its key within each
    run of equal priority; every other job keeps its place. Pure: a new list, the input untouched."""
    ordered = list(jobs)
    for hook in hooks:
        start = 0
        while start < len(ordered):
            end = start
            while end < len(ordered) and ordered[end].priority == ordered[start].priority:
                end += 1
            places = [index for index in range(start, end) if hook.applies(ordered[index].kind)]
            if len(places) > 1:
                chosen = sorted((ordered[index] for index in places), key=lambda job: (hook.key(job), job.queued_at))
                for index, job in zip(places, chosen, strict=True):
                    ordered[index] = job
            start = end
    return ordered
