"""SAS in the scheduler: a placement hook that puts a training gang on the group of nodes most likely to stay
available for its whole run.

:class:`AvailabilityAwarePlacement` is a :class:`~components.runtime.contract.policies.PlacementScore` hook for ``train``
jobs. It answers :meth:`scores` for all the places one worker could take at once: from the candidates' nodes'
``straggler`` reports (each node's availability forecast, :mod:`components.straggler.availability`) it builds
the resource matrix, groups the nodes and chooses the group for the gang (:mod:`components.straggler.sas`).
Places on the chosen group's nodes score low (about -1, better), places on other reporting nodes high (about
+1); within each, a node with more predicted availability scores a little lower. Nodes without a report are
neutral (0): SAS has no opinion on them. It only orders the places that fit now: it never keeps a job waiting.

A job may say what one of its workers needs of each resource, in availability (0..1)::

    spec: {straggler: {demand: {cpu: 0.3, network: 0.2}, theta: 0.8}}

else :data:`DEFAULT_DEMAND` applies (CPU, memory and network add up over a node's workers; each has its own
GPU). The gang's size is ``resources.workers``; a node's room is how many of the candidates are on it.

The scheduler asks once per worker of a gang. So that every worker of one gang agrees, a decision is kept per
job for as long as the reports it was made from are unchanged (a later worker sees a subset of the nodes, with
the same reports, in the same pass); the grouping itself is kept per set of reports (so many queued jobs cost
one grouping). Both caches are bounded. Pure: no clock, no I/O; the same input gives the same answer.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, ClassVar

from components.runtime.contract.policies import Candidate, PlacementScore, QueuedJob
from components.straggler.report import PLUGIN, RESOURCES

DEFAULT_DEMAND = {"cpu": 0.2, "memory": 0.1, "gpu": 0.2, "network": 0.05}
SHARED = tuple(resource != "gpu" for resource in RESOURCES)  # a node's workers share all but their own GPU
IN_GROUP, OUT_OF_GROUP = -1.0, 1.0
CACHED_JOBS = 1024
CACHED_GROUPINGS = 64


def _fingerprint(report: Any) -> tuple | None:
    """What of a node's report the decision depends on; None for no usable report."""
    if not isinstance(report, dict):
        return None
    predicted, std = report.get("predicted"), report.get("std")
    if not isinstance(predicted, dict) or not isinstance(std, dict):
        return None
    values = []
    for resource in RESOURCES:
        mean, spread = predicted.get(resource), std.get(resource)
        values.append(round(float(mean), 4) if isinstance(mean, int | float) and math.isfinite(mean) else None)
        values.append(round(float(spread), 4) if isinstance(spread, int | float) and math.isfinite(spread)
                      else None)
    if all(value is None for value in values[::2]):
        return None
    return tuple(values)


def _demand(job: QueuedJob) -> dict[str, float]:
    options = job.spec.get(PLUGIN) if isinstance(job.spec, dict) else None
    asked = options.get("demand") if isinstance(options, dict) else None
    demand = dict(DEFAULT_DEMAND)
    if isinstance(asked, dict):
        for resource, value in asked.items():
            if resource in demand and isinstance(value, int | float) and math.isfinite(value):
                demand[resource] = min(1.0, max(0.0, float(value)))
    return demand


def _theta(job: QueuedJob) -> float:
    options = job.spec.get(PLUGIN) if isinstance(job.spec, dict) else None
    theta = options.get("theta") if isinstance(options, dict) else None
    if isinstance(theta, int | float) and math.isfinite(theta) and 0 <= theta <= 1:
        return float(theta)
    from components.straggler.sas import THETA

    return THETA


def _workers(job: QueuedJob) -> int:
    try:
        return max(1, int(job.resources.get("workers", 1) or 1))
    except (TypeError, ValueError):
        return 1


class AvailabilityAwarePlacement(PlacementScore):
    """SAS: place a training gang on the node group most likely to stay available (see the module docstring)."""

    kinds: ClassVar[tuple[str, ...]] = ("train",)
    reads = PLUGIN  # no node reports this plugin: no opinion, the pass builds no candidates for it

    def __init__(self) -> None:
        self._decisions: OrderedDict[str, tuple[dict[str, tuple], dict[str, float]]] = OrderedDict()
        self._groupings: OrderedDict[tuple, list[int]] = OrderedDict()

    def score(self, job: QueuedJob, candidate: Candidate) -> float:
        return self.scores(job, [candidate])[0]

    def scores(self, job: QueuedJob, candidates: list[Candidate]) -> list[float]:
        if not candidates:
            return []
        prints: dict[str, tuple] = {}
        reports: dict[str, dict] = {}
        room: dict[str, int] = {}
        for candidate in candidates:
            report = (candidate.reports or {}).get(PLUGIN)
            fingerprint = _fingerprint(report)
            if fingerprint is None:
                continue
            prints[candidate.node_id] = fingerprint
            reports[candidate.node_id] = report
            room[candidate.node_id] = room.get(candidate.node_id, 0) + 1
        if not prints:
            return [0.0] * len(candidates)
        by_node = self._cached(job, prints)
        if by_node is None:
            by_node = self._decide(job, prints, reports, room)
            self._remember(self._decisions, job.id, (prints, by_node), CACHED_JOBS)
        return [by_node.get(candidate.node_id, 0.0) if candidate.node_id in prints else 0.0
                for candidate in candidates]

    # -- caches ------------------------------------------------------------------------------------------
    @staticmethod
    def _remember(cache: OrderedDict, key: Any, value: Any, limit: int) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > limit:
            cache.popitem(last=False)

    def _cached(self, job: QueuedJob, prints: dict[str, tuple]) -> dict[str, float] | None:
        """The job's earlier decision, when every node seen now was seen then with the same report (a later
        worker of the same gang, or the same queue in a later pass with nothing new)."""
        entry = self._decisions.get(job.id)
        if entry is None:
            return None
        seen, by_node = entry
        if all(seen.get(node) == fingerprint for node, fingerprint in prints.items()):
            self._decisions.move_to_end(job.id)
            return by_node
        return None

    def _labels(self, nodes: list[str], prints: dict[str, tuple], predicted, std) -> list[int]:
        from components.straggler.sas import group

        key = tuple((node, prints[node]) for node in nodes)
        labels = self._groupings.get(key)
        if labels is None:
            labels = group(predicted, std).tolist()
            self._remember(self._groupings, key, labels, CACHED_GROUPINGS)
        else:
            self._groupings.move_to_end(key)
        return labels

    # -- the decision ------------------------------------------------------------------------------------
    def _decide(self, job: QueuedJob, prints: dict[str, tuple], reports: dict[str, dict],
                room: dict[str, int]) -> dict[str, float]:
        from components.straggler.sas import choose, matrix

        nodes = sorted(prints)
        predicted, std = matrix([reports[node] for node in nodes], RESOURCES)
        labels = self._labels(nodes, prints, predicted, std)
        demand = _demand(job)
        decision = choose(predicted, std, labels, [demand[r] for r in RESOURCES], workers=_workers(job),
                          free=[room[node] for node in nodes], theta=_theta(job), shared=SHARED)
        chosen = set()
        if decision.group is not None:
            chosen = {nodes[index] for index, label in enumerate(labels)
                      if label == decision.group or decision.group == -1}
            chosen |= {nodes[index] for index in decision.placement}
        by_node = {}
        for index, node in enumerate(nodes):
            availability = float(predicted[index].min())  # the node's bottleneck resource
            base = IN_GROUP if node in chosen else OUT_OF_GROUP
            by_node[node] = round(base - 0.5 * availability, 6)
        return by_node
