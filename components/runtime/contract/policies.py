"""Scheduler seams: small pure policy objects plugins contribute through their manifest's ``hooks``.

A hook is a class (instantiated once by the registry, with no arguments) that subclasses one of the seams here.
The scheduler calls it with plain data (never database rows), inside its pass, and must get the same answer
for the same input: no I/O, no clock, no randomness, no mutation of what it is given.

Seams, in the order a pass consults them:

- :class:`ResourceEstimate`: what a queued job of the hook's kinds really reserves (its requested resources,
  adjusted from what its earlier attempts, or recent jobs of the same kind and spec, measured), with a note
  the job's events and waiting reason show. Hooks chain: each sees the resources the previous one returned.
- :class:`QueueOrder`: the order of one team's queued jobs of the hook's kinds, among jobs of equal priority.
  The core's order (priority, then FIFO by queue time, teams taking turns by weighted fair share) stays as it
  is for everything else: a hook only permutes the positions its own kinds' jobs already hold.
- :class:`PlacementScore`: where a job of the hook's kinds goes among the places that fit it (lower scores
  win; ties keep the core's best fit). A hook sees one place at a time (``score``) or all the places one worker
  could take at once (``scores``). Without a hook the core places best-fit, unchanged.
- :class:`PreemptionCost`: what preempting a running attempt of the hook's kinds costs (None: never preempt
  it). The core frees room for a higher-priority job on the node where the victims cost least in all.
- :class:`FailurePolicy`: what happens to an attempt of the hook's kinds whose node is lost: requeue the job
  (the default), fail it, or carry on without the node (:class:`NodeLoss`).

Where several hooks apply to one kind, the registry's order (built-ins first, then outside plugins by name)
decides: estimates chain, queue orders apply in turn, placement scores and preemption costs add up, and the
first failure policy answers.

Light: standard library only (the control plane imports hooks).
"""

from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

log = logging.getLogger(__name__)


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


class HookFailed(Exception):
    """A hook raised; the pass goes on without that hook's opinion (logged once per call)."""


def ask(hook: Policy, method: str, *args: Any) -> Any:
    """``hook.method(*args)``; a hook that raises costs only its own opinion: logged, then :class:`HookFailed`.
    One plugin's bug must never stop the scheduler for everyone."""
    try:
        return getattr(hook, method)(*args)
    except Exception as error:
        log.warning("scheduler hook %s.%s raised %r; ignoring its opinion", type(hook).__name__, method, error)
        raise HookFailed(type(hook).__name__) from error


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
                try:
                    keys = {ordered[index].id: ask(hook, "key", ordered[index]) for index in places}
                    chosen = sorted((ordered[index] for index in places), key=lambda job: (keys[job.id], job.queued_at))
                except (HookFailed, TypeError) as error:  # TypeError: keys that cannot be compared
                    log.warning("queue order of %s ignored: %r", type(hook).__name__, error)
                    chosen = [ordered[index] for index in places]
                for index, job in zip(places, chosen, strict=True):
                    ordered[index] = job
            start = end
    return ordered


# -- resources ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Demand:
    """What a resource-estimate hook sees of a queued job. Memory in bytes; 0 means nothing was measured. No job
    id: the pass asks once for all the jobs that look the same (a sweep), so an answer depends on this alone.

    ``measured_memory``: the most device memory one of this job's earlier attempts measured (a plugin's report,
    ``Attempt.measured_memory``). ``profile_memory``: the most that one of the recent attempts of jobs with the
    same kind and identical spec measured, in any team. ``largest_device_memory``: the largest device in the
    cluster (an estimate should never make a job unplaceable on it)."""

    kind: str
    resources: dict[str, Any]
    measured_memory: int = 0
    profile_memory: int = 0
    largest_device_memory: int = 0


@dataclass(frozen=True, slots=True)
class Estimate:
    """A hook's answer: the resources the job reserves in this pass, and why (shown to the job's owner)."""

    resources: dict[str, Any]
    note: str = ""


class ResourceEstimate(Policy):
    """Adjusts what a queued job of :attr:`kinds` reserves. Return None to leave it as requested."""

    def estimate(self, demand: Demand) -> Estimate | None:
        return None


def estimate(demand: Demand, hooks: list[ResourceEstimate]) -> Estimate | None:
    """The chained answer of ``hooks`` for ``demand`` (None when none changed it); notes are joined."""
    resources, notes, changed = demand.resources, [], False
    for hook in hooks:
        if not hook.applies(demand.kind):
            continue
        try:
            answer = ask(hook, "estimate", demand if not changed else _with_resources(demand, resources))
        except HookFailed:
            continue
        if isinstance(answer, Estimate):
            resources, changed = dict(answer.resources), True
            if answer.note:
                notes.append(answer.note)
    return Estimate(resources, "; ".join(notes)) if changed else None


def _with_resources(demand: Demand, resources: dict[str, Any]) -> Demand:
    return Demand(demand.kind, resources, demand.measured_memory, demand.profile_memory,
                  demand.largest_device_memory)


# -- placement ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One place a worker (``rank``) of a job fits: a node and the devices it would take there.

    ``free_share``/``free_memory``: what the (first) device has free before this worker takes its part;
    ``share``/``memory``: what the worker would take of each device."""

    rank: int
    node_id: str
    node: str
    labels: dict[str, Any]
    devices: tuple[int, ...]  # device indexes on the node
    share: float
    memory: int
    free_share: float
    free_memory: int
    memory_total: int
    # The node's latest plugin reports, ``{plugin: payload}`` as its ReportSchema stored them (what a node
    # service says about the node: e.g. which prepared data a node-local cache holds).
    reports: dict[str, Any] = field(default_factory=dict)


class PlacementScore(Policy):
    """Scores the places a job of :attr:`kinds` fits: the lowest total score over the hooks wins.

    A hook scores one place at a time with :meth:`score`, or overrides :meth:`scores` to see all the places one
    worker could take at once (choosing a group of nodes for a whole gang, say); the scheduler calls
    :meth:`scores`, whose default maps :meth:`score` over the candidates.

    A hook whose opinion rests on one plugin's node reports names that plugin in :attr:`reads`: in a pass where
    no node carries such a report the hook has nothing to go on, and the pass does not ask it (nor build the
    candidates for it)."""

    reads: ClassVar[str | None] = None  # the plugin whose node reports the scores depend on, if only those

    def wants(self, job: QueuedJob) -> bool:
        """Whether the hook has an opinion about this job at all (its kind already applies). False spares the
        pass building the job's candidates: a hook of every kind (``kinds = None``) that cares only about jobs
        whose spec names something should say so here. Must be cheap; one that raises counts as True."""
        return True

    def score(self, job: QueuedJob, candidate: Candidate) -> float:
        return 0.0

    def scores(self, job: QueuedJob, candidates: list[Candidate]) -> list[float]:
        """One score per candidate, in their order (lower is better)."""
        return [self.score(job, candidate) for candidate in candidates]


def wanting(hook: PlacementScore, job: QueuedJob) -> bool:
    """``hook.wants(job)``, True when it raises or answers something other than a bool (an opinion is never
    lost to a broken ``wants``)."""
    try:
        answer = ask(hook, "wants", job)
    except HookFailed:
        return True
    return answer if isinstance(answer, bool) else True


def best(job: QueuedJob, candidates: list[Candidate], hooks: list[PlacementScore]) -> int | None:
    """The index in ``candidates`` (the core's best-fit order) with the lowest total score; the earliest among
    equals, so that without an opinion the core's choice stands. None when there is no candidate.

    Each hook answers for all the candidates at once (:meth:`PlacementScore.scores`); a hook that raises, or
    answers something other than one number (not NaN) per candidate, costs only its own opinion."""
    applying = [hook for hook in hooks if hook.applies(job.kind) and wanting(hook, job)]
    if not candidates:
        return None
    if not applying:
        return 0
    totals = [0.0] * len(candidates)
    for hook in applying:
        try:
            answer = ask(hook, "scores", job, list(candidates))
        except HookFailed:
            continue
        try:
            mine = [float(score) for score in answer]
        except Exception as error:  # noqa: BLE001 - not numbers (or a generator that raised): no opinion
            log.warning("scheduler hook %s.scores answered %r; ignoring its opinion", type(hook).__name__, error)
            continue
        if len(mine) != len(candidates) or any(math.isnan(score) for score in mine):
            log.warning("scheduler hook %s.scores answered %d scores (NaN among them: %s) for %d candidates; "
                        "ignoring its opinion", type(hook).__name__, len(mine), any(map(math.isnan, mine)),
                        len(candidates))
            continue
        totals = [total + score for total, score in zip(totals, mine, strict=True)]
    return min(range(len(candidates)), key=lambda index: (totals[index], index))


# -- preemption -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Victim:
    """A running attempt the scheduler could preempt: its job's effective priority (with the team's boost),
    when it started (unix seconds; 0 before it did), and the share of devices it holds."""

    job_id: str
    attempt_id: str
    team_id: int
    kind: str
    priority: int
    started_at: float
    share: float


class PreemptionCost(Policy):
    """What preempting a running attempt of :attr:`kinds` costs: 1.0 by default, None to never preempt it
    (a trial about to finish, an inference endpoint under its SLA)."""

    def cost(self, victim: Victim) -> float | None:
        return 1.0


def preemption_cost(victim: Victim, hooks: list[PreemptionCost]) -> float | None:
    """The total cost of preempting ``victim`` (1.0 without a hook); None when a hook refuses it."""
    applying = [hook for hook in hooks if hook.applies(victim.kind)]
    if not applying:
        return 1.0
    total = 0.0
    for hook in applying:
        try:
            cost = ask(hook, "cost", victim)
            if cost is None:
                return None
            total += max(0.0, float(cost))
        except (HookFailed, TypeError, ValueError):
            total += 1.0
    return total


# -- failures -------------------------------------------------------------------------------------------------
class NodeLoss(enum.StrEnum):
    """What happens to an attempt whose node is lost.

    - ``requeue`` (the default): the attempt ends ``node_lost``; the job is queued again without a failure.
    - ``fail``: the attempt ends ``node_lost`` and the job fails, whatever attempts it had left.
    - ``carry_on``: the job goes on without the node: the attempt gives up that node's devices and keeps running
      on the others. When nothing is left to carry on with (the lost node ran the attempt, or was its only
      node) the attempt ends ``node_lost`` and the job ends failed, without a retry (a lost peer of a swarm is
      not retried: the swarm carries on without it)."""

    REQUEUE = "requeue"
    FAIL = "fail"
    CARRY_ON = "carry_on"


@dataclass(frozen=True)
class LostAttempt:
    """What a failure policy sees: the attempt, its job, and how many of its other nodes are still up."""

    job_id: str
    attempt_id: str
    team_id: int
    kind: str
    number: int
    node: str  # the lost node's name
    primary: bool  # the lost node is the one running (and reporting for) the attempt
    nodes_left: int  # its other nodes still up


class FailurePolicy(Policy):
    """Decides what a lost node means for an attempt of :attr:`kinds`."""

    def on_node_loss(self, lost: LostAttempt) -> NodeLoss:
        return NodeLoss.REQUEUE


def node_loss(lost: LostAttempt, hooks: list[FailurePolicy]) -> NodeLoss:
    """The first applying hook's answer; requeue without one (or for an answer that is not a NodeLoss)."""
    for hook in hooks:
        if hook.applies(lost.kind):
            try:
                return NodeLoss(ask(hook, "on_node_loss", lost))
            except (HookFailed, ValueError):
                return NodeLoss.REQUEUE
    return NodeLoss.REQUEUE
