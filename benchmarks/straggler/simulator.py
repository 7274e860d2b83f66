"""A deterministic cluster simulator for SAS: gangs on nodes whose availability changes over time.

The cluster (defaults: 100 nodes of 4 worker slots, a 10 s tick):

- **Availability traces**, per node and resource (CPU, GPU, network; 1 = free of outside load), seeded and the
  same for every policy: a node-specific base level, a periodic component (a node-specific period of 20 to 120
  minutes, phase and amplitude), AR(1) noise, and on/off contention bursts (a two-state Markov chain; a third of
  the nodes are *bursty*, with a burst every 40 minutes on average lasting 10, the others every 8 hours).
  Nodes observe their own trace (the outside load; the simulator does not make the workers' own use part of
  it).
- **Jobs**: Poisson arrivals of gangs of 1 to 8 workers, each with a work amount (seconds at full speed,
  log-normal) and a per-worker demand per resource; the same jobs for every policy.
- **Progress**: a node's workers share it: where the total demand ``D`` of the workers on a node exceeds what is
  available, each runs at ``min(1, a / D)`` over the resources; a gang moves at the pace of its slowest worker.
  The queue is first come, first served with backfilling: at every tick, each waiting job that fits in the free
  slots (in arrival order) is placed by the policy.
- **Policies**: ``sas`` (each node's :class:`~components.straggler.availability.AvailabilityPredictor`
  forecast from the history it has so far, refreshed every 2 minutes and refitted every 30 on all the nodes'
  histories; then :mod:`components.straggler.sas`: groups by KMeans, the group with the best expected
  completion time among those likely enough to stay adequate), ``least-loaded`` (each worker on the node that
  would run it fastest given the availability *now* and the load already placed), and ``random``; and, as a
  reference only, ``oracle``: the same choice made on the true future availability (no forecast error).

``Config(world="trace")`` replaces the traces by :mod:`benchmarks.straggler.traceworld` (co-located jobs, a
diurnal cycle and spot preemptions, with statistics from published GPU-cluster studies). There a node can be
lost (availability 0 on every resource): no policy places on it, and a gang with a worker on it goes back to its
last checkpoint and queues again; ``on-demand-first`` (least-loaded on on-demand nodes first) is a further
baseline, and SAS also weighs how often each node has been lost (:func:`components.straggler.sas.loss_rate`).

Figures per policy: average and p95 job completion time (arrival to finish, waiting included), the straggler
rate (the share of a running gang's ticks in which its slowest worker ran below 80% of its median worker's
speed), the mean slowdown (running time over work), and SAS's decision latency.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from components.straggler import sas
from components.straggler.availability import AvailabilityPredictor

RESOURCES = ("cpu", "gpu", "network")
SHARED = (True, False, True)  # a node's workers share its CPU and network; each has a GPU of its own
POLICIES = ("sas", "least-loaded", "least-allocated", "random")
TRACE_POLICIES = (*POLICIES, "on-demand-first")  # the trace world has spot nodes, and the operator's rule for them
WORKER_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
WORKER_WEIGHTS = (0.25, 0.25, 0.03, 0.22, 0.03, 0.04, 0.03, 0.15)


@dataclass(frozen=True)
class Config:
    nodes: int = 100
    slots: int = 4  # workers a node hosts at most
    tick_s: float = 10.0
    warmup_s: float = 2 * 3600.0  # availability history the nodes have before the first job
    arrivals_s: float = 4 * 3600.0  # jobs arrive over this stretch
    drain_s: float = 4 * 3600.0  # then the simulation runs at most this long for the last ones to finish
    load: float = 0.6  # offered load: slot-seconds of work asked per slot-second, at full speed
    work_median_s: float = 900.0
    work_sigma: float = 0.7
    work_range_s: tuple[float, float] = (120.0, 3 * 3600.0)
    # what one worker needs of each resource to run at full speed (CPU and network: of the node's, summed over
    # its workers; GPU: of its own device)
    demand_ranges: tuple[tuple[float, float], ...] = ((0.1, 0.3), (0.7, 1.0), (0.05, 0.3))
    bursty_fraction: float = 1 / 3
    burst_gap_s: float = 40 * 60.0  # bursty nodes: mean time between bursts
    calm_gap_s: float = 8 * 3600.0  # the other nodes
    burst_s: float = 10 * 60.0  # mean burst length
    burst_depth: tuple[float, float] = (0.15, 0.45)  # availability is multiplied by this during a burst
    period_range_s: tuple[float, float] = (20 * 60.0, 120 * 60.0)
    amplitude_range: tuple[float, float] = (0.05, 0.25)
    base_range: tuple[float, float] = (0.55, 0.95)
    noise: float = 0.015  # AR(1) innovation per tick
    ar: float = 0.95
    horizon_s: float = 20 * 60.0  # SAS's forecast horizon
    history: int = 720  # samples a node keeps
    forecast_every_s: float = 120.0
    refit_every_s: float = 1800.0
    model: str = "ridge"
    theta: float = sas.THETA
    straggler_ratio: float = 0.8
    seed: int = 0
    # "synthetic": the traces above; "trace": availability whose statistics come from published GPU-cluster
    # studies, with co-located jobs, a diurnal cycle and spot preemptions (benchmarks.straggler.traceworld)
    world: str = "synthetic"
    # a gang that loses a node (a preemption: availability 0) goes back to its last checkpoint, taken every
    # checkpoint_s of work, and queues again; restarting costs restart_s of work (traceworld.SOURCES)
    checkpoint_s: float = 1800.0
    restart_s: float = 120.0

    @property
    def ticks(self) -> int:
        return int(round((self.warmup_s + self.arrivals_s + self.drain_s) / self.tick_s))

    @property
    def first_tick(self) -> int:
        return int(round(self.warmup_s / self.tick_s))


@dataclass(frozen=True)
class Job:
    id: int
    arrival: float  # seconds since the simulation began
    workers: int
    work: float  # seconds at full speed
    demand: tuple[float, ...]  # per worker, per resource


# -- the world ------------------------------------------------------------------------------------------------
def traces(config: Config) -> np.ndarray:
    """Availability, nodes × ticks × resources (see the module docstring); seeded by ``config.seed``. With
    ``config.world == "trace"``: :func:`benchmarks.straggler.traceworld.trace_world` (0 where a node is
    preempted)."""
    if config.world == "trace":
        from benchmarks.straggler.traceworld import trace_world

        return trace_world(config)
    if config.world != "synthetic":
        raise ValueError(f"world must be 'synthetic' or 'trace', got {config.world!r}")
    rng = np.random.default_rng([config.seed, 1])
    n, ticks, resources = config.nodes, config.ticks, len(RESOURCES)
    t = np.arange(ticks) * config.tick_s
    base = rng.uniform(*config.base_range, size=(n, 1, resources))
    period = rng.uniform(*config.period_range_s, size=(n, 1, 1))
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1)) + rng.uniform(-0.5, 0.5, size=(n, 1, resources))
    amplitude = rng.uniform(*config.amplitude_range, size=(n, 1, resources))
    periodic = amplitude * np.sin(2 * np.pi * t[None, :, None] / period + phase)
    shocks = rng.normal(0.0, config.noise, size=(n, ticks, resources))
    noise = np.zeros_like(shocks)
    for tick in range(1, ticks):
        noise[:, tick] = config.ar * noise[:, tick - 1] + shocks[:, tick]
    bursty = rng.random(n) < config.bursty_fraction
    start = np.where(bursty, config.tick_s / config.burst_gap_s, config.tick_s / config.calm_gap_s)
    end = config.tick_s / config.burst_s
    depth = rng.uniform(*config.burst_depth, size=(n, resources))
    hit = rng.random((n, resources)) < 0.67  # the resources a node's bursts take (at least one)
    hit[np.arange(n), rng.integers(0, resources, n)] = True
    on = np.zeros(n, dtype=bool)
    draws = rng.random((ticks, n))
    factor = np.ones((n, ticks, resources))
    for tick in range(ticks):
        on = np.where(on, draws[tick] >= end, draws[tick] < start)
        factor[on, tick] = np.where(hit[on], depth[on], 1.0)
    return np.clip((base + periodic + noise) * factor, 0.02, 1.0)


def jobs(config: Config) -> list[Job]:
    """The job stream (seeded by ``config.seed``), arriving after the warm-up."""
    rng = random.Random(config.seed * 7919 + 11)
    mean_workers = sum(s * w for s, w in zip(WORKER_SIZES, WORKER_WEIGHTS, strict=True)) / sum(WORKER_WEIGHTS)
    mean_work = config.work_median_s * math.exp(config.work_sigma ** 2 / 2)
    capacity = 1.0
    if config.world == "trace":  # the load is of what the co-located jobs leave (traceworld.spare_capacity)
        from benchmarks.straggler.traceworld import spare_capacity

        capacity = spare_capacity()
    rate = config.load * capacity * config.nodes * config.slots / (mean_workers * mean_work)
    found, now = [], config.warmup_s
    while True:
        now += rng.expovariate(rate)
        if now >= config.warmup_s + config.arrivals_s:
            return found
        workers = rng.choices(WORKER_SIZES, WORKER_WEIGHTS)[0]
        work = min(max(rng.lognormvariate(math.log(config.work_median_s), config.work_sigma),
                       config.work_range_s[0]), config.work_range_s[1])
        demand = tuple(round(rng.uniform(*bounds), 4) for bounds in config.demand_ranges)
        found.append(Job(len(found), now, workers, work, demand))


# -- policies -------------------------------------------------------------------------------------------------
def node_pools(config: Config) -> np.ndarray:
    """What each node reports about how it is provisioned: -1 on-demand, else its spot pool (instance type x
    zone). Every node is on-demand in the synthetic world."""
    if config.world == "trace":
        from benchmarks.straggler.traceworld import spot_pools

        return spot_pools(config)
    return np.full(config.nodes, -1, dtype=int)


class State:
    """What a policy may see at a tick: the availability history so far, free slots and placed demand."""

    def __init__(self, config: Config, trace: np.ndarray):
        self.config = config
        self.trace = trace
        self.tick = 0
        self.free = np.full(config.nodes, config.slots, dtype=int)
        # the summed demand of the workers placed on each node, on its shared resources (0 on the others)
        self.load = np.zeros((config.nodes, len(RESOURCES)))
        self.shared = np.asarray(SHARED, dtype=bool)

    @property
    def now(self) -> np.ndarray:
        return self.trace[:, self.tick]

    @property
    def up(self) -> np.ndarray:
        """Nodes that are there (a preempted node reads 0 on every resource)."""
        return self.trace[:, self.tick].max(axis=1) > 0

    @property
    def placeable(self) -> np.ndarray:
        """Free slots on the nodes that are up: where a policy may place a worker now."""
        return np.where(self.up, self.free, 0)

    def history(self, node: int) -> dict[str, np.ndarray]:
        first = max(0, self.tick + 1 - self.config.history)
        return {r: self.trace[node, first:self.tick + 1, i] for i, r in enumerate(RESOURCES)}


class Policy:
    name = ""
    decisions: list[float]

    def __init__(self, config: Config):
        self.config = config
        self.decisions = []

    def on_tick(self, state: State) -> None:  # noqa: B027 - optional
        pass

    def place(self, state: State, job: Job) -> list[int]:
        raise NotImplementedError


class RandomPolicy(Policy):
    name = "random"

    def __init__(self, config: Config):
        super().__init__(config)
        self.rng = random.Random(config.seed * 31 + 5)

    def place(self, state: State, job: Job) -> list[int]:
        placeable = state.placeable
        slots = [node for node in range(self.config.nodes) for _ in range(placeable[node])]
        return self.rng.sample(slots, job.workers)


class LeastLoadedPolicy(Policy):
    """Each worker where it would run fastest given the availability now and what is already placed."""

    name = "least-loaded"

    def place(self, state: State, job: Job) -> list[int]:
        started = time.perf_counter()
        demand = np.asarray(job.demand)
        now = state.now
        free = state.placeable.copy()
        load = state.load.copy()
        chosen = []
        for _ in range(job.workers):
            after = sas.totals(load, demand, 1, state.shared)
            pace = np.where(free > 0, sas.speed(now, after), -np.inf)
            margin = (now - after).min(axis=1)
            node = int(np.lexsort((np.arange(len(free)), -margin, -pace))[0])
            chosen.append(node)
            free[node] -= 1
            load[node] += np.where(state.shared, demand, 0.0)
        self.decisions.append(time.perf_counter() - started)
        return chosen


class OnDemandFirstPolicy(LeastLoadedPolicy):
    """Least-loaded, but on on-demand nodes whenever they have room: the operator's rule of thumb where some
    nodes are spot instances (it reads the same provisioning label SAS pools its loss counts by)."""

    name = "on-demand-first"

    def place(self, state: State, job: Job) -> list[int]:
        started = time.perf_counter()
        demand = np.asarray(job.demand)
        now = state.now
        free = state.placeable.copy()
        load = state.load.copy()
        spot = node_pools(self.config) >= 0
        chosen = []
        for _ in range(job.workers):
            after = sas.totals(load, demand, 1, state.shared)
            pace = np.where(free > 0, sas.speed(now, after), -np.inf)
            margin = (now - after).min(axis=1)
            node = int(np.lexsort((np.arange(len(free)), -margin, -pace, np.where(free > 0, spot, 2)))[0])
            chosen.append(node)
            free[node] -= 1
            load[node] += np.where(state.shared, demand, 0.0)
        self.decisions.append(time.perf_counter() - started)
        return chosen


class LeastAllocatedPolicy(Policy):
    """Kubernetes' default scoring (LeastAllocated): each worker on the node with the least already requested
    (workers placed there and their shared demand), blind to the availability the node measures."""

    name = "least-allocated"

    def place(self, state: State, job: Job) -> list[int]:
        started = time.perf_counter()
        demand = np.asarray(job.demand)
        free = state.free.copy()
        placeable = state.placeable.copy()
        load = state.load.copy()
        chosen = []
        for _ in range(job.workers):
            requested = (self.config.slots - free) / self.config.slots + load.sum(axis=1)
            node = int(np.lexsort((np.arange(len(free)), np.where(placeable > 0, requested, np.inf)))[0])
            chosen.append(node)
            free[node] -= 1
            placeable[node] -= 1
            load[node] += np.where(state.shared, demand, 0.0)
        self.decisions.append(time.perf_counter() - started)
        return chosen


class SasPolicy(Policy):
    """SAS on the nodes' own forecasts (see the module docstring). Each node forecasts itself from its history
    (in the cluster: its node service, every few seconds): here every forecast is fresh at a tick where a job is
    placed, and the model is refitted every ``refit_every_s`` on all the nodes' histories. The groups are
    recomputed every ``forecast_every_s`` (the scheduler's hook keeps a grouping while the reports it came from
    are unchanged); the choice uses the latest forecasts. The decision latency counts grouping and choosing, not
    forecasting (which the nodes do)."""

    name = "sas"

    def __init__(self, config: Config):
        super().__init__(config)
        self.predictor = AvailabilityPredictor(resources=RESOURCES, horizon_s=config.horizon_s,
                                               interval_s=config.tick_s, history=config.history,
                                               model=config.model, seed=config.seed, rows_per_series=60)
        self.predicted = self.std = None
        self.labels: np.ndarray | None = None
        self.forecast_tick = -1
        self.next_group = self.next_fit = 0
        self.grouping: list[float] = []  # seconds per grouping
        self.forecasting: list[float] = []  # seconds per forecast of every node
        self.fitting: list[float] = []
        # how often each node has been lost (preempted) and for how long it has been watched: the control plane
        # sees a node leave and come back; SAS turns it into a rate (sas.loss_rate)
        self.losses = np.zeros(config.nodes)
        self.watched_s = 0.0
        self.was_up: np.ndarray | None = None

    def _watch(self, state: State) -> None:
        if self.was_up is None:  # the history the nodes had before the first job: count it
            up = state.trace[:, :state.tick + 1].max(axis=2) > 0
            self.losses += (up[:, :-1] & ~up[:, 1:]).sum(axis=1)
            self.watched_s = state.tick * self.config.tick_s
        else:
            self.losses += self.was_up & ~state.up
            self.watched_s += self.config.tick_s
        self.was_up = state.up

    def on_tick(self, state: State) -> None:
        self._watch(state)
        if state.tick >= self.next_fit:
            started = time.perf_counter()
            self.predictor.fit([state.history(node) for node in range(self.config.nodes)])
            self.fitting.append(time.perf_counter() - started)
            self.next_fit = state.tick + int(round(self.config.refit_every_s / self.config.tick_s))

    def _forecast(self, state: State) -> None:
        if self.forecast_tick == state.tick:
            return
        started = time.perf_counter()
        forecasts = self.predictor.predict_many([state.history(node) for node in range(self.config.nodes)])
        self.predicted = np.array([[f.predicted[r] for r in RESOURCES] for f in forecasts])
        self.std = np.array([[f.std[r] for r in RESOURCES] for f in forecasts])
        self.forecasting.append(time.perf_counter() - started)
        self.forecast_tick = state.tick

    def place(self, state: State, job: Job) -> list[int]:
        self._forecast(state)
        started = time.perf_counter()
        # per node: pooling the counts by provisioning label (loss_rate's ``pools``) avoided more preemptions
        # but packed the on-demand nodes, and lost JCT on the development seed (10), so it is not used
        hazard = sas.loss_rate(self.losses, self.watched_s)
        if self.labels is None or state.tick >= self.next_group:
            self.labels = sas.group(self.predicted, self.std, seed=self.config.seed,
                                    extra=sas.loss_probability(hazard, self.config.horizon_s))
            self.grouping.append(time.perf_counter() - started)
            self.next_group = state.tick + int(round(self.config.forecast_every_s / self.config.tick_s))
        decision = sas.choose(self.predicted, self.std, self.labels, job.demand, job.workers,
                              free=state.placeable, load=state.load, theta=self.config.theta, base_time=job.work,
                              shared=SHARED, hazard=hazard, loss_s=self.config.checkpoint_s / 2 + self.config.restart_s)
        self.decisions.append(time.perf_counter() - started)
        return decision.placement


class OraclePolicy(Policy):
    """A reference, not a scheduler: SAS's choice made on each node's *true* mean availability over the job's
    run (its work at full speed, plus 30%), with no uncertainty; a node that will be preempted within twice the
    job's work counts as unavailable. What a perfect forecaster of availability could reach with this placement
    rule."""

    name = "oracle"

    def place(self, state: State, job: Job) -> list[int]:
        started = time.perf_counter()
        ahead = max(1, int(round(1.3 * job.work / self.config.tick_s)))
        future = state.trace[:, state.tick:state.tick + ahead].mean(axis=1)
        lost = state.trace[:, state.tick:state.tick + 2 * ahead].max(axis=2).min(axis=1) <= 0
        future[lost] = 0.0
        decision = sas.choose(future, np.full_like(future, 1e-3), np.zeros(self.config.nodes, dtype=int),
                              job.demand, job.workers, free=state.placeable, load=state.load,
                              theta=self.config.theta,
                              base_time=job.work, shared=SHARED, risk=0.0)
        self.decisions.append(time.perf_counter() - started)
        return decision.placement


def make_policy(name: str, config: Config) -> Policy:
    return {"sas": SasPolicy, "least-loaded": LeastLoadedPolicy, "least-allocated": LeastAllocatedPolicy,
            "random": RandomPolicy, "oracle": OraclePolicy, "on-demand-first": OnDemandFirstPolicy}[name](config)


# -- the simulation -------------------------------------------------------------------------------------------
@dataclass
class Result:
    policy: str
    jobs: int
    finished: int
    avg_jct_s: float
    p95_jct_s: float
    avg_wait_s: float
    avg_slowdown: float
    straggler_rate: float
    decision_ms: float  # mean wall time of a placement decision
    decision_p95_ms: float
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _p(values: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=float), q)) if len(values) else 0.0


def simulate(config: Config, policy: Policy, trace: np.ndarray, stream: Sequence[Job]) -> Result:
    """Run ``stream`` on ``trace`` with ``policy``; every policy sees the same trace and jobs."""
    state = State(config, trace)
    queue: list[Job] = []
    running: dict[int, tuple[Job, list[int], float]] = {}  # id -> (job, nodes, placed at)
    progress: dict[int, float] = {}
    done: dict[int, tuple[float, float]] = {}  # id -> (started, finished)
    started_at: dict[int, float] = {}  # id -> when it first started
    preempted = 0  # gangs sent back to their checkpoint because a node was lost
    lost_work = 0.0
    arrivals = list(stream)
    next_arrival = 0
    straggling = gang_ticks = 0
    demands = {job.id: np.asarray(job.demand) for job in arrivals}
    shared = np.asarray(SHARED, dtype=bool)
    own = [index for index, flag in enumerate(SHARED) if not flag]
    for tick in range(config.first_tick, config.ticks):
        state.tick = tick
        now = tick * config.tick_s
        while next_arrival < len(arrivals) and arrivals[next_arrival].arrival <= now:
            queue.append(arrivals[next_arrival])
            next_arrival += 1
        policy.on_tick(state)
        waiting = []
        for job in queue:
            if job.workers > state.placeable.sum():
                waiting.append(job)
                continue
            placeable = state.placeable
            nodes = policy.place(state, job)
            if len(nodes) != job.workers or any(placeable[node] < nodes.count(node) for node in set(nodes)):
                raise RuntimeError(f"{policy.name} placed job {job.id} on {nodes} (placeable "
                                   f"{placeable[nodes]})")
            for node in nodes:
                state.free[node] -= 1
                state.load[node] += np.where(shared, demands[job.id], 0.0)
            running[job.id] = (job, nodes, started_at.setdefault(job.id, now))
            progress.setdefault(job.id, 0.0)
        queue = waiting
        # progress over this tick at this tick's availability: the node's shared resources, split over its
        # workers, and each worker's own GPU
        available = state.now
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(state.load > 0, available / np.maximum(state.load, 1e-12), np.inf)
        pace = np.minimum(1.0, ratio.min(axis=1))
        finished = []
        up = state.up
        for job_id in [job_id for job_id, (_, nodes, _) in running.items() if not up[nodes].all()]:
            # a node of the gang is gone: back to the last checkpoint, and into the queue again (by arrival)
            job, nodes, _ = running.pop(job_id)
            for node in nodes:
                state.free[node] += 1
                state.load[node] -= np.where(shared, demands[job_id], 0.0)
            state.load[np.abs(state.load) < 1e-9] = 0.0
            kept = math.floor(progress[job_id] / config.checkpoint_s) * config.checkpoint_s
            lost_work += progress[job_id] - kept + config.restart_s
            progress[job_id] = kept - config.restart_s
            preempted += 1
            queue.append(job)
        queue.sort(key=lambda queued: (queued.arrival, queued.id))
        for job_id, (job, nodes, _) in running.items():
            speeds = pace[nodes]
            for index in own:
                speeds = np.minimum(speeds, available[nodes, index] / max(job.demand[index], 1e-9))
            slowest = float(speeds.min())
            if job.workers > 1:
                gang_ticks += 1
                straggling += slowest < config.straggler_ratio * float(np.median(speeds))
            progress[job_id] += slowest * config.tick_s
            if progress[job_id] >= job.work:
                finished.append(job_id)
        for job_id in finished:
            job, nodes, started = running.pop(job_id)
            for node in nodes:
                state.free[node] += 1
                state.load[node] -= np.where(shared, demands[job_id], 0.0)
            state.load[np.abs(state.load) < 1e-9] = 0.0
            done[job_id] = (started, now + config.tick_s)
        if next_arrival >= len(arrivals) and not queue and not running:
            break
    end = (state.tick + 1) * config.tick_s
    jct, waits, slowdowns = [], [], []
    for job in arrivals:
        started, finished_at = done.get(job.id, (running.get(job.id, (None, None, end))[2], end))
        jct.append(finished_at - job.arrival)
        waits.append(started - job.arrival)
        if job.id in done:
            slowdowns.append((finished_at - started) / job.work)
    details: dict[str, Any] = {"unfinished": len(arrivals) - len(done), "preempted": preempted,
                               "lost_work_s": lost_work}
    if isinstance(policy, SasPolicy):
        details.update(grouping_ms=1000 * float(np.mean(policy.grouping)) if policy.grouping else 0.0,
                       forecast_ms=1000 * float(np.mean(policy.forecasting)) if policy.forecasting else 0.0,
                       fit_ms=1000 * float(np.mean(policy.fitting)) if policy.fitting else 0.0,
                       groupings=len(policy.grouping))
    return Result(policy=policy.name, jobs=len(arrivals), finished=len(done),
                  avg_jct_s=float(np.mean(jct)) if jct else 0.0, p95_jct_s=_p(jct, 0.95),
                  avg_wait_s=float(np.mean(waits)) if waits else 0.0,
                  avg_slowdown=float(np.mean(slowdowns)) if slowdowns else 0.0,
                  straggler_rate=straggling / gang_ticks if gang_ticks else 0.0,
                  decision_ms=1000 * float(np.mean(policy.decisions)) if policy.decisions else 0.0,
                  decision_p95_ms=1000 * _p(policy.decisions, 0.95), details=details)


def run(config: Config = Config(), policies: Sequence[str] = POLICIES,
        progress: Callable[[str], None] | None = None) -> dict[str, Result]:
    """Every policy on the same traces and jobs (seeded by ``config.seed``)."""
    trace = traces(config)
    stream = jobs(config)
    results = {}
    for name in policies:
        started = time.perf_counter()
        results[name] = simulate(config, make_policy(name, config), trace, stream)
        if progress:
            r = results[name]
            progress(f"  seed {config.seed} {name:<13} avg JCT {r.avg_jct_s:7.0f} s  p95 {r.p95_jct_s:7.0f} s  "
                     f"stragglers {r.straggler_rate:5.1%}  slowdown {r.avg_slowdown:4.2f}  "
                     f"decision {r.decision_ms:6.2f} ms  ({time.perf_counter() - started:.1f} s)")
    return results
