"""Node registration and heartbeats (the node's lease)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from strata.cluster.models import Device, Node
from strata.jobs.models import Allocation, Attempt
from strata.jobs.services import STOPPED_STATES


class StaleSession(Exception):
    """A heartbeat from a node session that was replaced by a newer registration."""


def _lease_until(now):
    return now + timedelta(seconds=settings.STRATA_NODE_LEASE_SECONDS)


def node_register(*, name: str, hostname: str = "", address: str = "", labels: dict | None = None,
                  devices: list[dict], info: dict | None = None) -> Node:
    """Register (or re-register) a node with its devices and start a new session and lease.

    Attempts that were dispatched to an earlier session of this node died with it: they are requeued now
    rather than when the old lease would have expired.
    """
    from strata.scheduling.services import release_node_attempts
    from strata.scheduling.tasks import request_pass

    now = timezone.now()
    with transaction.atomic():
        node, _ = Node.objects.update_or_create(
            name=name,
            defaults={"hostname": hostname, "address": address, "labels": labels or {}, "state": Node.State.UP,
                      "session": uuid.uuid4(), "registered_at": now, "last_heartbeat": now,
                      "lease_expires_at": _lease_until(now), "info": info or {}},
        )
        seen = set()
        for item in devices:
            seen.add(int(item["index"]))
            Device.objects.update_or_create(
                node=node, index=int(item["index"]),
                defaults={"kind": item["kind"], "name": item.get("name", ""), "memory_total": int(item["memory_total"])},
            )
        gone = Device.objects.filter(node=node).exclude(index__in=seen)
        Allocation.objects.filter(device__in=gone, active=True).update(active=False)
        gone.delete()
        release_node_attempts(node, "node restarted", keep_session=node.session)
    transaction.on_commit(request_pass)
    return node


def node_heartbeat(node: Node, session: str, samples: list[dict], attempt_ids: list[str]) -> dict:
    """Extend the lease, record device samples, and tell the node which of its attempts must stop."""
    from strata.telemetry.services import samples_record

    if str(node.session) != str(session):
        raise StaleSession("this node session was replaced; register again")
    now = timezone.now()
    if node.state == Node.State.DOWN:
        raise StaleSession("the node's lease expired and its attempts were requeued; register again")
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now, lease_expires_at=_lease_until(now))
    devices = {device.index: device for device in node.devices.all()}
    rows = []
    for sample in samples:
        device = devices.get(int(sample.get("index", -1)))
        if device is None:
            continue
        utilization = max(0.0, min(100.0, float(sample.get("utilization", 0.0))))
        memory = max(0, int(sample.get("memory_used", 0)))
        Device.objects.filter(pk=device.pk).update(utilization=utilization, memory_used=memory, updated_at=now)
        rows.append((device.pk, utilization, memory))
    samples_record(rows, now)
    known = {str(attempt_id): ended is not None or state in STOPPED_STATES
             for attempt_id, ended, state in Attempt.objects.filter(pk__in=attempt_ids)
             .values_list("id", "ended_at", "job__state")} if attempt_ids else {}
    stop = [attempt_id for attempt_id in attempt_ids if known.get(attempt_id, True)]
    return {"lease_seconds": settings.STRATA_NODE_LEASE_SECONDS, "stop": stop}
