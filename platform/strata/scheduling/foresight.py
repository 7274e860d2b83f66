"""Foresight: a forward simulator of the queue over the scheduler's own decision core, and start-time estimates.

The simulator keeps the cluster as plain data (nodes, devices, the jobs that run and wait) and advances simulated
time from event to event: running jobs end at their predicted completion, pending jobs are admitted by the same
quota checks as :func:`strata.quotas.services.admit_pending` (``blocking_limit``), and at every event one pass of
:func:`strata.scheduling.services.decide` (the same fair share, placement hooks and preemption choice as
``schedule_pass``) places waiting ones, which then run for their predicted run time. There is no second
implementation of the scheduler here: only the bookkeeping the database does for the real one.

Run times (:func:`predict_runtimes`) come, in order, from the job's own progress (steps done and steps per second
from its metric points, against the total its spec states), from a quantile model of the team's finished jobs of
the same kind and resources (:class:`HistoryModel`, scikit-learn, capped by the time limit), and else from the
job's time limit. Estimates (:func:`estimate`) sample run times from those quantiles, simulate, and read the
median and the 10th and 90th percentiles of each waiting job's simulated start; what would make a job run now
comes from one pass of the core on a modified copy of the state (:func:`run_now_options`).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from strata.cluster.capacity import FULL, CapacityIndex, DeviceSlot, NodeSlot, host_slot

PENDING, QUEUED, RUNNING, DONE = "pending", "queued", "running", "done"
QUANTILES = (0.1, 0.5, 0.9)


# --- plain state ----------------------------------------------------------------------------------------------

@dataclass
class SimNode:
    """A node as the simulator sees it: its devices ``(device id, index, memory_total)`` and its CPU device
    ``(device id, index, cpus, memory)`` or None."""

    id: object
    name: str
    labels: dict
    devices: list[tuple[int, int, int]]
    host: tuple[int, int, float, int] | None = None


@dataclass
class RunTime:
    """A job's run time (seconds it runs once started; of a running job, the seconds it has left) as quantiles,
    and where they came from: ``progress``, ``history``, ``time_limit`` or ``given``."""

    p10: float
    p50: float
    p90: float
    source: str = "given"

    @classmethod
    def exact(cls, seconds: float, source: str = "given") -> RunTime:
        return cls(seconds, seconds, seconds, source)

    def sample(self, rng: random.Random) -> float:
        """A draw from the piecewise-linear quantile function through (0.1, p10), (0.5, p50), (0.9, p90),
        extended linearly to 0 and 1 (never below 1 % of p10)."""
        return quantile_at(self, rng.random())


def quantile_at(runtime: RunTime, u: float) -> float:
    lo, mid, hi = runtime.p10, runtime.p50, runtime.p90
    if u <= 0.5:
        slope = (mid - lo) / 0.4
        value = lo + (u - 0.1) * slope
    else:
        slope = (hi - mid) / 0.4
        value = mid + (u - 0.5) * slope
    return max(value, 0.01 * lo, 0.0)


@dataclass
class SimJob:
    """A job in the simulation. ``runtime``: what it runs once placed (of a running job: what it has left);
    ``submit``: when it enters the queue (None: it is there already); ``allocs``: ``(device id, milli,
    memory)`` it holds while running."""

    id: object
    team_id: int
    kind: str
    resources: dict
    runtime: RunTime
    priority: int = 0
    state: str = QUEUED
    queued_at: float = 0.0
    submit: float | None = None
    owner_id: int | None = None
    reason: str = ""
    started: float | None = None
    ends: float | None = None
    allocs: list = field(default_factory=list)
    share: float = 0.0
    attempts: int = 0
    created: float = 0.0  # when it was submitted: admission takes a team's pending jobs by priority, then this
    ended: float | None = None  # when it ended (simulated)
    stopping: bool = False  # running, but cancelled or preempted: its devices come back at ``ends``
    requeue: bool = False  # a stopping job that queues again (preempted) rather than ending
    duration: float = 0.0  # the run time drawn for this simulation (set by Simulator)
    ranks: list = field(default_factory=list)  # the worker rank of each of ``allocs`` (unknown: all rank 0)
    # Lost work. ``checkpoint_every``: seconds of run between the job's periodic checkpoints (None: whatever it
    # ran is kept when it stops); ``can_checkpoint`` False: it keeps nothing when it stops (it starts over).
    checkpoint_every: float | None = None
    can_checkpoint: bool = True
    cut_at: float | None = None  # when it was preempted or shrunk: it makes no progress after
    saves: bool = True  # the stop under way writes a checkpoint first (False: it is killed)
    resize: dict | None = None  # a shrink: the resources it queues again with
    lost: float = 0.0  # GPU-seconds of work it lost to preemption (run since its last checkpoint)
    stops: int = 0  # times it was preempted
    shrinks: int = 0  # times it was shrunk


@dataclass
class Placement:
    time: float
    job_id: object
    node_id: object
    devices: tuple  # the device ids it took, in rank order


def _total_gpus(resources: dict) -> float:
    return float(resources.get("gpus", 0) or 0) * int(resources.get("workers", 1) or 1)


class _Request:
    """What admission's checks read of a job (``TeamLoad.add``, ``blocking_limit``): its resources. A Django
    ``Job`` instance per job per pass cost most of a long replay's admission."""

    __slots__ = ("resources",)

    def __init__(self, resources: dict):
        self.resources = resources


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


class LiveIndex(CapacityIndex):
    """A :class:`CapacityIndex` kept from pass to pass by the simulator instead of rebuilt for each one.

    Its numbers are exact whatever the history of takes and gives. What a history can change is the order in
    which a set of the index offers its members (a bucket of devices with the same free share, a group of nodes
    with the same count of whole devices free): that order decides which of equally good places a pass takes.
    :meth:`settle`, called before each pass, rebuilds every such set that changed since the last one by inserting
    its members in the order a fresh build inserts them (the nodes', then their devices' order), which gives
    the very set a fresh build would: the same places, in the same order, as rebuilding the index each pass."""

    def __init__(self, nodes: list[NodeSlot]):
        self._dirty_levels: set[int] = set()
        self._dirty_counts: set[int] = set()
        super().__init__(nodes)
        self._dirty_levels.clear()
        self._dirty_counts.clear()
        self._rank = {device.id: rank for rank, device in enumerate(d for node in nodes for d in node.devices)}
        self._node_rank = {node.id: rank for rank, node in enumerate(nodes)}

    def _insert(self, device: DeviceSlot) -> None:
        if device.free > 0:
            self._dirty_levels.add(device.free)
        super()._insert(device)

    def _remove(self, device: DeviceSlot) -> None:
        if device.free > 0:
            self._dirty_levels.add(device.free)
        super()._remove(device)

    def _adjust(self, device: DeviceSlot, delta_milli: int, delta_memory: int) -> None:
        before = len(self._whole_free[device.node_id])
        super()._adjust(device, delta_milli, delta_memory)
        after = len(self._whole_free[device.node_id])
        if before != after:
            self._dirty_counts.update((before, after))

    def settle(self) -> None:
        """Put every set that changed since the last call back in the order a fresh build gives it."""
        for level in self._dirty_levels:
            # Whole free devices are offered through sorted lists (``_whole_best_fit``), never in set order.
            bucket = self._by_free.get(level)
            if level != FULL and bucket is not None and len(bucket) > 1:
                rebuilt: set[int] = set()
                for device_id in sorted(bucket, key=self._rank.__getitem__):
                    rebuilt.add(device_id)
                self._by_free[level] = rebuilt
        for count in self._dirty_counts:
            group = self._nodes_by_whole.get(count)
            if group is not None and len(group) > 1:
                rebuilt_nodes: set = set()
                for node_id in sorted(group, key=self._node_rank.__getitem__):
                    rebuilt_nodes.add(node_id)
                self._nodes_by_whole[count] = rebuilt_nodes
        self._dirty_levels.clear()
        self._dirty_counts.clear()


# --- the simulator ----------------------------------------------------------------------------------------------

class Simulator:
    """Advance a queue in simulated time through the scheduler's decision core.

    ``quotas``: team id -> a Quota (unsaved copies are fine: the simulator never writes). ``draw``: how each
    job's run time is taken from its quantiles (a quantile in (0, 1), or a ``random.Random`` to sample).
    ``scorers``/``hook_inputs``: the placement-score hooks and what they read (as ``schedule_pass`` loads them);
    none by default. ``preempt_delay``: seconds between a preemption and its victims giving their devices back.

    Preemption goes through :func:`strata.scheduling.services.choose_room`, which shrinks elastic jobs before
    it stops any. A cut job stops (its devices come back after ``preempt_delay``, plus ``checkpoint_write`` when
    it writes a checkpoint first) and queues again: a shrunk one with its smaller resources and its remaining
    run time scaled by its old over its new GPUs. Its lost work (``lost_gpu_seconds``) is what it ran since its
    last checkpoint: nothing when it checkpoints before it stops, everything since it started when it cannot
    checkpoint. ``preempt_only``: the baseline without shrinks or checkpoints before a stop: the victims'
    elastic declarations are hidden from the victim choice, and a stopped job is killed (it keeps what its last
    periodic checkpoint, ``SimJob.checkpoint_every``, saved)."""

    def __init__(self, nodes: list[SimNode], jobs: list[SimJob], quotas: dict | None = None, *, now: float = 0.0,
                 draw: float | random.Random = 0.5, scorers: list | None = None, hook_inputs=None,
                 max_preemptions: int = 32, preempt_delay: float = 0.0, gpu_hours_used: dict | None = None,
                 specs: dict | None = None, quantum: float = 0.0, preempt_only: bool = False,
                 checkpoint_write: float = 0.0, arrivals=None):
        self.nodes = nodes
        self.jobs = {job.id: job for job in jobs}
        self.quotas = dict(quotas or {})
        self.now = now
        self.scorers = scorers or []
        self.hook_inputs = hook_inputs
        self.max_preemptions = max_preemptions
        self.preempt_delay = preempt_delay
        self.gpu_hours_used = gpu_hours_used or {}
        self.specs = specs or {}
        # Passes run at every event (0), or on a grid of ``quantum`` seconds from ``now`` (as a beat would run
        # them): far fewer passes when thousands of jobs end at distinct times, starts late by under a quantum.
        self.quantum = quantum
        self.origin = now
        self.placements: list[Placement] = []
        self.preemptions: list[tuple[float, object, list]] = []  # (time, job id, the jobs stopped for it)
        self.shrinks: list[tuple[float, object, list]] = []  # (time, job id, [(job shrunk, its new resources)])
        self.preempt_only = preempt_only
        self.checkpoint_write = checkpoint_write
        self.lost_gpu_seconds = 0.0  # work lost to preemption (run since the victim's last checkpoint)
        self.checkpoint_gpu_seconds = 0.0  # GPU-seconds held while victims wrote checkpoints before stopping
        self.last_reasons: dict = {}
        self._sequence = 0  # admissions at one time are queued in order, as their real queued_at differ
        self._index: LiveIndex | None = None  # the free-capacity index, kept from pass to pass (capacity())
        self._held: dict = {}  # job id -> the allocations the index has taken for it
        self._view: Any = None  # admission's ClusterView (the registered nodes do not change in a simulation)
        # Later submissions (an iterator of SimJobs in submit order, Arrivals.stream): they enter as pending at
        # their submit time and leave the simulation when they end.
        self._draw = draw
        self._arrivals = arrivals
        self._next_arrival = next(arrivals, None) if arrivals is not None else None
        self._arrived: set = set()
        self._node_of = {device_id: node.id for node in nodes for device_id, _, _ in node.devices}
        self._node_of.update({node.host[0]: node.id for node in nodes if node.host is not None})
        for job in self.jobs.values():
            job.duration = (quantile_at(job.runtime, draw) if isinstance(draw, float)
                            else job.runtime.sample(draw))
            if job.state == RUNNING and job.ends is None:
                job.ends = now + job.duration
            if job.state == RUNNING and job.stopping:
                job.duration = max(job.duration, (job.ends or now) - (job.started or now))

    # -- state -> the core's input ---------------------------------------------------------------------------
    def _slots(self) -> list[NodeSlot]:
        """The nodes as index slots with every device free."""
        slots: list[NodeSlot] = []
        for node in self.nodes:
            slot = NodeSlot(id=node.id, name=node.name, labels=dict(node.labels))
            for device_id, index, memory_total in node.devices:
                slot.devices.append(DeviceSlot(id=device_id, node_id=node.id, index=index,
                                               memory_total=memory_total, free_memory=memory_total))
            if node.host is not None:
                device_id, index, cpus, memory = node.host
                slot.host = host_slot(device_id, node.id, index, cpus, memory)
            slots.append(slot)
        return slots

    def capacity(self) -> CapacityIndex:
        """The free-capacity index the next pass decides from. It is kept from pass to pass (:class:`LiveIndex`)
        rather than rebuilt: what the running jobs hold is reconciled against what the index has taken for
        them (a job that started, ended, or changed what it holds since), and the index is then the one a fresh
        build over the same state would give, down to the order in which it offers places. The pass consumes
        it: its placements take their devices from it, and the simulator records them as held."""
        index = self._index
        if index is None:
            index = self._index = LiveIndex(self._slots())
        held = self._held
        running = set()
        for job in self.jobs.values():
            if job.state == RUNNING:  # stopping ones too: their devices come back when their attempt ends
                running.add(job.id)
                taken = held.get(job.id)
                if taken is not None and taken == job.allocs:
                    continue
                if taken is not None:
                    for device_id, milli, memory in taken:
                        index.give(device_id, milli, memory)
                for device_id, milli, memory in job.allocs:
                    index.take(device_id, milli, memory)
                held[job.id] = list(job.allocs)
        for job_id in [job_id for job_id in held if job_id not in running]:
            for device_id, milli, memory in held.pop(job_id):
                index.give(device_id, milli, memory)
        index.settle()
        return index

    def fresh_capacity(self) -> CapacityIndex:
        """The index built from scratch over the present state (what :meth:`capacity` keeps incrementally)."""
        slots = self._slots()
        devices = {device.id: device for slot in slots for device in slot.devices}
        devices.update({slot.host.id: slot.host for slot in slots if slot.host is not None})
        for job in self.jobs.values():
            if job.state == RUNNING:
                for device_id, milli, memory in job.allocs:
                    devices[device_id].free -= milli
                    devices[device_id].free_memory -= memory
        return CapacityIndex(slots)

    def registered(self) -> list[NodeSlot]:
        """The nodes with every device free (what admission's ClusterView reads); built once per simulation."""
        if getattr(self, "_registered", None) is None:
            self._registered = list(CapacityIndex(self._slots()).nodes.values())
        return self._registered

    def _boost(self, team_id: int) -> int:
        quota = self.quotas.get(team_id)
        return quota.priority if quota is not None else 0

    def queues(self) -> dict[int, deque]:
        from strata.scheduling.services import order_queue

        items: dict[int, list] = defaultdict(list)
        for job in self.jobs.values():
            if job.state == QUEUED:
                items[job.team_id].append((-(job.priority + self._boost(job.team_id)), _when(job.queued_at),
                                           job.id, job.resources, job.reason, job.kind))
        return {team: deque(order_queue(team, found, self.specs)) for team, found in items.items()}

    def held(self) -> dict[int, float]:
        held: dict[int, float] = defaultdict(float)
        for job in self.jobs.values():
            if job.state == RUNNING:
                held[job.team_id] += job.share
        return held

    def state(self):
        from strata.scheduling.services import PassState, fair_weights

        queues = self.queues()
        return PassState(queues=queues, notes={}, capacity=self.capacity(), held=self.held(),
                         weight=fair_weights(self.quotas, queues), scorers=list(self.scorers),
                         hook_inputs=self.hook_inputs)

    # -- one pass ------------------------------------------------------------------------------------------------
    def admit(self) -> list:
        """Admit pending jobs as :func:`strata.quotas.services.admit_pending` does, with its own checks."""
        from strata.quotas.models import Quota
        from strata.quotas.services import ClusterView, TeamLoad, blocking_limit

        pending: dict[int, list[SimJob]] = defaultdict(list)
        for job in self.jobs.values():
            if job.state == PENDING:
                pending[job.team_id].append(job)
        if not pending:
            return []
        if self._view is None:
            self._view = ClusterView(self.registered())
        view = self._view
        admitted = []
        for team_id, jobs in pending.items():
            quota = self.quotas.get(team_id) or Quota(team_id=team_id)
            load = TeamLoad()
            for other in self.jobs.values():
                if other.team_id == team_id and other.state in (QUEUED, RUNNING):
                    load.add(_Request(other.resources),  # type: ignore[arg-type]
                             other.share if other.state == RUNNING else view.gpus(other.resources))
            window = self.gpu_hours_used.get(team_id)
            for job in sorted(jobs, key=lambda j: (-j.priority, j.created)):
                candidate = _Request(job.resources)
                problem = view.problem(job.resources)
                reason = (f"no node could ever run it: {problem}" if problem
                          else blocking_limit(quota, load, candidate, window, view))  # type: ignore[arg-type]
                if reason is None:
                    self._sequence += 1
                    job.state, job.queued_at, job.reason = QUEUED, self.now + self._sequence * 1e-6, ""
                    load.add(candidate, view.gpus(job.resources))  # type: ignore[arg-type]
                    admitted.append(job.id)
                else:
                    job.reason = f"waiting: {reason}"
        return admitted

    def step(self):
        """One scheduling pass at ``self.now``: admission, then the decision core; placements start running."""
        from strata.scheduling.services import choose_room, decide

        self.admit()
        state = self.state()
        if not state.queues:
            self.last_reasons = {}
            return None

        rows: list = []

        def preempt(job_id, priority, resources, selector, capacity):
            # Exact shortcut: with no running job that is stopping or of lower effective priority, choose_room
            # finds no plan.
            if not any(job.state == RUNNING and (job.stopping or job.priority + self._boost(job.team_id) < priority)
                       for job in self.jobs.values()):
                return None
            if not rows:
                rows.extend(self._active())
            room = choose_room(rows, priority, resources, selector, capacity, self.quotas)
            if room is None:
                return None
            cuts = room.cuts
            if cuts:
                rows.clear()  # the victims are stopping now
            for cut in cuts:
                self._cut(cut)
            stopped = [cut.job_id for cut in cuts if not cut.shrink]
            if stopped:
                self.preemptions.append((self.now, job_id, stopped))
            shrunk = [(cut.job_id, dict(cut.resources)) for cut in cuts if cut.shrink]
            if shrunk:
                self.shrinks.append((self.now, job_id, shrunk))
            return room

        decisions = decide(state, preempt, self.max_preemptions)
        for job_id, taken, share in decisions.placements:
            job = self.jobs[job_id]
            job.state, job.started, job.share, job.attempts = RUNNING, self.now, share, job.attempts + 1
            job.ends = self.now + job.duration
            job.allocs = [(slot.id, milli, memory) for _, slot, milli, memory in taken]
            job.ranks = [rank for rank, _, _, _ in taken]
            self._held[job_id] = list(job.allocs)  # the pass took them from the index already
            self.placements.append(Placement(self.now, job_id, taken[0][1].node_id,
                                             tuple(slot.id for _, slot, _, _ in taken)))
        for job_id, why in decisions.reasons.items():
            self.jobs[job_id].reason = why
        self.last_reasons = dict(decisions.reasons)
        return decisions

    def _active(self) -> list[tuple]:
        """The running jobs' allocations as ``choose_victims`` reads the active allocations (in the preempt-only
        baseline, with each job's elastic declaration hidden: nobody is shrunk)."""
        rows = []
        for job in self.jobs.values():
            if job.state == RUNNING:
                state = "preempted" if job.stopping else "running"
                resources = {**job.resources, "elastic": {}} if self.preempt_only else job.resources
                ranks = job.ranks if len(job.ranks) == len(job.allocs) else [0] * len(job.allocs)
                for (device_id, milli, memory), rank in zip(job.allocs, ranks, strict=True):
                    rows.append((f"{job.id}#{job.attempts}", job.id, job.priority, job.team_id, state,
                                 _when(job.started or 0.0), device_id, milli / FULL, memory, job.kind, job.share,
                                 resources, rank))
        return rows

    def _cut(self, cut) -> None:
        """A job the victim choice stops or shrinks (a ``services.Cut``): it stops now, after writing a checkpoint
        when it can (not in the preempt-only baseline: it is killed), and queues again when its devices are back."""
        job = self.jobs[cut.job_id]
        saves = job.can_checkpoint and not self.preempt_only
        writing = self.checkpoint_write if saves else 0.0
        job.stopping = job.requeue = True
        job.cut_at, job.saves, job.ends = self.now, saves, self.now + self.preempt_delay + writing
        job.resize = dict(cut.resources) if cut.shrink else None
        if cut.shrink:
            job.shrinks += 1
        else:
            job.stops += 1
        self.checkpoint_gpu_seconds += writing * job.share

    def _requeue(self, job: SimJob) -> None:
        """A stopped job queues again: with the run time it has left after what it kept (all of it when it wrote
        a checkpoint as it stopped; up to its last periodic checkpoint when killed; nothing when it cannot
        checkpoint), scaled to its new GPUs when it was shrunk. What it did not keep is lost work."""
        started = job.started if job.started is not None else self.now
        ran = max((job.cut_at if job.cut_at is not None else self.now) - started, 0.0)
        if not job.can_checkpoint:
            kept = 0.0
        elif job.saves or not job.checkpoint_every:
            kept = ran
        else:
            kept = math.floor(ran / job.checkpoint_every + 1e-9) * job.checkpoint_every
        lost = (ran - kept) * job.share
        job.lost += lost
        self.lost_gpu_seconds += lost
        left = max(job.duration - kept, 0.0)
        if job.resize is not None:
            before, after = _total_gpus(job.resources), _total_gpus(job.resize)
            if before > 0 and after > 0:
                left *= before / after  # a smaller share runs proportionally slower
            job.resources = job.resize
        job.duration = left
        self._sequence += 1
        job.state, job.queued_at, job.reason = QUEUED, self.now + self._sequence * 1e-6, ""
        job.stopping = job.requeue = False
        job.cut_at, job.saves, job.resize = None, True, None

    # -- time ------------------------------------------------------------------------------------------------------
    def next_event(self) -> float | None:
        times = [job.ends for job in self.jobs.values() if job.state == RUNNING and job.ends is not None]
        times += [job.submit for job in self.jobs.values() if job.state == "future" and job.submit is not None]
        if self._next_arrival is not None:
            times.append(self._next_arrival.submit)
        if not times:
            return None
        upcoming = min(times)
        if self.quantum > 0:
            upcoming = self.origin + math.ceil((upcoming - self.origin) / self.quantum - 1e-9) * self.quantum
        return upcoming

    def advance(self, when: float) -> None:
        """Move the clock to ``when``: jobs that end by then end, preempted ones give back their devices (and
        queue again with the run time they had left), submissions by then enter the queue as pending."""
        self.now = max(self.now, when)
        for job in self.jobs.values():
            if job.state == RUNNING and job.ends is not None and job.ends <= self.now:
                if job.requeue:  # preempted or shrunk: it queues again, from its checkpoint if it has one
                    self._requeue(job)
                else:
                    job.state, job.ended = DONE, self.now
                job.allocs, job.ranks, job.share, job.ends = [], [], 0.0, None
            elif job.state == "future" and job.submit is not None and job.submit <= self.now:
                job.state, job.created = PENDING, job.submit
        if self._arrived:
            for job_id in [job_id for job_id in self._arrived if self.jobs[job_id].state == DONE]:
                self._arrived.discard(job_id)
                del self.jobs[job_id]
        while self._next_arrival is not None and self._next_arrival.submit <= self.now:
            job = self._next_arrival
            job.state, job.created = PENDING, job.submit or self.now
            job.duration = (quantile_at(job.runtime, self._draw) if isinstance(self._draw, float)
                            else job.runtime.sample(self._draw))
            self.jobs[job.id] = job
            self._arrived.add(job.id)
            self._next_arrival = next(self._arrivals, None) if self._arrivals is not None else None

    def run(self, *, until: float | None = None, watch: set | None = None, max_passes: int = 100_000) -> dict:
        """Pass, advance, pass... until nothing is left to happen, ``until`` (simulated seconds), or every job
        in ``watch`` started. Returns job id -> simulated start of the jobs that started."""
        for job in self.jobs.values():
            if job.submit is not None and job.submit > self.now and job.state in (PENDING, QUEUED):
                job.state = "future"
        starts: dict = {}
        for _ in range(max_passes):
            before = len(self.placements)
            self.step()
            for placement in self.placements[before:]:
                starts.setdefault(placement.job_id, placement.time)
            if watch is not None and watch <= set(starts):
                break
            upcoming = self.next_event()
            if upcoming is None or (until is not None and upcoming > until):
                break
            self.advance(upcoming)
        return starts


# --- later arrivals ------------------------------------------------------------------------------------------

@dataclass
class Arrivals:
    """Jobs submitted after an estimate is made, as its simulations sample them: per team, a Poisson process of
    ``rates[team]`` jobs per second (one rate, or a list of rates, one per equal slice of ``period`` seconds from
    the epoch: a daily profile), each job a copy of one of ``mix[team]``, the team's recent jobs as
    ``(kind, resources, priority, RunTime)``, drawn at random. :meth:`learn` takes both from recent submissions."""

    rates: dict
    mix: dict
    period: float = 86400.0

    def rate_at(self, team, moment: float) -> float:
        rate = self.rates.get(team, 0.0)
        if isinstance(rate, list | tuple):
            return float(rate[int(moment // (self.period / len(rate))) % len(rate)]) if rate else 0.0
        return float(rate)

    def stream(self, rng: random.Random, start: float, prefix: str = "+"):
        """The arrivals after ``start``, in submit order, without end (the simulation stops pulling them): SimJobs
        with ids ``prefix`` + a number, ``submit`` set, the state "future"."""
        teams = sorted((team for team in self.rates if self.mix.get(team)), key=str)
        profiles = [len(rate) for team in teams if isinstance(rate := self.rates[team], list | tuple) and rate]
        slice_ = self.period / math.lcm(*profiles) if profiles else math.inf  # the rates change at its bounds

        def positive(rate) -> bool:
            return any(value > 0 for value in rate) if isinstance(rate, list | tuple) else rate > 0

        if not any(positive(self.rates[team]) for team in teams):
            return
        moment, number = start, 0
        while True:
            end = (math.floor(moment / slice_) + 1) * slice_ if profiles else math.inf
            if end <= moment:
                end += slice_
            rates = [self.rate_at(team, moment) for team in teams]
            total = sum(rates)
            if total <= 0:
                moment = end
                continue
            following = moment + rng.expovariate(total)
            if following >= end:  # the rates change at ``end``: the process starts afresh there (memoryless)
                moment = end
                continue
            moment = following
            team = rng.choices(teams, weights=rates)[0]
            kind, resources, priority, runtime = rng.choice(self.mix[team])
            number += 1
            yield SimJob(id=f"{prefix}{number}", team_id=team, kind=kind, resources=dict(resources), runtime=runtime,
                         priority=priority, state="future", submit=moment, created=moment)

    @classmethod
    def learn(cls, rows: list[tuple], since: float, until: float, *, bins: int = 0, period: float = 86400.0,
              smooth: int = 1) -> Arrivals:
        """From the jobs submitted in ``[since, until)`` (rows ``(team id, submit seconds, kind, resources,
        priority, RunTime)``): each team's rate (its jobs over the window), and its jobs as its mix. ``bins`` > 0:
        the rate follows the time of day, the share of all teams' submissions in each of ``bins`` slices of
        ``period`` (averaged over ``smooth`` slices either side), for a window of whole periods."""
        span = max(until - since, 1.0)
        counts: dict = defaultdict(int)
        mix: dict = defaultdict(list)
        slices = [0.0] * bins
        for team, submit, kind, resources, priority, runtime in rows:
            if not since <= submit < until:
                continue
            counts[team] += 1
            mix[team].append((kind, dict(resources), priority, runtime))
            if bins:
                slices[int(submit // (period / bins)) % bins] += 1
        profile: list[float] | None = None
        if bins and sum(slices) > 0:
            smoothed = [sum(slices[(i + k) % bins] for k in range(-smooth, smooth + 1)) / (2 * smooth + 1)
                        for i in range(bins)]
            mean = sum(smoothed) / bins
            profile = [value / mean for value in smoothed]
        rates: dict = {}
        for team, count in counts.items():
            rates[team] = [count / span * weight for weight in profile] if profile else count / span
        return cls(rates=rates, mix=dict(mix), period=period)


# --- run-time predictions --------------------------------------------------------------------------------------

def total_steps(spec: dict) -> float | None:
    """The steps a job's spec says it runs in all (``max_steps``, ``total_steps``, ``steps``, or
    ``epochs`` × ``steps_per_epoch``, at the top or one level down), or None."""
    for scope in [spec, *[value for value in spec.values() if isinstance(value, dict)]]:
        for key in ("max_steps", "total_steps", "steps"):
            value = scope.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                return float(value)
        epochs, per_epoch = scope.get("epochs"), scope.get("steps_per_epoch")
        if isinstance(epochs, int | float) and isinstance(per_epoch, int | float) and epochs > 0 and per_epoch > 0:
            return float(epochs * per_epoch)
    return None


def progress_remaining(total: float, points: list[tuple[float, float]]) -> float | None:
    """Seconds left for a job that must reach ``total`` steps, from its ``(time, step)`` points: the steps left
    over the rate between the first and the last point; None without two distinct points."""
    if len(points) < 2:
        return None
    (t0, s0), (t1, s1) = min(points), max(points)
    if t1 <= t0 or s1 <= s0:
        return None
    return max(total - s1, 0.0) / ((s1 - s0) / (t1 - t0))


class HistoryModel:
    """Run-time quantiles learned from finished jobs: per team, a gradient-boosting quantile regressor per
    quantile (scikit-learn's ``GradientBoostingRegressor(loss="quantile")``) over the job's kind, its command's
    hash, GPUs, workers, CPUs and time limit; the team's history is used when it has ``minimum`` jobs, the whole
    cluster's otherwise (None below that)."""

    minimum = 20

    def __init__(self, rows: list[tuple]):
        """``rows``: ``(team id, kind, command, resources, time_limit, seconds it ran)``."""
        self.models: dict = {}
        by_team: dict = defaultdict(list)
        for row in rows:
            by_team[row[0]].append(row)
        for team, found in by_team.items():
            if len(found) >= self.minimum:
                self.models[team] = self._fit(found)
        if len(rows) >= self.minimum:
            self.models[None] = self._fit(rows)

    @staticmethod
    def features(kind: str, command: str, resources: dict, time_limit: float) -> list[float]:
        import zlib

        return [float(zlib.crc32(kind.encode()) % 9973), float(zlib.crc32(command.encode()) % 9973),
                float(resources.get("gpus", 0) or 0), float(resources.get("workers", 1) or 1),
                float(resources.get("cpus", 0) or 0), math.log1p(float(time_limit or 0))]

    def _fit(self, rows: list[tuple]) -> dict:
        from sklearn.ensemble import GradientBoostingRegressor

        x = [self.features(kind, command, resources, limit) for _, kind, command, resources, limit, _ in rows]
        y = [seconds for *_, seconds in rows]
        models = {}
        for q in QUANTILES:
            model = GradientBoostingRegressor(loss="quantile", alpha=q, n_estimators=60, max_depth=3,
                                              learning_rate=0.1, random_state=0)
            model.fit(x, y)
            models[q] = model
        return models

    def predict(self, team_id, kind: str, command: str, resources: dict, time_limit: float) -> RunTime | None:
        models = self.models.get(team_id) or self.models.get(None)
        if not models:
            return None
        x = [self.features(kind, command, resources, time_limit)]
        values = sorted(max(float(models[q].predict(x)[0]), 1.0) for q in QUANTILES)
        if time_limit:
            values = [min(value, float(time_limit)) for value in values]
        return RunTime(values[0], values[1], values[2], "history")


def runtime_for(*, time_limit: float, elapsed: float = 0.0, total: float | None = None,
                points: list | None = None, history: RunTime | None = None) -> RunTime:
    """A job's run time left (all of it for a waiting job, ``elapsed`` seconds into a running one): from its
    progress when its spec states its total steps and its metric points give a rate; else the history model's
    quantiles (past what it ran already); else its time limit."""
    left = max(float(time_limit) - elapsed, 0.0)
    if total is not None and points:
        remaining = progress_remaining(total, points)
        if remaining is not None:
            remaining = min(remaining, left) if time_limit else remaining
            return RunTime.exact(remaining, "progress")
    if history is not None:
        values = [max(value - elapsed, 0.0) for value in (history.p10, history.p50, history.p90)]
        if values[2] > 0:
            # A job that ran past a quantile is not done yet: at least a little is left, up to its time limit.
            floor = min(left, 0.05 * max(history.p50, 1.0))
            values = [max(value, floor) for value in values]
            return RunTime(values[0], values[1], values[2], "history")
    return RunTime.exact(left, "time_limit")


# --- estimates ---------------------------------------------------------------------------------------------------

@dataclass
class Estimate:
    """A waiting job's expected start, simulated seconds: the median and the 80 % interval (10th to 90th
    percentile), or None past the horizon; and the jobs whose end it waited for in the median run."""

    start: float | None
    low: float | None
    high: float | None
    waits_for: list = field(default_factory=list)


@dataclass(frozen=True)
class WaitCalibration:
    """The 80 % interval recalibrated from how earlier estimates held (split conformal, on waits): for recorded
    pairs (estimated wait, actual wait), the ratios (actual + OFFSET) / (estimated + OFFSET); the interval of a new
    estimate is its estimated wait (plus OFFSET) times their 10th and 90th percentiles (less OFFSET). Where the
    queue's later arrivals or run-time noise make the simulated spread too narrow, the recorded ratios widen it;
    the median start stays the simulator's. ``OFFSET`` keeps waits near zero from dominating."""

    low: float
    high: float
    pairs: int

    OFFSET = 300.0
    MIN_PAIRS = 30

    @classmethod
    def learn(cls, pairs: list[tuple[float, float]]) -> WaitCalibration | None:
        """From ``(estimated wait, actual wait)`` seconds; None with fewer than :attr:`MIN_PAIRS`."""
        ratios = [(max(actual, 0.0) + cls.OFFSET) / (max(estimated, 0.0) + cls.OFFSET) for estimated, actual in pairs]
        if len(ratios) < cls.MIN_PAIRS:
            return None
        return cls(_percentile(ratios, 0.1), _percentile(ratios, 0.9), len(ratios))

    def interval(self, now: float, start: float) -> tuple[float, float]:
        """The recalibrated ``(low, high)`` of an estimated ``start`` made at ``now`` (simulated seconds)."""
        wait = max(start - now, 0.0) + self.OFFSET
        return now + max(wait * self.low - self.OFFSET, 0.0), now + max(wait * self.high - self.OFFSET, 0.0)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    if fraction == 0 or ordered[above] == ordered[below]:
        return ordered[below]
    if math.isinf(ordered[above]):
        return math.inf
    return ordered[below] + (ordered[above] - ordered[below]) * fraction


def _copy_jobs(jobs: list[SimJob]) -> list[SimJob]:
    return [replace(job, allocs=list(job.allocs), resources=dict(job.resources), ranks=list(job.ranks))
            for job in jobs]


def estimate(nodes: list[SimNode], jobs: list[SimJob], quotas: dict | None = None, *, now: float = 0.0,
             targets: set | None = None, samples: int = 32, seed: int = 0, horizon: float = 7 * 86400.0,
             arrivals: Arrivals | None = None, **options) -> dict:
    """Start-time estimates of the waiting jobs (``targets``: of those only): one simulation with every run time
    at its median (the ``waits_for`` of each job, and its start when every run time is exact and nothing else
    arrives), then ``samples`` simulations with run times drawn from their quantiles and, with ``arrivals``, later
    submissions drawn from each team's recent rate and jobs (a job of an under-served team submitted later may
    start first); the median and the 10th and 90th percentiles of each job's simulated starts. A job that does not
    start within ``horizon`` seconds has None."""
    waiting = {job.id for job in jobs if job.state in (PENDING, QUEUED)}
    targets = waiting if targets is None else targets & waiting
    if not targets:
        return {}
    median = Simulator(nodes, _copy_jobs(jobs), quotas, now=now, draw=0.5, **options)
    ends_before: dict = {}
    starts = median.run(until=now + horizon, watch=targets)
    for job_id in targets:
        if job_id in starts:
            ended = [other.id for other in median.jobs.values()
                     if other.id not in waiting and other.ended is not None and other.ended <= starts[job_id]]
            ended.sort(key=lambda other: -(median.jobs[other].ended or 0.0))
            ends_before[job_id] = ended[:3]
    exact = arrivals is None and all(job.runtime.p10 == job.runtime.p90 for job in jobs)
    draws: dict = defaultdict(list)
    if exact:
        for job_id in targets:
            draws[job_id] = [starts[job_id]] if job_id in starts else []
    else:
        rng = random.Random(seed)
        for _ in range(samples):
            draw = random.Random(rng.random())
            later = arrivals.stream(random.Random(rng.random()), now) if arrivals is not None else None
            run = Simulator(nodes, _copy_jobs(jobs), quotas, now=now, draw=draw, arrivals=later, **options)
            found = run.run(until=now + horizon, watch=targets)
            for job_id in targets:
                draws[job_id].append(found.get(job_id, math.inf))
    answers = {}
    for job_id in targets:
        values = draws[job_id]
        finite = [value for value in values if value != math.inf]
        if not values or len(finite) * 2 < len(values):
            answers[job_id] = Estimate(None, None, None, ends_before.get(job_id, []))
            continue
        high = _percentile(values, 0.9)
        answers[job_id] = Estimate(_percentile(values, 0.5), _percentile(values, 0.1),
                                   None if math.isinf(high) else high, ends_before.get(job_id, []))
    return answers


def placed_now(sim: Simulator, job_id) -> bool:
    """Whether one pass of the core at ``sim.now`` places ``job_id`` (no preemption: the question is what fits)."""
    sim.max_preemptions = 0
    before = len(sim.placements)
    sim.step()
    return any(placement.job_id == job_id for placement in sim.placements[before:])


def run_now_options(nodes: list[SimNode], jobs: list[SimJob], quotas: dict | None, job_id, *, now: float = 0.0,
                    pauses: int = 5, **options) -> list[dict]:
    """What would make ``job_id`` run now, each found by one pass of the core on a modified copy of the state:
    a smaller share (fewer GPUs or workers, or a smaller fraction), another pool (without its node labels), a
    lower-priority running job of its team paused, or a quota limit raised (a pending job)."""
    from strata.quotas.services import quota_limit

    def trial(change=None, drop=None, quota_change=None) -> bool:
        copies = _copy_jobs([job for job in jobs if job.id != drop])
        for copy in copies:
            if copy.id == job_id and change:
                copy.resources = change(dict(copy.resources))
        trial_quotas = dict(quotas or {})
        if quota_change is not None:
            team, limit = quota_change
            quota = trial_quotas.get(team)
            if quota is not None:
                changed = replace_quota(quota)
                setattr(changed, limit, None)
                trial_quotas[team] = changed
        sim = Simulator(nodes, copies, trial_quotas, now=now, **options)
        return placed_now(sim, job_id)

    target = next(job for job in jobs if job.id == job_id)
    found: list[dict] = []
    resources = target.resources
    gpus, workers = float(resources.get("gpus", 0) or 0), int(resources.get("workers", 1) or 1)
    smaller = []
    if workers > 1:
        smaller += [{**resources, "workers": count} for count in range(workers - 1, 0, -1)]
    if gpus > 1:
        smaller += [{**resources, "gpus": float(count)} for count in range(int(gpus) - 1, 0, -1)]
    elif 0 < gpus <= 1:
        smaller += [{**resources, "gpus": share} for share in (0.75, 0.5, 0.25) if share < gpus]
    for option in smaller:
        if trial(change=lambda _, option=option: dict(option)):
            found.append({"kind": "smaller_share", "resources": {key: option[key] for key in ("gpus", "workers")
                                                                 if key in option},
                          "text": f"{option.get('workers', 1)} worker(s) of {option.get('gpus', 0):g} GPU"})
            break
    if resources.get("node_labels"):
        def unlabelled(found_resources: dict) -> dict:
            found_resources.pop("node_labels", None)
            return found_resources
        if trial(change=unlabelled):
            found.append({"kind": "other_pool", "text": "without its node labels "
                                                        f"{resources['node_labels']} (another pool has room)"})
    priority = target.priority
    lower = sorted((job for job in jobs if job.team_id == target.team_id and job.state == RUNNING
                    and job.priority < priority), key=lambda job: (job.priority, -(job.started or 0.0)))
    for victim in lower[:pauses]:
        if trial(drop=victim.id):
            found.append({"kind": "pause", "job": str(victim.id), "text": f"pausing job {victim.id} of the team "
                                                                          f"(priority {victim.priority})"})
            break
    if target.state == PENDING:
        limit = quota_limit(target.reason.removeprefix("waiting: "))
        if limit is not None and limit != "gpu_hours" and trial(quota_change=(target.team_id, limit)):
            found.append({"kind": "quota", "limit": limit, "text": f"a larger {limit} for the team"})
    return found


def replace_quota(quota):
    """An unsaved copy of a Quota (what-if changes never touch the stored one)."""
    from strata.quotas.models import Quota

    copy = Quota(**{f.attname: getattr(quota, f.attname) for f in Quota._meta.concrete_fields})
    copy.pk = None
    return copy
