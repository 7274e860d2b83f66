"""The scheduler: admission, fair-share ordering, placement, preemption, dispatch, reaping, reconciling.

One pass runs under a cluster-wide lock (a PostgreSQL advisory lock; SQLite's IMMEDIATE write lock),
so passes triggered by submits and by the beat tick never interleave.
"""

from __future__ import annotations

import heapq
import json
import logging
import secrets
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Max, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from strata.cluster.capacity import (
    FULL,
    CapacityIndex,
    DeviceSlot,
    NodeSlot,
    cpu_request,
    gpu_free,
    host_slot,
)
from strata.cluster.models import LIVE_STATES, Device, Node, gpu_devices
from strata.jobs import history
from strata.jobs.elastic import elastic_floor
from strata.jobs.models import Allocation, Attempt, Job, JobEvent, JobState
from strata.jobs.node_work import release_node_attempts
from strata.jobs.participants import participants_expire
from strata.jobs.states import InvalidTransition, transition
from strata.quotas.models import Quota
from strata.quotas.services import admit_pending, teams_with_pending
from strata.telemetry.metrics import timed_pass

log = logging.getLogger(__name__)
S = JobState
_LOCK_KEY = 0x5757A7A
_CHUNK = 500  # ids per IN (...) list: well under SQLite's bound-parameter limit


@dataclass
class PassResult:
    admitted: int = 0
    placed: int = 0
    preempted: int = 0
    waiting: int = 0
    seconds: float = 0.0
    dispatches: list[tuple[str, str, str]] = field(default_factory=list)  # (queue, attempt id, token)


def _lock() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])


def load_capacity(now=None) -> CapacityIndex:
    now = now or timezone.now()
    nodes, offers = {}, {}
    for node in Node.objects.filter(state=Node.State.UP, lease_expires_at__gt=now).only(
            "id", "name", "labels", "cpus", "memory"):
        nodes[node.id] = NodeSlot(id=node.id, name=node.name, labels=node.labels or {})
        offers[node.id] = (node.cpus, node.memory)
    devices = {}
    for device_id, node_id, index, kind, memory_total in Device.objects.filter(node_id__in=list(nodes)).values_list(
        "id", "node_id", "index", "kind", "memory_total"
    ):
        if kind == Device.Kind.CPU:  # the node's CPUs and host memory: what jobs that reserve CPUs take
            cpus, memory = offers[node_id]
            if cpus:
                devices[device_id] = nodes[node_id].host = host_slot(device_id, node_id, index, cpus, memory)
            continue
        slot = DeviceSlot(id=device_id, node_id=node_id, index=index, memory_total=memory_total,
                          free_memory=memory_total)
        devices[device_id] = slot
        nodes[node_id].devices.append(slot)
    # A node's free CPUs and memory: what it reported, less what the active attempts hold on its CPU device.
    for device_id, share, memory in Allocation.objects.filter(active=True, nested=False,
                                                              device_id__in=list(devices)).values_list(
        "device_id", "share", "memory"
    ):
        slot = devices[device_id]
        slot.free -= round(share * FULL)
        slot.free_memory -= memory
    return CapacityIndex(list(nodes.values()))


# How many of the most recent measured attempts a pass reads for resource-estimate hooks (Demand.profile_memory:
# what jobs of the same kind and spec measured). It bounds the pass's work however long the history grows.
PROFILE_WINDOW = 5000


class _CanonicalSpecs(dict):
    """A spec's JSON text as the database returns it -> its canonical JSON (keys sorted, no spaces), so that
    identical specs compare equal whatever their key order; each distinct text is parsed once."""

    def __missing__(self, text: str) -> str:
        self[text] = canonical = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        return canonical


def _measured_memory() -> dict:
    """Queued jobs whose earlier attempts a plugin measured (``Attempt.measured_memory``, from the report
    channel): job id -> the most device memory one measured."""
    measured: dict = {}
    rows = (Attempt.objects.filter(job__state=S.QUEUED, measured_memory__isnull=False)
            .values_list("job_id", "measured_memory"))
    for job_id, total in rows:
        if total > measured.get(job_id, 0):
            measured[job_id] = total
    return measured


def _measured_profiles(canonical: _CanonicalSpecs) -> dict:
    """(kind, canonical spec) -> the most device memory one of the PROFILE_WINDOW most recent measured
    attempts (running ones first, then by end, newest first) of a job of that kind and spec measured, in any
    team: memory sizes are not secret, and specs are equal only when identical."""
    profiles: dict = {}
    # Only the number and the spec's text come back: parsing 5,000 JSON documents was half the cost.
    rows = (Attempt.objects.filter(measured_memory__isnull=False)
            .annotate(spec_text=Cast("job__spec", TextField()))
            .order_by(F("ended_at").desc(nulls_first=True))
            .values_list("job__kind", "spec_text", "measured_memory")[:PROFILE_WINDOW])
    for kind, text, total in rows:
        if total > 0:
            key = (kind, canonical[text])
            if total > profiles.get(key, 0):
                profiles[key] = total
    return profiles


@dataclass
class _Queue:
    """The queued jobs of each team in the core's order (after the queue-order hooks), and job id -> the note of
    a resource-estimate hook that changed what the job reserves."""

    by_team: dict[int, deque]
    notes: dict


def _queue_by_team(quotas: dict[int, Quota]) -> _Queue:
    """Each team's queued jobs in priority order: ``(-(priority + boost), queued_at, id, resources, reason,
    kind)``, with the resources the plugins' resource-estimate hooks say the job reserves."""
    from components.runtime.contract import registry
    from components.runtime.contract.policies import ResourceEstimate

    estimators = registry.hooks(ResourceEstimate)
    queues: dict[int, list] = defaultdict(list)
    notes: dict = {}
    rows = Job.objects.filter(state=S.QUEUED, nested=False, held=False)
    fields = ["id", "team_id", "priority", "queued_at", "resources", "reason", "kind"]
    estimate = _estimator(estimators, rows) if estimators else None
    if estimate is not None and estimate.by_spec:  # specs matter only then; fetched as text, not parsed
        rows, fields = rows.annotate(spec_text=Cast("spec", TextField())), [*fields, "spec_text"]
    for job_id, team_id, priority, queued_at, resources, reason, kind, *spec_text in rows.values_list(*fields):
        if estimate is not None:
            answer = estimate(job_id, team_id, kind, resources, spec_text[0] if spec_text else None)
            if answer is not None:
                resources = answer.resources
                if answer.note:
                    notes[job_id] = answer.note
        boost = quotas[team_id].priority if team_id in quotas else 0
        queues[team_id].append((-(priority + boost), queued_at, job_id, resources, reason, kind))
    return _Queue({team: deque(order_queue(team, items)) for team, items in queues.items()}, notes)


def order_queue(team_id: int, items: list[tuple], specs: dict | None = None) -> list[tuple]:
    """One team's queued items in the core's order: priority (with the team's boost), then queued time, then the
    plugins' queue-order hooks. ``specs`` (job id -> spec) spares the database read of the specs a hook sees."""
    return _hooked_order(team_id, sorted(items, key=lambda item: (item[0], item[1])), specs)


class _estimator:
    """Asks the resource-estimate hooks about one queued job at a time, with what was measured: the job's own
    attempts, and recent jobs of its kind and spec (``by_spec``: kinds for which that exists)."""

    def __init__(self, hooks: list, rows):
        from components.runtime.contract.policies import Demand, estimate

        self.demand, self.estimate = Demand, estimate
        self.hooks = hooks
        self.canonical = _CanonicalSpecs()
        self.measured = _measured_memory()
        self.profiles = _measured_profiles(self.canonical)
        self.by_spec = {kind for kind, _ in self.profiles}
        self.largest = gpu_devices().aggregate(largest=Max("memory_total"))["largest"] or 0
        self.applies: dict[str, bool] = {}
        self.answers: dict = {}

    def __call__(self, job_id, team_id: int, kind: str, resources: dict, spec_text: str | None):
        if kind not in self.applies:
            self.applies[kind] = any(hook.applies(kind) for hook in self.hooks)
        if not self.applies[kind]:
            return None
        profile = 0
        if spec_text is not None and kind in self.by_spec:
            profile = self.profiles.get((kind, self.canonical[spec_text]), 0)
        measured = self.measured.get(job_id, 0)
        # A sweep's jobs ask the same question: same kind, resources and measurements, same answer.
        try:
            key = (kind, measured, profile, tuple(sorted(resources.items())))
            hash(key)
        except TypeError:  # a nested value (node_labels)
            key = (kind, measured, profile, json.dumps(resources, sort_keys=True, default=str))
        if key not in self.answers:
            self.answers[key] = self.estimate(self.demand(
                kind=kind, resources=dict(resources), measured_memory=measured, profile_memory=profile,
                largest_device_memory=self.largest), self.hooks)
        return self.answers[key]


def _hooked_order(team_id: int, items: list[tuple], known: dict | None = None) -> list[tuple]:
    """One team's queue after the plugins' queue-order hooks (``components.runtime.contract.policies.QueueOrder``): each
    permutes only its own kinds' jobs within a priority level. Unchanged when no plugin has such a hook."""
    from components.runtime.contract import registry
    from components.runtime.contract.policies import QueueOrder, reorder

    hooks = registry.hooks(QueueOrder)
    if not hooks or len(items) < 2:
        return items
    mine = [item for item in items if any(hook.applies(item[5]) for hook in hooks)]
    if len(mine) < 2:
        return items
    by_id = {str(item[2]): item for item in items}
    specs = known if known is not None else _specs([item[2] for item in mine])
    views = [_view(team_id, item, specs.get(item[2])) for item in items]
    return [by_id[view.id] for view in reorder(views, hooks)]


def _specs(job_ids: list) -> dict:
    """job id -> spec, for the few jobs a hook must see whole."""
    found: dict = {}
    for start in range(0, len(job_ids), _CHUNK):
        found.update(Job.objects.filter(pk__in=job_ids[start:start + _CHUNK]).values_list("id", "spec"))
    return found


def _view(team_id: int, item: tuple, spec: dict | None):
    """What a hook sees of a queued job (``components.runtime.contract.policies.QueuedJob``)."""
    from components.runtime.contract.policies import QueuedJob

    return QueuedJob(id=str(item[2]), team_id=team_id, kind=item[5], priority=-item[0],
                     queued_at=item[1].timestamp() if item[1] else 0.0, resources=dict(item[3]),
                     spec=dict(spec or {}))


class _HookInputs:
    """What the placement hooks see, read once per pass rather than once per job: the specs of the queued jobs
    whose kind a hook applies to (one bulk read), and the nodes' latest plugin reports (read on first use)."""

    def __init__(self, queues: dict, hooks: list):
        self._reports: dict | None = None
        self._keys: dict = {}
        self.hooks = self.relevant(hooks)
        wanted = [item[2] for queue in queues.values() for item in queue
                  if any(hook.applies(item[5]) for hook in self.hooks)]
        self.specs = _specs(wanted) if wanted else {}

    def relevant(self, hooks: list) -> list:
        """The hooks with something to go on this pass: those that read no particular plugin's node reports
        (``PlacementScore.reads``), and those whose plugin some node reports."""
        if all(hook.reads is None for hook in hooks):
            return hooks
        self.reports(None)  # loads every node's reports once
        present = {plugin for reports in self._reports.values() for plugin in reports}
        return [hook for hook in hooks if hook.reads is None or hook.reads in present]

    def node_key(self, node_id) -> str:
        key = self._keys.get(node_id)
        if key is None:
            key = self._keys[node_id] = str(node_id)
        return key

    def reports(self, node_id) -> dict:
        if self._reports is None:
            self._reports = {}
            for found, stored in Node.objects.values_list("id", "reports"):
                self._reports[found] = {plugin: (entry or {}).get("payload") for plugin, entry in (stored or {}).items()
                                        if isinstance(entry, dict) and entry.get("payload") is not None}
        return self._reports.get(node_id) or {}


def _chooser(team_id: int, item: tuple, hooks: list, capacity: CapacityIndex, inputs: _HookInputs):
    """``choose(rank, options)`` for CapacityIndex.place: the plugins' placement-score hooks pick among the
    places that fit (best fit first); None when no hook applies to the job's kind or wants the job
    (``PlacementScore.wants``), so such a job costs no candidate list."""
    if not any(hook.applies(item[5]) for hook in hooks):
        return None
    from components.runtime.contract.policies import Candidate, best, wanting

    view = _view(team_id, item, inputs.specs.get(item[2]))
    hooks = [hook for hook in hooks if hook.applies(item[5]) and wanting(hook, view)]
    if not hooks:
        return None

    def choose(rank: int, options: list) -> int | None:
        candidates = []
        for option in options:
            device = option[0][0]
            node = capacity.nodes[device.node_id]
            if device.cpu:  # a worker that holds no GPU: only its node (and its host memory) to go on
                candidates.append(Candidate(
                    rank=rank, node_id=inputs.node_key(node.id), node=node.name, labels=dict(node.labels),
                    devices=(), share=0.0, memory=0, free_share=0.0, free_memory=device.free_memory,
                    memory_total=device.memory_total, reports=dict(inputs.reports(device.node_id))))
                continue
            candidates.append(Candidate(
                rank=rank, node_id=inputs.node_key(node.id), node=node.name, labels=dict(node.labels),
                devices=tuple(slot.index for slot, _, _ in option), share=option[0][1] / FULL,
                memory=option[0][2], free_share=device.free / FULL, free_memory=device.free_memory,
                memory_total=device.memory_total, reports=dict(inputs.reports(device.node_id))))
        return best(view, candidates, hooks)

    return choose


def _held_by_team() -> dict[int, float]:
    held: dict[int, float] = defaultdict(float)
    for team_id, share in Attempt.objects.filter(ended_at__isnull=True).values_list("job__team_id", "gpu_share"):
        held[team_id] += share
    return held


@dataclass
class PassState:
    """What the decision core of a pass decides from: plain data, loaded from the database by
    :func:`schedule_pass` and built from simulated state by the queue simulator (``strata.scheduling.foresight``).

    ``queues``: team -> its queued jobs in the core's order (:func:`order_queue`), items
    ``(-(priority + boost), queued_at, id, resources, reason, kind)``; ``notes``: job id -> a resource-estimate
    hook's note; ``held``: team -> the GPU share its live attempts hold; ``weight``: team -> fair-share weight."""

    queues: dict[int, deque]
    notes: dict
    capacity: CapacityIndex
    held: dict[int, float]
    weight: dict[int, float]
    scorers: list = field(default_factory=list)  # the placement-score hooks with something to go on
    hook_inputs: _HookInputs | None = None


@dataclass
class Decisions:
    """What the decision core decided: the placements in order ``(job id, taken, share)``, why each job that was
    not placed waits (``reasons``; ``changed``: those whose stored reason differs), and the preemptions
    ``(job id, victims)``."""

    placements: list = field(default_factory=list)
    reasons: dict = field(default_factory=dict)
    changed: dict = field(default_factory=dict)
    preemptions: list = field(default_factory=list)

    @property
    def preempted(self) -> int:
        return sum(victims for _, victims in self.preemptions)


def decide(state: PassState, preempt=None, max_preemptions: int = 32) -> Decisions:
    """The decision core of a scheduling pass, with no database access: teams take turns (highest head priority
    first, then the lowest held share per unit of weight), each placing its next job through the placement
    hooks; a job that does not fit may ``preempt(job_id, priority, resources, selector, capacity) -> Room | None``
    (the node where room is made and the :class:`Cut` s made there: shrinks and stops); that node is kept from
    the jobs placed after it in the pass
    (at most ``max_preemptions`` tries per pass). ``state.capacity`` and ``state.held`` are consumed."""
    queues, notes, capacity, held, weight = state.queues, state.notes, state.capacity, state.held, state.weight
    scorers, hook_inputs = state.scorers, state.hook_inputs
    decisions = Decisions()
    # Teams take turns: highest head priority first, then the lowest held share per unit of weight.
    heap = [(queue[0][0], held[team] / weight[team], team) for team, queue in queues.items() if queue]
    heapq.heapify(heap)
    failed_shapes: list[tuple[float, int, int, int, int, str]] = []
    preemption_budget = max_preemptions
    reserved: set = set()  # nodes where room is being made for a job that waits: not for later jobs of this pass
    while heap:
        _, _, team = heapq.heappop(heap)
        queue = queues[team]
        item = queue.popleft()
        neg_priority, _, job_id, resources, reason, _ = item
        gpus = float(resources.get("gpus", 0))
        memory = int(resources.get("gpu_memory") or 0)
        workers = int(resources.get("workers", 1))
        selector = resources.get("node_labels") or None
        key = repr(sorted(selector.items())) if selector else ""
        cpus, host_memory = cpu_request(resources)
        # A request at least as large as one that already failed in this pass cannot fit either (whatever
        # a placement hook would choose: it only chooses among places that fit). GPUs and CPUs both count:
        # a job that holds no GPU is no larger than a GPU job that failed, nor the other way round.
        doomed = any(gpus >= g and memory >= m and workers >= w and cpus >= c and host_memory >= h and key == k
                     for g, m, w, c, h, k in failed_shapes)
        choose = _chooser(team, item, scorers, capacity, hook_inputs) if scorers and not doomed else None
        taken = None if doomed else capacity.place(resources, selector, choose, reserved)
        if taken:
            share = sum(milli for _, slot, milli, _ in taken if not slot.cpu) / FULL
            decisions.placements.append((job_id, taken, share))
            held[team] += share
        else:
            if not doomed:
                failed_shapes.append((gpus, memory, workers, cpus, host_memory, key))
            why = ("waiting: no node has free CPUs and memory that fit" if gpu_free(resources)
                   else "waiting: no node has free devices that fit")
            if job_id in notes:
                why += f" ({notes[job_id]})"
            if preempt is not None and preemption_budget > 0 and workers == 1:
                preemption_budget -= 1
                room = preempt(job_id, -neg_priority, resources, selector, capacity)
                if room is not None:
                    reserved.add(room.node)
                victims = len(room.cuts) if room is not None else 0
                if victims and room is not None:
                    decisions.preemptions.append((job_id, victims))
                    shrunk = sum(1 for cut in room.cuts if cut.shrink)
                    why = f"waiting: preempting {victims - shrunk} lower-priority job(s)" if not shrunk else (
                        f"waiting: shrinking {shrunk} and preempting {victims - shrunk} lower-priority job(s)")
            decisions.reasons[job_id] = why
            if reason != why:
                decisions.changed[job_id] = why
        if queue:
            heapq.heappush(heap, (queue[0][0], held[team] / weight[team], team))
    return decisions


def fair_weights(quotas: dict, teams) -> dict[int, float]:
    """team -> its fair-share weight (the quota's, 1 without one; never zero)."""
    return {team: max(quotas[team].weight if team in quotas else 1.0, 1e-6) for team in teams}


@timed_pass  # strata_scheduler_pass_seconds (strata.telemetry.metrics)
def schedule_pass(*, dispatch: bool = True, max_preemptions: int = 32) -> PassResult:
    """Admit pending jobs, then place queued jobs in priority and weighted fair-share order: the state is read
    from the database, :func:`decide` decides, and its decisions are written back."""
    from components.runtime.contract import registry
    from components.runtime.contract.policies import PlacementScore

    started = time.perf_counter()
    result = PassResult()
    for team_id in teams_with_pending():
        result.admitted += len(admit_pending(team_id))
    with transaction.atomic():
        _lock()
        now = timezone.now()
        quotas = {quota.team_id: quota for quota in Quota.objects.all()}
        queue_view = _queue_by_team(quotas)
        queues, notes = queue_view.by_team, queue_view.notes
        nested, nested_waiting = _place_nested()
        if not queues and not nested and not nested_waiting:
            result.seconds = time.perf_counter() - started
            return result
        capacity = load_capacity(now)
        held = _held_by_team()
        scorers = registry.hooks(PlacementScore)
        hook_inputs = _HookInputs(queues, scorers) if scorers else None
        scorers = hook_inputs.hooks if hook_inputs is not None else []
        state = PassState(queues=queues, notes=notes, capacity=capacity, held=held,
                          weight=fair_weights(quotas, queues), scorers=scorers, hook_inputs=hook_inputs)

        def preempt(job_id, priority, resources, selector, capacity):
            return _preempt_for(job_id, priority, resources, selector, capacity, quotas)

        decisions = decide(state, preempt, max_preemptions)
        placements, waiting = decisions.placements, decisions.changed
        result.preempted = decisions.preempted
        result.placed = len(placements) + len(nested)
        result.waiting = len(waiting) + len(nested_waiting)
        _set_reasons({**waiting, **nested_waiting})
        result.dispatches = _create_attempts(placements, now, notes) + _create_attempts(nested, now, nested=True)
        if dispatch and result.dispatches:
            from strata.scheduling.dispatch import publish_all

            batch = list(result.dispatches)
            transaction.on_commit(lambda: publish_all(batch))
    result.seconds = time.perf_counter() - started
    return result


def _place_nested() -> tuple[list, dict]:
    """Place queued nested children inside their parents' allocations: ``(placements, waiting reasons)``.

    Each parent with a live attempt gets a capacity index of the devices that attempt holds (its share and
    memory on each), less what its other nested children hold; its children are placed there best-fit, in
    priority then queue order. A child whose parent has no live attempt waits for it."""
    rows = list(Job.objects.filter(state=S.QUEUED, nested=True, held=False).order_by("-priority", "queued_at")
                .values_list("id", "parent_id", "resources", "reason"))
    if not rows:
        return [], {}
    live = dict(Attempt.objects.filter(job_id__in={parent for _, parent, _, _ in rows}, ended_at__isnull=True)
                .values_list("job_id", "id"))
    nodes: dict = defaultdict(dict)  # parent -> node id -> NodeSlot
    devices: dict = defaultdict(dict)  # parent -> device id -> DeviceSlot
    owner = {attempt: parent for parent, attempt in live.items()}
    for attempt_id, device_id, node_id, index, kind, total, share, memory in (
            Allocation.objects.filter(attempt_id__in=list(owner), active=True, nested=False)
            .values_list("attempt_id", "device_id", "device__node_id", "device__index", "device__kind",
                         "device__memory_total", "share", "memory")):
        parent = owner[attempt_id]
        node = nodes[parent].setdefault(node_id, NodeSlot(id=node_id, name=str(node_id), labels={}))
        if kind == Device.Kind.CPU:  # the CPUs (and host memory) the parent reserved: its children share them
            slot = node.host = host_slot(device_id, node_id, index, share, memory)
        else:
            slot = DeviceSlot(id=device_id, node_id=node_id, index=index, memory_total=total,
                              free=round(share * FULL), free_memory=memory)
            node.devices.append(slot)
        devices[parent][device_id] = slot
    for parent, device_id, share, memory in (
            Allocation.objects.filter(active=True, nested=True, attempt__job__parent_id__in=list(live))
            .values_list("attempt__job__parent_id", "device_id", "share", "memory")):
        slot = devices[parent].get(device_id)
        if slot is not None:
            slot.free -= round(share * FULL)
            slot.free_memory -= memory
    indexes = {parent: CapacityIndex(list(found.values())) for parent, found in nodes.items()}
    placements, waiting = [], {}
    for job_id, parent, resources, reason in rows:
        index = indexes.get(parent)
        taken = index.place(resources) if index is not None else None
        if taken:
            placements.append((job_id, taken, 0.0))  # the parent's attempt holds (and is billed for) the share
            continue
        why = ("waiting: its parent is not running" if index is None
               else "waiting: no room left in its parent's allocation")
        if reason != why:
            waiting[job_id] = why
    return placements, waiting


def _set_reasons(waiting: dict) -> None:
    """Record why jobs wait: one UPDATE per distinct reason (in chunks), not one per job."""
    by_reason: dict[str, list] = defaultdict(list)
    for job_id, why in waiting.items():
        by_reason[why].append(job_id)
    for why, job_ids in by_reason.items():
        for start in range(0, len(job_ids), _CHUNK):
            Job.objects.filter(pk__in=job_ids[start:start + _CHUNK], state=S.QUEUED).update(reason=why)


def insert_rows(model, fields: list[str], rows: list[tuple]) -> None:
    """INSERT ``rows`` (values in ``fields`` order): COPY on PostgreSQL, multi-row VALUES of up to 500 rows
    elsewhere. For passes that place thousands of jobs: ``bulk_create`` spent most of a 10,000-job pass
    building model instances and compiling SQL value by value."""
    if not rows:
        return
    quote = connection.ops.quote_name
    columns = [model._meta.get_field(name) for name in fields]
    table = quote(model._meta.db_table)
    names = ", ".join(quote(c.column) for c in columns)
    prepare = [_value_preparer(c) for c in columns]
    if any(prepare):
        rows = [tuple(p(v) if p else v for p, v in zip(prepare, row, strict=True)) for row in rows]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        one = f"({', '.join(['%s'] * len(columns))})"
        for start in range(0, len(rows), 500):
            chunk = rows[start:start + 500]
            cursor.execute(f"INSERT INTO {table} ({names}) VALUES " + ", ".join([one] * len(chunk)),
                           [value for row in chunk for value in row])


_NATIVE_TYPES = {"IntegerField", "BigIntegerField", "PositiveIntegerField", "FloatField", "CharField",
                 "BooleanField", "BigAutoField", "TextField"}


def _value_preparer(field):
    """None where the driver takes the Python value as it is; else the field's own conversion."""
    target = field.target_field if field.is_relation else field
    if target.get_internal_type() in _NATIVE_TYPES:
        return None
    if connection.vendor == "postgresql" and target.get_internal_type() in {"UUIDField", "DateTimeField"}:
        return None
    return lambda value: field.get_db_prep_save(value, connection)


def _create_attempts(placements, now, notes=None, *, nested: bool = False) -> list[tuple[str, str, str]]:
    """Record an attempt, its allocations and a SCHEDULED event (with ``notes[job_id]``, where the memory it
    reserves came from, if any) for each placement, and mark the jobs SCHEDULED. Returns the dispatches.
    ``nested``: the placements are nested children's, carved out of their parents' allocations."""
    if not placements:
        return []
    job_ids = [job_id for job_id, _, _ in placements]
    numbers = dict(Attempt.objects.filter(job_id__in=job_ids).values("job_id").annotate(n=Max("number"))
                   .values_list("job_id", "n"))
    node_ids = {slot.node_id for _, taken, _ in placements for _, slot, _, _ in taken}
    sessions, names = {}, {}
    for node_id, session, name in Node.objects.filter(id__in=node_ids).values_list("id", "session", "name"):
        sessions[node_id], names[node_id] = session, name
    attempts, allocations, events, dispatches = [], [], [], []
    for job_id, taken, share in placements:
        primary = taken[0][1].node_id
        attempt_id, number, token = uuid.uuid4(), numbers.get(job_id, 0) + 1, secrets.token_hex(16)
        attempts.append((attempt_id, job_id, number, primary, sessions[primary], token, share, now, now, now, "", ""))
        for rank, slot, milli, memory in taken:
            allocations.append((attempt_id, slot.id, rank, milli / FULL, memory, True, nested))
        message = f"SCHEDULED: attempt {number} placed {_placed_text(taken, nested, names)}"
        if notes and job_id in notes:
            message += f"; {notes[job_id]}"
        events.append((job_id, attempt_id, now, "state", {"state": S.SCHEDULED}, message))
        for node_id in dict.fromkeys(slot.node_id for _, slot, _, _ in taken):
            dispatches.append((f"node.{node_id}", str(attempt_id), token))
    changed = Job.objects.filter(pk__in=job_ids, state=S.QUEUED).update(
        state=S.SCHEDULED, reason="placed; waiting for the node to start it", updated_at=now)
    if changed != len(job_ids):  # cannot happen under the pass lock; refuse to double-book if it does
        raise RuntimeError(f"scheduling race: {changed} of {len(job_ids)} jobs were still QUEUED")
    insert_rows(Attempt, ["id", "job", "number", "node", "node_session", "fencing_token", "gpu_share",
                          "created_at", "dispatched_at", "published_at", "outcome", "exit_reason"], attempts)
    insert_rows(Allocation, ["attempt", "device", "rank", "share", "memory", "active", "nested"], allocations)
    insert_rows(JobEvent, ["job", "attempt", "time", "kind", "data", "message"], events)
    _announce_scheduled(job_ids)
    if history.enabled():
        for attempt_id, job_id, number, _, _, token, share, _, dispatched, *_ in attempts:
            history.record("state", job=job_id, source=S.QUEUED, target=S.SCHEDULED, reason="placed")
            history.record("dispatch", job=job_id, attempt=attempt_id, token=token, number=number, share=share,
                           dispatched_at=dispatched.timestamp(), nested=nested)
    return dispatches


def _placed_text(taken: list, nested: bool, names: dict) -> str:
    """Where a placement went, for its SCHEDULED event: the devices and GPUs, and the CPUs it reserved."""
    gpus = [(slot, milli) for _, slot, milli, _ in taken if not slot.cpu]
    cpus = sum(milli for _, slot, milli, _ in taken if slot.cpu) / FULL
    inside = " inside its parent's allocation" if nested else ""
    if not gpus:
        where = ", ".join(sorted({names.get(slot.node_id, str(slot.node_id)) for _, slot, _, _ in taken}))
        return f"on the CPUs of node {where} ({cpus:g} CPU{inside})"
    where = ", ".join(sorted({f"{slot.index}" for slot, _ in gpus}))
    held = sum(milli for _, milli in gpus) / FULL
    return f"on devices {where} ({held:g} GPU{f', {cpus:g} CPU' if cpus else ''}{inside})"


def _announce_lost(node: Node, reason: str) -> None:
    """The ``node.lost`` lifecycle event of a node the reaper took DOWN, with the jobs (and their teams) whose
    attempts ran there, delivered after commit."""
    from strata.jobs.events import emit, subscribers

    if not subscribers("node.lost"):
        return
    from components.runtime.contract.events import NodeLost

    rows = (Attempt.objects.filter(ended_at__isnull=True, allocations__device__node=node)
            .values_list("job_id", "job__team_id").distinct())
    jobs = sorted({str(job_id) for job_id, _ in rows})
    teams = sorted({team_id for _, team_id in rows if team_id is not None})
    emit(NodeLost(node_id=str(node.pk), node=node.name, reason=reason, job_ids=tuple(jobs), team_ids=tuple(teams)))


def _announce_scheduled(job_ids: list) -> None:
    """One lifecycle event per job the bulk UPDATE moved QUEUED -> SCHEDULED, delivered after commit."""
    from strata.jobs.events import emit_many, subscribers

    if not subscribers("job.transitioned"):
        return
    from components.runtime.contract.events import JobTransitioned

    rows = Job.objects.filter(pk__in=job_ids).values_list("id", "team_id", "kind")
    emit_many([JobTransitioned(job_id=str(job_id), team_id=team_id, kind=kind, source=S.QUEUED,
                               target=S.SCHEDULED, reason="placed; waiting for the node to start it")
               for job_id, team_id, kind in rows])


SHRINK_COST = 0.1  # a shrink (a checkpointed restart at a smaller size) against a stop's cost of 1: tried first


@dataclass(frozen=True)
class Cut:
    """One way :func:`choose_victims` makes room: stop the job (``resources`` None: it is preempted, checkpointed
    first, and queued again as it was) or shrink it (``resources``: the smaller request it restarts with, from
    its checkpoint, at once)."""

    job_id: object
    resources: dict | None = None

    @property
    def shrink(self) -> bool:
        return self.resources is not None


@dataclass
class Room:
    """Where room is being made for a job: the node (``choose_room``'s plan) and the cuts made there (none when
    jobs already stopping there will free enough). :func:`decide` keeps that node for the job for the rest of
    the pass, so lower-priority jobs placed after it cannot take the room back."""

    node: object
    cuts: list[Cut] = field(default_factory=list)


def _preempt_for(job_id, priority: int, resources: dict, selector, capacity: CapacityIndex, quotas) -> Room | None:
    """Make room on one node for ``job_id`` (:func:`choose_victims` over the active allocations): shrink elastic
    lower-priority jobs (each restarts from a checkpoint at its smaller size) and preempt others (each stops at a
    checkpoint and queues again). Returns the cuts made."""
    from strata.jobs.services import job_resize

    # Filtered to the index's devices in Python: an IN list of every node id costs more than the rows.
    active = (Allocation.objects.filter(active=True, nested=False)
              .values_list("attempt_id", "attempt__job_id", "attempt__job__priority", "attempt__job__team_id",
                           "attempt__job__state", "attempt__started_at", "device_id", "share", "memory",
                           "attempt__job__kind", "attempt__gpu_share", "attempt__job__resources", "rank"))
    room = choose_room(active, priority, resources, selector, capacity, quotas)
    if room is None:
        return None
    made = []
    for cut in room.cuts:
        try:
            if cut.shrink:
                victim = Job.objects.get(pk=cut.job_id)
                if victim.state not in (S.RUNNING, S.SCHEDULED):
                    continue
                job_resize(victim, cut.resources or {}, f"shrunk for higher-priority job {job_id}")
            else:
                transition(str(cut.job_id), [S.RUNNING, S.SCHEDULED], S.PREEMPTED,
                           f"preempted by higher-priority job {job_id}")
            made.append(cut)
        except (InvalidTransition, Job.DoesNotExist):
            continue
    return Room(room.node, made)


def _shrink_gives(resources: dict, floor: dict, allocs: list) -> list[list]:
    """What shrinking a job to ``floor`` gives back on one node, step by step: each step a list of
    ``(device id, milli, memory)``. Dropping workers: one step per worker on the node (its devices), at most as
    many as it may lose; a smaller share: one step, each device's share above the floor (whole devices for
    jobs of several GPUs per worker; memory in proportion unless the job asked for a fixed amount)."""
    by_rank: dict[int, list] = defaultdict(list)
    for device_id, milli, memory, rank in allocs:
        by_rank[rank].append((device_id, milli, memory))
    workers, fewer = int(resources.get("workers", 1)), int(floor.get("workers", 1))
    if fewer < workers:
        ranks = sorted(by_rank, reverse=True)[: workers - fewer]
        return [by_rank[rank] for rank in ranks]
    gpus, smaller = float(resources.get("gpus", 0)), float(floor.get("gpus", 0))
    fixed_memory = resources.get("gpu_memory") is not None
    step: list[tuple[int, int, int]] = []
    for rank_allocs in by_rank.values():
        if gpus > 1:  # whole devices: the last ones above the floor go
            spare = [a for a in rank_allocs if a[1] > 0][int(smaller):]
            step.extend((device_id, milli, 0 if fixed_memory else memory) for device_id, milli, memory in spare)
            continue
        for device_id, milli, memory in rank_allocs:
            keep = round(smaller * FULL)
            if milli <= keep:
                continue
            given = 0 if fixed_memory else int(memory * (milli - keep) / milli)
            step.append((device_id, milli - keep, given))
    return [step] if step else []


def choose_victims(active, priority: int, resources: dict, selector, capacity: CapacityIndex, quotas) -> list[Cut]:
    """The cuts of :func:`choose_room`'s plan (none without one)."""
    room = choose_room(active, priority, resources, selector, capacity, quotas)
    return room.cuts if room is not None else []


def choose_room(active, priority: int, resources: dict, selector, capacity: CapacityIndex, quotas) -> Room | None:
    """How to make room for a job of ``priority`` needing ``resources`` on one node: the :class:`Cut` s (shrinks
    and stops) on the node where they cost least. Elastic lower-priority jobs (:func:`elastic_floor`) are shrunk
    before anything is stopped: a plan that stops a job only wins when no plan of shrinks alone fits. Each stop
    costs 1 unless a plugin's ``PreemptionCost`` hook says otherwise (a hook may refuse one: then it is neither
    stopped nor shrunk); a shrink costs :data:`SHRINK_COST` of that. Attempts that are already stopping
    (cancelled or preempted) count as free at no cost.

    ``active``: the active allocations, rows ``(attempt id, job id, job priority, team id, job state, attempt
    started_at, device id, share, memory, kind, attempt gpu_share, job resources, worker rank)``. No database access;
    ``capacity`` is left as it was."""
    from components.runtime.contract import registry
    from components.runtime.contract.policies import PreemptionCost, Victim, preemption_cost

    hooks = registry.hooks(PreemptionCost)
    by_node: dict[object, dict] = defaultdict(dict)
    costs: dict = {}
    for (attempt_id, victim_job, victim_priority, team_id, state, started, device_id, share, memory, kind,
         held, job_resources, rank) in active:
        slot = capacity.slot(device_id)
        if slot is None:
            continue
        effective = victim_priority + (quotas[team_id].priority if team_id in quotas else 0)
        stopping = state in {S.CANCELLED, S.PREEMPTED}
        if not stopping and effective >= priority:
            continue
        if stopping:
            cost = 0.0
        else:
            if attempt_id not in costs:
                costs[attempt_id] = preemption_cost(Victim(
                    job_id=str(victim_job), attempt_id=str(attempt_id), team_id=team_id, kind=kind,
                    priority=effective, started_at=started.timestamp() if started else 0.0, share=held), hooks)
            cost = costs[attempt_id]
            if cost is None:  # a plugin refuses to have it preempted
                continue
        node_id = slot.node_id
        entry = by_node[node_id].setdefault(attempt_id, {
            "job": victim_job, "stopping": stopping, "cost": cost, "kind": kind, "resources": job_resources or {},
            "order": (not stopping, effective, cost, -(started.timestamp() if started else 0)), "allocs": []})
        entry["allocs"].append((device_id, round(share * FULL), memory, rank))
    best = None
    for node_id, candidates in by_node.items():
        steps = _node_steps(candidates)
        taken: list = []
        freed: list = []
        for job, action, gives in steps:
            for device_id, milli, memory in gives:
                capacity.give(device_id, milli, memory)
                freed.append((device_id, milli, memory))
            taken.append((job, action))
            if resources_fit(capacity, resources, selector, set(capacity.nodes) - {node_id}):
                cost, cuts = _plan(taken, candidates)
                if best is None or cost < best[0]:
                    best = (cost, Room(node_id, cuts))
                break
        for device_id, milli, memory in freed:
            capacity.take(device_id, milli, memory)
    return best[1] if best else None


def _node_steps(candidates: dict) -> list[tuple]:
    """The order room is made on one node: ``(attempt id, action, gives)`` with action "free" (already
    stopping), "shrink:<n>" or "stop". Free ones first, then shrinks (lowest priority first), then stops (of the
    jobs that were not shrunk first, then of what is left of those that were)."""
    ordered = sorted(candidates.items(), key=lambda item: item[1]["order"])
    steps, shrunk_gives = [], defaultdict(list)
    for attempt_id, candidate in ordered:
        if candidate["stopping"]:
            steps.append((attempt_id, "free", [a[:3] for a in candidate["allocs"]]))
    for attempt_id, candidate in ordered:
        if candidate["stopping"]:
            continue
        floor = elastic_floor(candidate["resources"])
        if floor is None:
            continue
        for number, gives in enumerate(_shrink_gives(candidate["resources"], floor, candidate["allocs"]), 1):
            steps.append((attempt_id, f"shrink:{number}", gives))
            shrunk_gives[attempt_id].extend(gives)
    # Jobs that were not shrunk are stopped first: a shrunk job that must stop after all gives back only the rest.
    for attempt_id, candidate in sorted(ordered, key=lambda item: item[0] in shrunk_gives):
        if candidate["stopping"]:
            continue
        left: dict = defaultdict(lambda: [0, 0])
        for device_id, milli, memory, _ in candidate["allocs"]:
            left[device_id][0] += milli
            left[device_id][1] += memory
        for device_id, milli, memory in shrunk_gives[attempt_id]:
            left[device_id][0] -= milli
            left[device_id][1] -= memory
        steps.append((attempt_id, "stop", [(d, m, b) for d, (m, b) in left.items() if m > 0 or b > 0]))
    return steps


def _plan(taken: list, candidates: dict) -> tuple[tuple, list[Cut]]:
    """A node's plan from the steps taken: its cost ``(stop cost, shrink cost, stops)`` and its cuts (a job
    stopped after a shrink is stopped; a job shrunk by several steps loses that many workers)."""
    stops = [job for job, action in taken if action == "stop"]
    shrinks: dict = defaultdict(int)
    for job, action in taken:
        if action.startswith("shrink:"):
            shrinks[job] = max(shrinks[job], int(action.split(":")[1]))
    cuts = [Cut(candidates[job]["job"]) for job in stops]
    for job, steps in shrinks.items():
        if job in stops:
            continue
        candidate = candidates[job]
        floor = elastic_floor(candidate["resources"]) or {}
        resources = dict(floor)
        if int(floor.get("workers", 1)) < int(candidate["resources"].get("workers", 1)):
            resources["workers"] = int(candidate["resources"].get("workers", 1)) - steps
        cuts.append(Cut(candidate["job"], resources))
    cost = (sum(candidates[job]["cost"] for job in stops),
            sum(candidates[job]["cost"] * SHRINK_COST for job in shrinks if job not in stops), len(stops))
    return cost, cuts


def resources_fit(capacity: CapacityIndex, resources: dict, selector, exclude) -> bool:
    """Whether one worker of ``resources`` fits now outside the nodes ``exclude``: its GPUs, its CPUs, or both."""
    return capacity.fits(resources, selector, exclude)


# --- reaper and reconciler ----------------------------------------------------------------------------------

def reap(now=None) -> dict:
    """Requeue the attempts of nodes whose lease expired (not counted as failures), fail attempts that
    overran their job's time limit by more than the grace period, and end participants that missed their lease."""
    now = now or timezone.now()
    # A DRAINING node holds its lease like an UP one (it only takes no new work): it is lost the same way.
    lost_nodes = list(Node.objects.filter(state__in=LIVE_STATES, lease_expires_at__lte=now))
    requeued = 0
    for node in lost_nodes:
        if Node.objects.filter(pk=node.pk, state__in=LIVE_STATES, lease_expires_at__lte=now).update(
                state=Node.State.DOWN):
            log.warning("node %s missed its lease; requeueing its attempts", node.name)
            _announce_lost(node, "node lease expired")
        requeued += release_node_attempts(node, "node lease expired")
    overdue = 0
    grace = timedelta(seconds=60)
    for attempt in Attempt.objects.filter(ended_at__isnull=True, started_at__isnull=False).select_related("job"):
        if attempt.started_at + timedelta(seconds=attempt.job.time_limit) + grace < now:
            from strata.jobs.services import attempt_end

            if attempt_end(attempt, Attempt.Outcome.TIME_LIMIT, "time limit exceeded (reaped)"):
                overdue += 1
    # Participants (machines outside the cluster) whose lease expired are lost; revoked tokens and ended jobs
    # stop theirs. Their GPUs stopped counting against the quota when the lease expired already.
    participants = participants_expire(now)
    return {"lost_nodes": len(lost_nodes), "requeued": requeued, "overdue": overdue,
            "lost_participants": participants["lost"], "stopped_participants": participants["stopped"]}


def reconcile(now=None) -> int:
    """Republish dispatches of attempts no node has claimed in a while: the broker may have lost them.
    Duplicates are harmless because a claim is idempotent and fenced."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.STRATA_DISPATCH_REPUBLISH_SECONDS)
    stale = list(Attempt.objects.filter(ended_at__isnull=True, started_at__isnull=True, published_at__lt=cutoff)
                 .prefetch_related("allocations__device"))
    dispatches = []
    for attempt in stale:
        for node_id in dict.fromkeys(a.device.node_id for a in attempt.allocations.all()):
            dispatches.append((f"node.{node_id}", str(attempt.id), attempt.fencing_token))
        Attempt.objects.filter(pk=attempt.pk).update(published_at=now)
    if dispatches:
        from strata.scheduling.dispatch import publish_all

        publish_all(dispatches)
        log.info("reconciler republished %d dispatches", len(dispatches))
    return len(dispatches)


def tick() -> dict:
    """The beat: renew (or take) the leader lease; the leader reaps and reconciles; then a scheduling pass, on
    every replica (passes are serialized by their own lock, so a pass on a non-leader is safe)."""
    from strata.scheduling.leader import lease_acquire

    lease = lease_acquire()
    reaped = {"lost_nodes": 0, "requeued": 0, "overdue": 0, "lost_participants": 0, "stopped_participants": 0}
    republished = 0
    if lease is not None:
        reaped = reap()
        republished = reconcile()
    result = schedule_pass()
    return {**reaped, "republished": republished, "placed": result.placed, "admitted": result.admitted,
            "leader": lease is not None, "epoch": lease.epoch if lease is not None else None}


def leader_status() -> dict:
    """Whether this process leads the scheduler replicas, and who does (for metrics): see
    :func:`strata.scheduling.leader.leader_status`."""
    from strata.scheduling.leader import leader_status as status

    return status()
