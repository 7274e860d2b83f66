"""Scheduler hooks of the decentral plugin (light)."""

from __future__ import annotations

from typing import ClassVar

from components.runtime.contract.policies import FailurePolicy, LostAttempt, NodeLoss


class SwarmCarriesOn(FailurePolicy):
    """A swarm does not restart when a node with some of its peers is lost: the other peers carry on (and new
    ones may join). Only when the lost node ran rank 0 (which reports and checkpoints the swarm) or was the
    attempt's only node is the job requeued, to resume from its checkpoint."""

    kinds: ClassVar[tuple[str, ...]] = ("decentralized-train",)

    def on_node_loss(self, lost: LostAttempt) -> NodeLoss:
        if lost.primary or lost.nodes_left == 0:
            return NodeLoss.REQUEUE
        return NodeLoss.CARRY_ON
