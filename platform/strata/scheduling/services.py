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

from strata.cluster.models import Device, Node
from strata.jobs.models import Allocation, Attempt, Job, JobEvent, JobState
from strata.jobs.services import attempt_lost
from strata.jobs.states import InvalidTransition, transition
from strata.quotas.models import Quota
from strata.quotas.services import admit_pending, teams_with_pending
from strata.scheduling.capacity import FULL, CapacityIndex, DeviceSlot, NodeSlot

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
    nodes = {
        node.id: NodeSlot(id=node.id, name=node.name, labels=node.labels or {})
        for node in Node.objects.filter(state=Node.State.UP, lease_expires_at__gt=now).only("id", "name", "labels")
    }
    devices = {}
    for device_id, node_id, index, memory_total in Device.objects.filter(node_id__in=list(nodes)).values_list(
        "id", "node_id", "index", "memory_total"
    ):
        slot = DeviceSlot(id=device_id, node_id=node_id, index=index, memory_total=memory_total,
                          free_memory=memory_total)
        devices[device_id] = slot
        nodes[node_id].devices.append(slot)
    for device_id, share, memory in Allocation.objects.filter(active=True, device_id__in=list(devices)).values_list(
        "device_id", "share", "memory"
    ):
        slot = devices[device_id]
        slot.free -= round(share * FULL)
        slot.free_memory -= memory
    return CapacityIndex(list(nodes.values()))


# Memory reserved for a shared job that measured its needs before: its measured peak plus this margin
# (allocator fragmentation, a larger batch at an epoch's end).
MEASURED_HEADROOM = 1.1
# How many of the most recent measured attempts a pass reads to lend their measurement to the first attempt of
# a job of the same kind and spec (Salus: such jobs have the same memory profile, and a sweep resubmits one
# spec many times). It bounds the pass's work however long the history grows.
PROFILE_WINDOW = 5000


class _CanonicalSpecs(dict):
    """A spec's JSON text as the database returns it -> its canonical JSON (keys sorted, no spaces), so that
    identical specs compare equal whatever their key order; each distinct text is parsed once."""

    def __missing__(self, text: str) -> str:
        self[text] = canonical = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        return canonical


def _measured_memory() -> dict:
    """Queued jobs whose earlier attempts a plugin measured (``Attempt.measured_memory``, from the report
    channel): job id -> the most device memory one measured, so the next attempt is placed on what the job
    really uses."""
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


def _queue_by_team(quotas: dict[int, Quota]) -> tuple[dict[int, deque], dict]:
    """The queued jobs of each team in priority order, and job id -> where the memory a job reserves came
    from, for jobs that reserve a measurement instead of what they asked for."""
    queues: dict[int, list] = defaultdict(list)
    notes: dict = {}
    canonical = _CanonicalSpecs()
    measured = _measured_memory()
    profiles = _measured_profiles(canonical)
    kinds = {kind for kind, _ in profiles}
    rows = Job.objects.filter(state=S.QUEUED)
    fields = ["id", "team_id", "priority", "queued_at", "resources", "reason"]
    if kinds:  # specs matter only when a job of their kind measured something; fetched as text, not parsed
        rows, fields = rows.annotate(spec_text=Cast("spec", TextField())), [*fields, "kind", "spec_text"]
    lending, reserved = bool(measured or kinds), {}
    # The headroom never makes a measurement that fits the largest device unplaceable.
    largest = (Device.objects.aggregate(largest=Max("memory_total"))["largest"] or 0) if lending else 0
    for job_id, team_id, priority, queued_at, resources, reason, *kind_spec in rows.values_list(*fields):
        if lending and 0 < float(resources.get("gpus", 0)) < 1 and not resources.get("gpu_memory"):
            # A fractional job without an explicit memory request reserves what it measured, not a memory
            # slice proportional to its share: it goes where that fits, or waits. Its first attempt reserves
            # what the latest jobs of its kind and spec measured; its own measurements take precedence.
            used, source = measured.get(job_id, 0), "its earlier attempts measured"
            if not used and kind_spec and kind_spec[0] in kinds:
                kind, text = kind_spec
                used, source = profiles.get((kind, canonical[text]), 0), "jobs with the same spec measured"
            if used:
                if (used, source) not in reserved:  # a sweep's jobs share a few of these
                    memory = min(int(used * MEASURED_HEADROOM), max(used, largest))
                    note = f"{memory / 2**30:.2f} GiB reserved: {MEASURED_HEADROOM:g} x what {source}"
                    reserved[used, source] = memory, note
                memory, notes[job_id] = reserved[used, source]
                resources = {**resources, "gpu_memory": memory}
        boost = quotas[team_id].priority if team_id in quotas else 0
        queues[team_id].append((-(priority + boost), queued_at, job_id, resources, reason))
    ordered = {team: sorted(items, key=lambda item: (item[0], item[1])) for team, items in queues.items()}
    return {team: deque(_hooked_order(team, items)) for team, items in ordered.items()}, notes


def _hooked_order(team_id: int, items: list[tuple]) -> list[tuple]:
    """One team's queue after the plugins' queue-order hooks (``components.runtime.policies.QueueOrder``): each
    permutes only its own kinds' jobs within a priority level. Unchanged when no plugin has such a hook."""
    from components.runtime import registry
    from components.runtime.policies import QueuedJob, QueueOrder, reorder

    hooks = registry.hooks(QueueOrder)
    if not hooks or len(items) < 2:
        return items
    rows = Job.objects.filter(pk__in=[item[2] for item in items])
    if all(hook.kinds is not None for hook in hooks):
        rows = rows.filter(kind__in={kind for hook in hooks for kind in hook.kinds})
    details = {job_id: (kind, spec) for job_id, kind, spec in rows.values_list("id", "kind", "spec")}
    by_id = {str(item[2]): item for item in items}
    views = [QueuedJob(id=str(item[2]), team_id=team_id, kind=details.get(item[2], ("", {}))[0], priority=-item[0],
                       queued_at=item[1].timestamp() if item[1] else 0.0, resources=dict(item[3]),
                       spec=dict(details.get(item[2], ("", {}))[1] or {})) for item in items]
    return [by_id[view.id] for view in reorder(views, hooks)]


def _held_by_team() -> dict[int, float]:
    held: dict[int, float] = defaultdict(float)
    for team_id, share in Attempt.objects.filter(ended_at__isnull=True).values_list("job__team_id", "gpu_share"):
        held[team_id] += share
    return held


def schedule_pass(*, dispatch: bool = True, max_preemptions: int = 32) -> PassResult:
    """Admit pending jobs, then place queued jobs in priority and weighted fair-share order."""
    started = time.perf_counter()
    result = PassResult()
    for team_id in teams_with_pending():
        result.admitted += len(admit_pending(team_id))
    with transaction.atomic():
        _lock()
        now = timezone.now()
        quotas = {quota.team_id: quota for quota in Quota.objects.all()}
        queues, notes = _queue_by_team(quotas)
        if not queues:
            result.seconds = time.perf_counter() - started
            return result
        capacity = load_capacity(now)
        held = _held_by_team()
        weight = {team: max(quotas[team].weight if team in quotas else 1.0, 1e-6) for team in queues}
        # Teams take turns: highest head priority first, then the lowest held share per unit of weight.
        heap = [(queue[0][0], held[team] / weight[team], team) for team, queue in queues.items()]
        heapq.heapify(heap)
        placements, waiting = [], {}
        failed_shapes: list[tuple[float, int, int, str]] = []
        preemption_budget = max_preemptions
        while heap:
            _, _, team = heapq.heappop(heap)
            queue = queues[team]
            neg_priority, _, job_id, resources, reason = queue.popleft()
            gpus = float(resources.get("gpus", 0))
            memory = int(resources.get("gpu_memory") or 0)
            workers = int(resources.get("workers", 1))
            selector = resources.get("node_labels") or None
            key = repr(sorted(selector.items())) if selector else ""
            # A request at least as large as one that already failed in this pass cannot fit either.
            doomed = any(gpus >= g and memory >= m and workers >= w and key == k for g, m, w, k in failed_shapes)
            taken = None if doomed else capacity.place(resources, selector)
            if taken:
                share = sum(milli for _, _, milli, _ in taken) / FULL
                placements.append((job_id, taken, share))
                held[team] += share
            else:
                if not doomed:
                    failed_shapes.append((gpus, memory, workers, key))
                why = "waiting: no node has free devices that fit"
                if job_id in notes:
                    why += f" ({notes[job_id]})"
                if preemption_budget > 0 and workers == 1:
                    preemption_budget -= 1
                    victims = _preempt_for(job_id, -neg_priority, resources, selector, capacity, quotas)
                    if victims:
                        result.preempted += victims
                        why = f"waiting: preempting {victims} lower-priority job(s)"
                if reason != why:
                    waiting[job_id] = why
            if queue:
                heapq.heappush(heap, (queue[0][0], held[team] / weight[team], team))
        result.placed = len(placements)
        result.waiting = len(waiting)
        _set_reasons(waiting)
        result.dispatches = _create_attempts(placements, now, notes)
        if dispatch and result.dispatches:
            from strata.scheduling.dispatch import publish_all

            batch = list(result.dispatches)
            transaction.on_commit(lambda: publish_all(batch))
    result.seconds = time.perf_counter() - started
    return result


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


def _create_attempts(placements, now, notes=None) -> list[tuple[str, str, str]]:
    """Record an attempt, its allocations and a SCHEDULED event (with ``notes[job_id]``, where the memory it
    reserves came from, if any) for each placement, and mark the jobs SCHEDULED. Returns the dispatches."""
    if not placements:
        return []
    job_ids = [job_id for job_id, _, _ in placements]
    numbers = dict(Attempt.objects.filter(job_id__in=job_ids).values("job_id").annotate(n=Max("number"))
                   .values_list("job_id", "n"))
    node_ids = {slot.node_id for _, taken, _ in placements for _, slot, _, _ in taken}
    sessions = dict(Node.objects.filter(id__in=node_ids).values_list("id", "session"))
    attempts, allocations, events, dispatches = [], [], [], []
    for job_id, taken, share in placements:
        primary = taken[0][1].node_id
        attempt_id, number, token = uuid.uuid4(), numbers.get(job_id, 0) + 1, secrets.token_hex(16)
        attempts.append((attempt_id, job_id, number, primary, sessions[primary], token, share, now, now, now, "", ""))
        for rank, slot, milli, memory in taken:
            allocations.append((attempt_id, slot.id, rank, milli / FULL, memory, True))
        where = ", ".join(sorted({f"{slot.index}" for _, slot, _, _ in taken}))
        message = f"SCHEDULED: attempt {number} placed on devices {where} ({share:g} GPU)"
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
    insert_rows(Allocation, ["attempt", "device", "rank", "share", "memory", "active"], allocations)
    insert_rows(JobEvent, ["job", "attempt", "time", "kind", "data", "message"], events)
    _announce_scheduled(job_ids)
    return dispatches


def _announce_scheduled(job_ids: list) -> None:
    """One lifecycle event per job the bulk UPDATE moved QUEUED -> SCHEDULED, delivered after commit."""
    from components.runtime import registry

    if not registry.subscribers():
        return
    from components.runtime.events import JobTransitioned
    from strata.jobs.events import emit_many

    rows = Job.objects.filter(pk__in=job_ids).values_list("id", "team_id", "kind")
    emit_many([JobTransitioned(job_id=str(job_id), team_id=team_id, kind=kind, source=S.QUEUED,
                               target=S.SCHEDULED, reason="placed; waiting for the node to start it")
               for job_id, team_id, kind in rows])


def _preempt_for(job_id, priority: int, resources: dict, selector, capacity: CapacityIndex, quotas) -> int:
    """Preempt the fewest lower-priority attempts on one node so that ``job_id`` fits there. Attempts that
    are already stopping (cancelled or preempted) count as free at no cost. Returns how many were preempted."""
    # Filtered to the index's devices in Python: an IN list of every node id costs more than the rows.
    active = (Allocation.objects.filter(active=True)
              .values_list("attempt_id", "attempt__job_id", "attempt__job__priority", "attempt__job__team_id",
                           "attempt__job__state", "attempt__started_at", "device_id", "share", "memory"))
    by_node: dict[object, dict] = defaultdict(dict)
    for attempt_id, victim_job, victim_priority, team_id, state, started, device_id, share, memory in active:
        if device_id not in capacity.devices:
            continue
        effective = victim_priority + (quotas[team_id].priority if team_id in quotas else 0)
        stopping = state in {S.CANCELLED, S.PREEMPTED}
        if not stopping and effective >= priority:
            continue
        node_id = capacity.devices[device_id].node_id
        entry = by_node[node_id].setdefault(attempt_id, {"job": victim_job, "stopping": stopping,
                                                         "order": (not stopping, effective, -(started.timestamp() if started else 0)),
                                                         "allocs": []})
        entry["allocs"].append((device_id, round(share * FULL), memory))
    best = None
    for node_id, candidates in by_node.items():
        ordered = sorted(candidates.values(), key=lambda c: c["order"])
        freed, chosen = [], []
        for candidate in ordered:
            for device_id, milli, memory in candidate["allocs"]:
                capacity.give(device_id, milli, memory)
                freed.append((device_id, milli, memory))
            chosen.append(candidate)
            others = set(capacity.nodes) - {node_id}
            if resources_fit(capacity, resources, selector, others):
                cost = sum(1 for c in chosen if not c["stopping"])
                if best is None or cost < best[0]:
                    best = (cost, [c["job"] for c in chosen if not c["stopping"]])
                break
        for device_id, milli, memory in freed:
            capacity.take(device_id, milli, memory)
    if not best or not best[1]:
        return 0
    count = 0
    for victim in best[1]:
        try:
            transition(victim, [S.RUNNING, S.SCHEDULED], S.PREEMPTED, f"preempted by higher-priority job {job_id}")
            count += 1
        except InvalidTransition:
            continue
    return count


def resources_fit(capacity: CapacityIndex, resources: dict, selector, exclude) -> bool:
    gpus = float(resources.get("gpus", 0))
    memory = resources.get("gpu_memory")
    if gpus > 1:
        return capacity.find_whole(int(round(gpus)), memory, selector, exclude) is not None
    return capacity.find_fraction(gpus, memory, selector, exclude) is not None


# --- reaper and reconciler ----------------------------------------------------------------------------------

def reap(now=None) -> dict:
    """Requeue the attempts of nodes whose lease expired (not counted as failures), and fail attempts that
    overran their job's time limit by more than the grace period."""
    now = now or timezone.now()
    lost_nodes = list(Node.objects.filter(state=Node.State.UP, lease_expires_at__lte=now))
    requeued = 0
    for node in lost_nodes:
        if Node.objects.filter(pk=node.pk, state=Node.State.UP, lease_expires_at__lte=now).update(
                state=Node.State.DOWN):
            log.warning("node %s missed its lease; requeueing its attempts", node.name)
        requeued += release_node_attempts(node, "node lease expired")
    overdue = 0
    grace = timedelta(seconds=60)
    for attempt in Attempt.objects.filter(ended_at__isnull=True, started_at__isnull=False).select_related("job"):
        if attempt.started_at + timedelta(seconds=attempt.job.time_limit) + grace < now:
            from strata.jobs.services import attempt_end

            if attempt_end(attempt, Attempt.Outcome.TIME_LIMIT, "time limit exceeded (reaped)"):
                overdue += 1
    return {"lost_nodes": len(lost_nodes), "requeued": requeued, "overdue": overdue}


def release_node_attempts(node: Node, reason: str, *, keep_session=None) -> int:
    """End every active attempt that has a device on ``node`` (except those of session ``keep_session``)."""
    attempts = Attempt.objects.filter(ended_at__isnull=True, allocations__device__node=node).distinct()
    if keep_session is not None:
        attempts = attempts.exclude(node_session=keep_session)
    count = 0
    for attempt in attempts:
        attempt_lost(attempt, reason)
        count += 1
    return count


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
    """The beat: reap, reconcile, then a scheduling pass."""
    reaped = reap()
    republished = reconcile()
    result = schedule_pass()
    return {**reaped, "republished": republished, "placed": result.placed, "admitted": result.admitted}
