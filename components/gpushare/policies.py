"""Scheduling policies of the shared-device executor: which admitted job runs the next iteration.

Pure: a policy sees immutable :class:`JobView` snapshots and returns one of them. No torch, no clocks, so
they are unit-tested on hand-built cases and could be reused by a simulator or the control plane.

The executor asks at every iteration boundary (Salus schedules per iteration). A job preempted in the
middle of an iteration (at a stage boundary, SwitchFlow) is resumed before any other job of equal or lower
priority, whatever the policy: its activations occupy its lane until the iteration ends.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class JobView:
    """What a policy may look at about one runnable job.

    ``arrival`` is the submission order (smaller = earlier); ``attained`` the device seconds the job has
    received; ``virtual_start`` the fair-share clock when it was admitted (see :class:`Fair`); ``last_run``
    the executor tick of its latest iteration (-1 before the first); ``step_time`` the measured seconds of
    one iteration (None until measured); ``remaining_steps`` None when unknown.
    """

    job_id: str
    arrival: int
    priority: int = 0
    weight: float = 1.0
    remaining_steps: int | None = None
    step_time: float | None = None
    attained: float = 0.0
    virtual_start: float = 0.0
    last_run: int = -1


class Policy(abc.ABC):
    """Chooses the next job. Subclasses define :meth:`key`; the job with the smallest key runs."""

    name: ClassVar[str]

    @abc.abstractmethod
    def key(self, job: JobView, jobs: Sequence[JobView]) -> tuple:
        """Sort key of ``job`` among the candidates ``jobs``; the smallest runs next."""

    def pick(self, jobs: Sequence[JobView]) -> JobView | None:
        if not jobs:
            return None
        return min(jobs, key=lambda job: self.key(job, jobs))

    def order(self, jobs: Sequence[JobView]) -> list[JobView]:
        """All candidates in the order the policy prefers them."""
        return sorted(jobs, key=lambda job: self.key(job, jobs))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Fifo(Policy):
    """First come, first served: the earliest submitted job runs until it finishes (exclusive use)."""

    name: ClassVar[str] = "fifo"

    def key(self, job, jobs):
        return (job.arrival,)


class Pack(Policy):
    """Salus PACK: every admitted job makes progress, round-robin by least recently run.

    With memory admission packing as many jobs as fit, this maximizes the device's use by jobs that each
    leave it idle part of the time (waiting for input).
    """

    name: ClassVar[str] = "pack"

    def key(self, job, jobs):
        return (job.last_run, job.arrival)


class SRTF(Policy):
    """Shortest remaining time first: ``remaining_steps x step_time``; ties by arrival.

    A job not measured yet is costed at the mean step time of the measured candidates (1 s when none is
    measured, so that remaining steps alone decide); a job with unknown remaining steps goes last.
    """

    name: ClassVar[str] = "srtf"

    def key(self, job, jobs):
        known = [other.step_time for other in jobs if other.step_time is not None and other.step_time > 0]
        fallback = sum(known) / len(known) if known else 1.0
        return (remaining_time(job, fallback), job.arrival)


class Fair(Policy):
    """Weighted fair sharing: least ``virtual_start + attained / weight`` first (ties by arrival).

    ``virtual_start`` is the smallest normalized service of the jobs already running when this one was
    admitted (as in start-time fair queueing), so a newcomer shares from then on instead of monopolizing
    the device until it has caught up with jobs that ran for hours.
    """

    name: ClassVar[str] = "fair"

    def key(self, job, jobs):
        return (job.virtual_start + job.attained / max(job.weight, 1e-9), job.arrival)


class Priority(Policy):
    """Strict priority (higher first), first come first served within a priority."""

    name: ClassVar[str] = "priority"

    def key(self, job, jobs):
        return (-job.priority, job.arrival)


def remaining_time(job: JobView, fallback_step_time: float = 1.0) -> float:
    if job.remaining_steps is None:
        return math.inf
    step_time = job.step_time if job.step_time is not None and job.step_time > 0 else fallback_step_time
    return max(job.remaining_steps, 0) * step_time


POLICIES: dict[str, type[Policy]] = {policy.name: policy for policy in (Pack, SRTF, Fair, Priority, Fifo)}


def get_policy(policy: str | Policy) -> Policy:
    """A policy instance from its name (``pack``, ``srtf``, ``fair``, ``priority``, ``fifo``) or as given."""
    if isinstance(policy, Policy):
        return policy
    try:
        return POLICIES[str(policy).lower()]()
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}") from None
