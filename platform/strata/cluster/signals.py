"""What the cluster asks of the layers above it about the work on its nodes, without importing them.

The cluster knows nodes and devices; the attempts that run on them are the jobs app's (:mod:`strata.jobs.node_work`
answers every signal here, connected in ``JobsConfig.ready``). Each is sent with ``sender=Node`` from inside the
node call's transaction and its receivers' answers are what the call goes on with; a receiver that raises fails the
call, as a direct call would. Without a receiver a node runs nothing: no attempt to stop, release or report on.
"""

from __future__ import annotations

from django.dispatch import Signal

# node, reason, keep_session (spare that session's attempts), only (just these attempt ids): end the node's
# attempts as for a lost node. Answer: how many were ended (or shrunk).
node_lost = Signal()
# node, devices (a queryset of its devices about to be deleted): the work on them lets go of them.
devices_removed = Signal()
# node, attempt_ids (those its heartbeat or renewal listed), now: hold the node to them. Answer:
# {"stop": the listed attempts it must stop, "stalled": how many dispatched to it it left unclaimed too long}.
node_beat = Signal()
# node: how many attempts that have not ended hold a device on it. Answer: int.
node_work_left = Signal()
# node_key (the node's id as the database stores it): whether any attempt that has not ended holds a device on
# it (the lean renewal's one extra query). Answer: bool.
node_holds_work = Signal()
# node, attempt_ids: which of them run on the node. Answer: {attempt id: (job id, its stored reports)}.
node_attempts = Signal()
# updates: {attempt id: {"reports": ..., "measured_memory": ...}}, the plugins' reports about attempts to store.
attempt_reports = Signal()


def answers(signal: Signal, **kwargs) -> list:
    """The answers of ``signal``'s receivers, sent with ``sender=Node``."""
    from strata.cluster.models import Node

    return [answer for _, answer in signal.send(sender=Node, **kwargs)]
