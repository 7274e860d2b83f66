"""SAS: availability-aware gang placement (pure logic, light enough for the control plane).

A data-parallel gang runs at the pace of its slowest member, so a gang should go where *every* member will
stay available for the whole run, not where nodes look idle right now. SAS (reconstructed from the proposal
abstract, see docs/components/straggler.md) does it in three steps:

1. **The resource matrix**: one row per node, the predicted mean availability of each resource over the
   horizon and its standard deviation (the node's :class:`~components.straggler.availability.AvailabilityPredictor`
   forecast, which every node reports).
2. **Groups**: KMeans over the matrix (deterministic; ``k`` from 2 to 6 by the silhouette score, one group for
   fewer than three nodes or when no split is clear) puts nodes of similar availability, and similar
   steadiness, together.
3. **The choice**: for each group with room for the gang, its workers are spread greedily over the group's
   nodes that would run them fastest; the group's **P(adequate)** is the probability (normal approximation
   from the forecast's mean and std) that every node used keeps each resource at or above what the workers
   placed there demand, over the horizon; its **expected completion time** is ``base_time`` divided by the
   slowest used node's predicted speed (``min(1, availability / demand)`` over the resources, on the cautious
   forecast ``mean - RISK * std``; a shared resource's demand adds up over the node's workers, a resource each
   worker has to itself does not: :func:`totals`). Among the groups with ``P >= theta`` (0.8) the fastest wins
   (ties: the more likely); when none reaches ``theta``, the most likely one. When no group has room for the
   whole gang, the nodes are taken as one group (SAS never keeps a gang waiting for a group).

**Lost nodes** (optional: ``hazard``). Where nodes can disappear (spot preemptions), each node's loss rate
(:func:`loss_rate`, from how often it was lost while watched) enters all three steps: the grouping gets the
probability of a loss within the horizon as a column (``extra``); within a group a worker goes where
``speed / (1 + rate x loss_s)`` is highest; a group's P(adequate) is multiplied by the probability that none of
its used nodes is lost during the expected run, ``exp(-sum(rate) x time)``, and its expected time by
``1 + sum(rate) x loss_s`` (each loss costs the gang ``loss_s``: the work since its last checkpoint and the
restart).

No torch, grpc or hivemind; numpy at import, scikit-learn when a grouping is computed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

THETA = 0.8
RISK = 1.0  # speeds are judged on the forecast this many standard deviations below its mean
MAX_GROUPS = 6
SIMILAR = 0.02  # nodes whose rows all lie within this of each other are one group


@dataclass
class GroupScore:
    """What SAS thought of one group for one gang."""

    group: int
    nodes: list[int]  # indexes of the group's nodes
    capacity: int  # how many workers the group could take
    eligible: bool  # room for the whole gang
    placement: list[int] = field(default_factory=list)  # the node index of each worker
    p_adequate: float = 0.0
    speed: float = 0.0  # the slowest used node's predicted speed (0..1)
    expected_time: float = math.inf


@dataclass
class Decision:
    """SAS's answer for one gang: the group, the node of each worker, and why."""

    group: int | None
    placement: list[int]
    p_adequate: float
    expected_time: float
    confident: bool  # the chosen group reached theta
    labels: list[int]  # every node's group
    groups: list[GroupScore]
    latency_s: float = 0.0


def _phi(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF, elementwise."""
    flat = [0.5 * (1.0 + math.erf(value / math.sqrt(2.0))) for value in np.ravel(z)]
    return np.asarray(flat, dtype=float).reshape(np.shape(z))


def matrix(forecasts: Sequence[Mapping[str, Mapping[str, float]]], resources: Sequence[str]) -> tuple[
        np.ndarray, np.ndarray]:
    """``(predicted, std)``, each nodes × resources, from node payloads ``{"predicted": {...}, "std": {...}}``.
    A resource a node does not report reads as fully available and certain (it has no opinion on it)."""
    predicted = np.ones((len(forecasts), len(resources)))
    std = np.full((len(forecasts), len(resources)), 1e-3)
    for row, forecast in enumerate(forecasts):
        for column, resource in enumerate(resources):
            value = (forecast.get("predicted") or {}).get(resource)
            spread = (forecast.get("std") or {}).get(resource)
            if isinstance(value, int | float) and math.isfinite(value):
                predicted[row, column] = min(1.0, max(0.0, float(value)))
            if isinstance(spread, int | float) and math.isfinite(spread):
                std[row, column] = max(1e-3, float(spread))
    return predicted, std


def loss_rate(losses: Sequence[float] | np.ndarray, watched_s: float, prior: float = 1.0,
              pools: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Each node's rate of being lost (per second), from ``losses`` (times each node was lost) over the
    ``watched_s`` seconds it was watched: the Gamma-Poisson (empirical Bayes) estimate that shrinks every node
    toward the cluster's mean rate with the weight of ``prior`` losses, so a node never lost is not taken to be
    safe before it has been watched long enough to tell. With ``pools`` (a label per node: what the node
    reports about how it is provisioned, e.g. on-demand, or a spot instance type in a zone), the losses of a
    pool's nodes are counted together and every node gets its pool's rate: a pool's rate is learnt from all its
    nodes, far sooner than one node's."""
    losses = np.asarray(losses, dtype=float)
    if watched_s <= 0 or not len(losses):
        return np.zeros(len(losses))
    mean = max(float(losses.mean()) / watched_s, 1e-12)
    if pools is None:
        return (losses + prior) / (watched_s + prior / mean)
    labels = np.asarray(pools)
    rate = np.zeros(len(losses))
    for pool in np.unique(labels):
        members = labels == pool
        rate[members] = (losses[members].sum() + prior) / (members.sum() * watched_s + prior / mean)
    return rate


def loss_probability(rate: np.ndarray, seconds: float) -> np.ndarray:
    """The probability that a node with loss ``rate`` (per second) is lost within ``seconds``."""
    return 1.0 - np.exp(-np.asarray(rate, dtype=float) * max(0.0, seconds))


def group(predicted: np.ndarray, std: np.ndarray, k: int | None = None, seed: int = 0,
          extra: np.ndarray | None = None) -> np.ndarray:
    """Group labels (0..k-1) of the nodes: KMeans over ``[predicted, std]`` (and the ``extra`` columns, one
    row per node, when given), ``k`` by the silhouette score (2..6) unless given. One group for fewer than three
    nodes or nodes that are all alike."""
    columns = [np.asarray(predicted, dtype=float), np.asarray(std, dtype=float)]
    if extra is not None:
        columns.append(np.asarray(extra, dtype=float).reshape(len(columns[0]), -1))
    points = np.hstack(columns)
    count = len(points)
    if count < 3 or np.ptp(points, axis=0).max(initial=0.0) <= SIMILAR:
        return np.zeros(count, dtype=int)
    distinct = len(np.unique(np.round(points, 6), axis=0))
    from sklearn.cluster import KMeans

    if k is not None:
        k = max(1, min(k, distinct))
        if k == 1:
            return np.zeros(count, dtype=int)
        return KMeans(k, n_init=4, random_state=seed).fit_predict(points).astype(int)
    from sklearn.metrics import silhouette_score

    best_labels, best_score = np.zeros(count, dtype=int), 0.25  # a split must be at least this clear
    for clusters in range(2, min(MAX_GROUPS, distinct, count - 1) + 1):
        labels = KMeans(clusters, n_init=4, random_state=seed).fit_predict(points)
        if len(set(labels.tolist())) < 2:
            continue
        score = float(silhouette_score(points, labels))
        if score > best_score + 1e-9:
            best_labels, best_score = labels.astype(int), score
    return best_labels


def speed(predicted: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """Predicted speed (0..1) of a worker on each node given the total ``demand`` there (nodes × resources):
    ``min(1, availability / demand)`` over the resources with a demand."""
    demand = np.asarray(demand, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(demand > 0, np.asarray(predicted, dtype=float) / np.maximum(demand, 1e-12), np.inf)
    return np.minimum(1.0, ratio.min(axis=-1))


def totals(load: np.ndarray, demand: np.ndarray, count: np.ndarray | int, shared: np.ndarray) -> np.ndarray:
    """What each node's resources must give once ``count`` more workers of ``demand`` run there beside its
    ``load``: a shared resource (CPU, memory, network) adds the workers' demands up; a resource each worker has
    to itself (its own GPU) asks just one worker's demand."""
    count = np.asarray(count, dtype=float)
    count = count[:, None] if count.ndim else count
    return np.where(shared[None, :], load + count * demand[None, :], demand[None, :])


def _score_group(index: int, nodes: np.ndarray, predicted: np.ndarray, std: np.ndarray, free: np.ndarray,
                 load: np.ndarray, demand: np.ndarray, workers: int, base_time: float,
                 shared: np.ndarray, risk: float, hazard: np.ndarray, loss_s: float) -> GroupScore:
    capacity = int(free[nodes].sum())
    result = GroupScore(group=index, nodes=nodes.tolist(), capacity=capacity, eligible=capacity >= workers)
    if not result.eligible:
        return result
    placed = np.zeros(len(nodes), dtype=int)
    cautious = np.clip(predicted[nodes] - risk * std[nodes], 0.0, 1.0)
    for _ in range(workers):  # each worker where it would run fastest (ties: the steadier node, then order)
        after = totals(load[nodes], demand, placed + 1, shared)
        pace = speed(cautious, after) / (1.0 + hazard[nodes] * loss_s)
        pace = np.where(placed < free[nodes], pace, -np.inf)
        margin = (predicted[nodes] - after).min(axis=1) - std[nodes].max(axis=1)
        choice = int(np.lexsort((np.arange(len(nodes)), -margin, -pace))[0])
        placed[choice] += 1
    used = placed > 0
    total = totals(load[nodes][used], demand, placed[used], shared)
    mean, spread = predicted[nodes][used], std[nodes][used]
    needed = demand[None, :] > 0
    z = np.where(needed, (mean - total) / spread, np.inf)
    result.p_adequate = float(np.prod(_phi(np.where(np.isfinite(z), z, 50.0))))
    result.speed = float(speed(cautious[used], total).min())
    result.expected_time = base_time / result.speed if result.speed > 0 else math.inf
    rate = float(hazard[nodes][used].sum())
    if rate > 0 and math.isfinite(result.expected_time):
        result.p_adequate *= math.exp(-rate * result.expected_time)
        result.expected_time *= 1.0 + rate * loss_s
    result.placement = [int(nodes[position]) for position in range(len(nodes)) for _ in range(placed[position])]
    return result


def choose(predicted: np.ndarray, std: np.ndarray, labels: Sequence[int], demand: Sequence[float],
           workers: int = 1, free: Sequence[int] | None = None, load: np.ndarray | None = None,
           theta: float = THETA, base_time: float = 1.0, shared: Sequence[bool] | None = None,
           risk: float | None = None, hazard: Sequence[float] | np.ndarray | None = None,
           loss_s: float = 0.0) -> Decision:
    """The group (and each worker's node) for a gang of ``workers``, given the nodes' forecasts (nodes ×
    resources), their group ``labels``, the per-worker ``demand`` (availability one worker needs, per
    resource), each node's ``free`` worker slots (default 1 each: spread), its ``load`` (the demand of the
    workers already placed there on its shared resources, nodes × resources; default none) and which resources
    the workers of a node share (default all; see :func:`totals`), and optionally each node's loss ``hazard``
    (per second, :func:`loss_rate`) with what a loss costs the gang (``loss_s``). See the module docstring."""
    predicted = np.atleast_2d(np.asarray(predicted, dtype=float))
    std = np.maximum(np.atleast_2d(np.asarray(std, dtype=float)), 1e-3)
    count = len(predicted)
    labels = np.asarray(labels, dtype=int) if count else np.zeros(0, dtype=int)
    demand = np.asarray(demand, dtype=float)
    free = np.ones(count, dtype=int) if free is None else np.asarray(free, dtype=int)
    load = np.zeros_like(predicted) if load is None else np.asarray(load, dtype=float)
    shared = np.ones(predicted.shape[1], dtype=bool) if shared is None else np.asarray(shared, dtype=bool)
    workers = max(1, int(workers))
    risk = RISK if risk is None else float(risk)
    hazard = np.zeros(count) if hazard is None else np.maximum(np.asarray(hazard, dtype=float), 0.0)
    scores = [_score_group(int(g), np.flatnonzero(labels == g), predicted, std, free, load, demand, workers,
                           base_time, shared, risk, hazard, loss_s) for g in sorted(set(labels.tolist()))]
    eligible = [score for score in scores if score.eligible]
    if not eligible and count:
        whole = _score_group(-1, np.arange(count), predicted, std, free, load, demand, workers, base_time,
                             shared, risk, hazard, loss_s)
        scores.append(whole)
        eligible = [whole] if whole.eligible else []
    if not eligible:
        return Decision(None, [], 0.0, math.inf, False, labels.tolist(), scores)
    confident = [score for score in eligible if score.p_adequate >= theta]
    if confident:
        chosen = min(confident, key=lambda s: (s.expected_time, -s.p_adequate, s.group))
    else:
        chosen = max(eligible, key=lambda s: (s.p_adequate, -s.expected_time, -s.group))
    return Decision(chosen.group, chosen.placement, chosen.p_adequate, chosen.expected_time, bool(confident),
                    labels.tolist(), scores)


def decide(predicted: np.ndarray, std: np.ndarray, demand: Sequence[float], workers: int = 1,
           free: Sequence[int] | None = None, load: np.ndarray | None = None, theta: float = THETA,
           base_time: float = 1.0, labels: Sequence[int] | None = None, k: int | None = None,
           seed: int = 0, shared: Sequence[bool] | None = None, risk: float | None = None) -> Decision:
    """Group the nodes (unless ``labels`` are given) and :func:`choose`; the decision carries how long it took
    (``latency_s``, wall clock: the one impure bit, for the benchmark)."""
    started = time.perf_counter()
    predicted = np.atleast_2d(np.asarray(predicted, dtype=float))
    std = np.atleast_2d(np.asarray(std, dtype=float))
    if labels is None:
        labels = group(predicted, std, k=k, seed=seed) if len(predicted) else []
    decision = choose(predicted, std, labels, demand, workers, free, load, theta, base_time, shared, risk)
    decision.latency_s = time.perf_counter() - started
    return decision
