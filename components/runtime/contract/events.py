"""Lifecycle events plugins subscribe to (light: plain dataclasses, no ORM, JSON-able with ``as_dict``).

A plugin lists subscribers in its manifest (``subscribers=("pkg.module:on_event",)``); each is called with every
event, after the transaction that caused it committed (:mod:`strata.jobs.events` delivers them):

- :class:`JobTransitioned`: a job changed state (submitted, admitted, scheduled, started, finished, requeued...),
  including the scheduler's bulk moves (one event per job);
- :class:`AttemptEnded`: an attempt ended, with its outcome;
- :class:`MetricsReported`: a running attempt reported metric points (the last value of each name);
- :class:`QuotaReached`: a team's quota holds back jobs that were not waiting on it before (one event per team
  and admission round, naming the limit and the jobs that started waiting);
- :class:`NodeLost`: a node missed its lease and its attempts were ended (the jobs and teams it ran for).

The control plane's own apps subscribe too (``strata.jobs.events.subscribe``), e.g. its notifications.

Delivery is synchronous, in the process that committed, at most once: a subscriber that raises is logged and
the others still run; an event of a rolled-back transaction is never delivered. Subscribers must be quick
(they run inside a request or a scheduler pass): hand slow work to a task of your own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    name = "event"

    def as_dict(self) -> dict[str, Any]:
        return {"event": self.name, **asdict(self)}


@dataclass(frozen=True)
class JobTransitioned(Event):
    name = "job.transitioned"
    job_id: str
    team_id: int | None
    kind: str
    source: str | None  # None when the job was just created
    target: str
    reason: str = ""


@dataclass(frozen=True)
class AttemptEnded(Event):
    name = "attempt.ended"
    attempt_id: str
    job_id: str
    kind: str
    number: int
    outcome: str
    reason: str = ""
    node_id: str | None = None


@dataclass(frozen=True)
class MetricsReported(Event):
    name = "metrics.reported"
    job_id: str
    attempt_id: str
    kind: str
    last: dict[str, float] = field(default_factory=dict)  # name -> the newest value reported in this batch
    step: int = 0  # the highest step in this batch


@dataclass(frozen=True)
class QuotaReached(Event):
    name = "quota.reached"
    team_id: int
    limit: str  # the quota field that holds the jobs back: max_gpus, max_concurrent_jobs, gpu_hours...
    reason: str  # as the waiting jobs' reason says it
    job_ids: tuple[str, ...] = ()  # the jobs that started waiting on it in this round


@dataclass(frozen=True)
class NodeLost(Event):
    name = "node.lost"
    node_id: str
    node: str  # its name
    reason: str
    job_ids: tuple[str, ...] = ()  # the jobs whose attempts ran there
    team_ids: tuple[int, ...] = ()  # their teams
