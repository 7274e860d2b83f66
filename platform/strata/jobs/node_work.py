"""The attempts on a node, for the cluster's node protocol (:mod:`strata.cluster.signals`): the cluster knows
nodes and devices and asks, through those signals, what runs on them; this module answers (connected in
``JobsConfig.ready``). It ends the attempts of a lost node (:func:`release_node_attempts`, which the reaper calls
too), holds a node to the attempts its heartbeats list, and stores the plugins' reports about attempts."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection

from strata.cluster import signals
from strata.cluster.models import LIVE_STATES, Device, Node
from strata.jobs.models import Allocation, Attempt
from strata.jobs.services import STOPPED_STATES, attempt_drop_node, attempt_lost


def release_node_attempts(node: Node, reason: str, *, keep_session=None, only=None) -> int:
    """End (or, where a plugin's failure policy carries on, shrink) every active attempt that has a device on
    ``node``, except those of session ``keep_session`` (``only``: just these attempt ids). Without a
    ``FailurePolicy`` hook for its kind an attempt ends ``node_lost`` and its job is requeued. Returns how many
    attempts were affected."""
    from components.runtime.contract import registry
    from components.runtime.contract.policies import FailurePolicy, LostAttempt, NodeLoss, node_loss

    hooks = registry.hooks(FailurePolicy)
    attempts = (Attempt.objects.filter(ended_at__isnull=True, allocations__device__node=node).distinct()
                .select_related("job"))
    if keep_session is not None:
        attempts = attempts.exclude(node_session=keep_session)
    if only is not None:
        attempts = attempts.filter(pk__in=list(only))
    count = 0
    for attempt in attempts:
        decision, primary, left = NodeLoss.REQUEUE, attempt.node_id == node.pk, 0
        if hooks and any(hook.applies(attempt.job.kind) for hook in hooks):
            others = (Allocation.objects.filter(attempt=attempt, active=True).exclude(device__node=node)
                      .values_list("device__node_id", flat=True).distinct())
            left = Node.objects.filter(pk__in=list(others), state__in=LIVE_STATES).count()
            decision = node_loss(LostAttempt(
                job_id=str(attempt.job_id), attempt_id=str(attempt.pk), team_id=attempt.job.team_id,
                kind=attempt.job.kind, number=attempt.number, node=node.name, primary=primary,
                nodes_left=left), hooks)
        if decision == NodeLoss.CARRY_ON and not primary and left:
            attempt_drop_node(attempt, node, reason)
        elif decision == NodeLoss.REQUEUE:
            attempt_lost(attempt, reason)
        else:
            why = ("its kind's failure policy fails the job" if decision == NodeLoss.FAIL
                   else "nothing left to carry on with; not requeued (its kind's failure policy)")
            attempt_lost(attempt, f"{reason}; {why}", requeue=False)
        count += 1
    return count


def reconcile_attempts(node: Node, listed: set[str], now) -> int:
    """Hold a node to the attempts it says it runs; returns how many attempts dispatched to it it has left
    unclaimed for longer than ``STRATA_CLAIM_TIMEOUT_SECONDS`` (its worker takes no work: the agent restarts it).

    A heartbeat lists the attempts its node runs. One the node claimed but has not listed for a whole node lease is
    no longer run there -- its worker died and restarted without it, say, or could not report its end -- and
    ends as for a lost node (requeued without counting a failure, or as the kind's failure policy says), instead
    of holding its devices while the node lives on. Tracked per allocation (``claimed_at``, ``unreported_since``),
    so each node of a gang answers for its own ranks."""
    rows = list(Allocation.objects.filter(device__node=node, active=True, attempt__ended_at__isnull=True)
                .values_list("id", "attempt_id", "unreported_since", "claimed_at", "attempt__dispatched_at"))
    if not rows:
        return 0
    cutoff = now - timedelta(seconds=settings.STRATA_NODE_LEASE_SECONDS)
    claimed = [(row, str(attempt), since) for row, attempt, since, claimed_at, _ in rows if claimed_at is not None]
    clear = [row for row, attempt, since in claimed if attempt in listed and since is not None]
    mark = [row for row, attempt, since in claimed if attempt not in listed and since is None]
    lost = {attempt for _, attempt, since in claimed if attempt not in listed and since is not None and since < cutoff}
    if clear:
        Allocation.objects.filter(pk__in=clear).update(unreported_since=None)
    if mark:
        Allocation.objects.filter(pk__in=mark, unreported_since__isnull=True).update(unreported_since=now)
    if lost:
        release_node_attempts(node, f"node {node.name} no longer runs it (not in its heartbeats for "
                                    f"{settings.STRATA_NODE_LEASE_SECONDS:g} s)", only=lost)
    overdue = now - timedelta(seconds=settings.STRATA_CLAIM_TIMEOUT_SECONDS)
    return len({attempt for _, attempt, _, claimed_at, dispatched in rows
                if claimed_at is None and dispatched is not None and dispatched < overdue})


def node_attempts_left(node: Node) -> int:
    """How many attempts that have not ended hold a device on ``node`` (dispatched, claimed or running)."""
    return (Attempt.objects.filter(ended_at__isnull=True, allocations__device__node=node, allocations__active=True)
            .distinct().count())


def holds_allocations(node_key) -> bool:
    """Whether any active allocation of an attempt that has not ended is on the node (its devices)."""
    allocation = connection.ops.quote_name(Allocation._meta.db_table)
    device = connection.ops.quote_name(Device._meta.db_table)
    attempt = connection.ops.quote_name(Attempt._meta.db_table)
    q = connection.ops.quote_name
    a_device = q(Allocation._meta.get_field("device").column)
    a_attempt = q(Allocation._meta.get_field("attempt").column)
    a_active = q(Allocation._meta.get_field("active").column)
    d_node = q(Device._meta.get_field("node").column)
    t_ended = q(Attempt._meta.get_field("ended_at").column)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {allocation} a JOIN {device} d ON a.{a_device} = d.id JOIN {attempt} t "
            f"ON a.{a_attempt} = t.id WHERE d.{d_node} = %s AND a.{a_active} = %s AND t.{t_ended} IS NULL LIMIT 1",
            [node_key, True])
        return cursor.fetchone() is not None


def beat(node: Node, attempt_ids: list[str], now) -> dict:
    """The attempts a heartbeat or a lease renewal tells the node to stop (of those it listed: ended, of a stopped
    job, or unknown) and how many are ``stalled`` (:func:`reconcile_attempts`, which holds the node to the
    attempts it listed)."""
    stalled = reconcile_attempts(node, {str(attempt_id) for attempt_id in attempt_ids}, now)
    known = {str(attempt_id): ended is not None or state in STOPPED_STATES
             for attempt_id, ended, state in Attempt.objects.filter(pk__in=attempt_ids)
             .values_list("id", "ended_at", "job__state")} if attempt_ids else {}
    return {"stop": [attempt_id for attempt_id in attempt_ids if known.get(attempt_id, True)], "stalled": stalled}


def attempts_on(node: Node, attempt_ids) -> dict:
    """Attempt id -> (job id, stored reports), for those of ``attempt_ids`` that run on ``node``."""
    return {str(attempt_id): (job_id, stored) for attempt_id, job_id, stored in
            Attempt.objects.filter(pk__in=attempt_ids, node=node).values_list("id", "job_id", "reports")}


def reports_store(updates: dict[str, dict]) -> None:
    """Store the plugins' reports about attempts (and their measured memory): attempt id -> fields."""
    for attempt, update in updates.items():
        Attempt.objects.filter(pk=attempt).update(**update)


def connect() -> None:
    """Answer the cluster's signals (:mod:`strata.cluster.signals`); called once, from ``JobsConfig.ready``."""
    receivers = {
        signals.node_lost: lambda node, reason, keep_session=None, only=None, **_: release_node_attempts(
            node, reason, keep_session=keep_session, only=only),
        signals.devices_removed: lambda devices, **_: Allocation.objects.filter(
            device__in=devices, active=True).update(active=False),
        signals.node_beat: lambda node, attempt_ids, now, **_: beat(node, attempt_ids, now),
        signals.node_work_left: lambda node, **_: node_attempts_left(node),
        signals.node_holds_work: lambda node_key, **_: holds_allocations(node_key),
        signals.node_attempts: lambda node, attempt_ids, **_: attempts_on(node, attempt_ids),
        signals.attempt_reports: lambda updates, **_: reports_store(updates),
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver, sender=Node, weak=False, dispatch_uid=f"jobs-node-work-{id(signal)}")
