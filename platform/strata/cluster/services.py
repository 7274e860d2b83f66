"""Node registration, heartbeats (the node's lease), plugins' reports, GPU-sharing reports and device-pool
policies."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from strata.cluster.models import Device, DevicePool, Node, node_pool
from strata.jobs.models import Allocation, Attempt
from strata.jobs.services import STOPPED_STATES

log = logging.getLogger(__name__)
SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,200}$")


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


class PoolInvalid(ValueError):
    """A bad pool change; ``errors`` maps each field to its message. Nothing was changed."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


def pool_policy(name: str) -> str:
    """The GPU-sharing policy of pool ``name`` (the default policy when no admin set one)."""
    policy = DevicePool.objects.filter(name=name).values_list("sharing_policy", flat=True).first()
    return policy or DevicePool._meta.get_field("sharing_policy").default


def pool_policy_set(name: str, policy: str) -> DevicePool:
    """Set the GPU-sharing policy of pool ``name``, creating its row if needed. Nodes of the pool get the new
    policy in their next heartbeat answer. Raises PoolInvalid (nothing changed)."""
    errors = {}
    if not isinstance(name, str) or not SLUG.match(name):
        errors["name"] = "letters, digits, '-' and '_' only (at most 200)"
    if policy not in DevicePool.Policy.values:
        errors["sharing_policy"] = f"must be one of {', '.join(DevicePool.Policy.values)}"
    if errors:
        raise PoolInvalid(errors)
    pool, created = DevicePool.objects.get_or_create(name=name, defaults={"sharing_policy": policy})
    if not created and pool.sharing_policy != policy:
        pool.sharing_policy = policy
        pool.updated_at = timezone.now()
        pool.save(update_fields=["sharing_policy", "updated_at"])
    return pool


def pools_list() -> list[dict]:
    """Every pool that has nodes or a policy row: name, policy, node and device counts."""
    rows = {pool.name: pool for pool in DevicePool.objects.all()}
    counts: dict[str, list[int]] = {name: [0, 0] for name in rows}
    for labels, devices in Node.objects.annotate(device_count=Count("devices")).values_list("labels", "device_count"):
        entry = counts.setdefault(node_pool(labels), [0, 0])
        entry[0] += 1
        entry[1] += devices
    default_policy = DevicePool._meta.get_field("sharing_policy").default
    return [{"name": name, "sharing_policy": rows[name].sharing_policy if name in rows else default_policy,
             "updated_at": rows[name].updated_at if name in rows else None, "nodes": nodes, "devices": devices}
            for name, (nodes, devices) in sorted(counts.items())]


def _epoch(value: float):
    return datetime.fromtimestamp(value, tz=UTC)


SHARED_JOB_FIELDS = ("state", "lane", "persistent", "ephemeral", "steps")


def sharing_record(node: Node, devices: dict[int, Device], reports: list[dict], now) -> None:
    """Store each device service's report: the latest state (without slices) on ``Device.sharing`` and the
    slices as ShareSlice rows. Attempts that are unknown or not on this node are dropped, and slices that
    start before the device's last stored slice ended (a retried heartbeat) are not stored twice."""
    from strata.telemetry.models import ShareSlice

    wanted = set()
    for report in reports:
        for lane in report.get("lanes", []):
            wanted.update(str(a) for a in lane.get("attempts", []))
        wanted.update(str(job["attempt"]) for job in report.get("jobs", []))
        wanted.update(str(piece["attempt"]) for piece in report.get("slices", []))
    owned = {str(attempt_id): job_id for attempt_id, job_id in
             Attempt.objects.filter(pk__in=wanted, node=node).values_list("id", "job_id")} if wanted else {}
    slices, reported = [], set()
    for report in reports:
        device = devices.get(int(report["index"]))
        if device is None or device.pk in reported:
            continue
        reported.add(device.pk)
        previous_until = float((device.sharing or {}).get("slices_until") or 0.0)
        until = previous_until
        for piece in report.get("slices", []):
            attempt = str(piece["attempt"])
            if attempt not in owned or piece["start"] < previous_until:
                continue
            slices.append(ShareSlice(device=device, attempt_id=attempt, job_id=owned[attempt],
                                     start=_epoch(piece["start"]), end=_epoch(piece["end"])))
            until = max(until, piece["end"])
        state = {
            "policy": report["policy"], "switches": report["switches"],
            "switch_latency_ms": dict(report["switch_latency_ms"]), "utilization": report["utilization"],
            "budget": report["budget"],
            "lanes": [{"id": lane["id"], "size": lane["size"],
                       "attempts": [str(a) for a in lane.get("attempts", []) if str(a) in owned]}
                      for lane in report.get("lanes", [])],
            "jobs": [{**job, "attempt": str(job["attempt"]), "job": str(owned[str(job["attempt"])])}
                     for job in report.get("jobs", []) if str(job["attempt"]) in owned],
            "reported_at": now.timestamp(), "slices_until": until,
        }
        Device.objects.filter(pk=device.pk).update(sharing=state)
        for job in state["jobs"]:
            Attempt.objects.filter(pk=job["attempt"]).update(sharing={
                "policy": report["policy"], **{key: job.get(key) for key in SHARED_JOB_FIELDS}})
    # A device whose service is no longer reported shares nothing now.
    stale = [device.pk for device in devices.values() if device.sharing and device.pk not in reported]
    if stale:
        Device.objects.filter(pk__in=stale).update(sharing={})
    ShareSlice.objects.bulk_create(slices, batch_size=1000)


MAX_REPORT_PLUGINS = 64


def reports_clean(reports: object, scope: str) -> tuple[dict, dict]:
    """``(normalized, errors)`` of a ``{plugin: payload}`` report: each payload checked by its plugin's
    ``ReportSchema`` (``scope`` is "node" or "attempt"). ``errors`` is ``{plugin: {field: [message]}}``: an
    unregistered plugin, a plugin without a schema, a refused payload, or a schema that failed."""
    from components.runtime import registry
    from components.runtime.plugins import ReportError

    if not isinstance(reports, dict):
        return {}, {"non_field_errors": ["must be an object {plugin: payload}"]}
    if len(reports) > MAX_REPORT_PLUGINS:
        return {}, {"non_field_errors": [f"at most {MAX_REPORT_PLUGINS} plugins may report at once"]}
    clean: dict = {}
    errors: dict = {}
    for plugin, payload in reports.items():
        schema = registry.report_schema(plugin)
        if schema is None:
            errors[plugin] = {"non_field_errors": [f"no registered plugin {plugin!r} takes reports"]}
            continue
        try:
            clean[plugin] = getattr(schema, scope)(payload)
        except ReportError as error:
            errors[plugin] = {field or "non_field_errors": [message] for field, message in error.errors.items()}
        except Exception as error:  # noqa: BLE001 - a plugin's schema must not turn a heartbeat into a 500
            log.exception("the report schema of plugin %s failed", plugin)
            errors[plugin] = {"non_field_errors": [f"the plugin's report schema failed: {type(error).__name__}"]}
    return clean, errors


def reports_merge(stored: dict | None, clean: dict, now) -> dict:
    """The stored ``{plugin: {"time", "payload"}}`` with the new payloads of ``clean`` put in at ``now``."""
    merged = dict(stored or {})
    merged.update({plugin: {"time": now.timestamp(), "payload": payload} for plugin, payload in clean.items()})
    return merged


def node_heartbeat(node: Node, session: str, samples: list[dict], attempt_ids: list[str],
                   sharing: list[dict] | None = None, reports: dict | None = None) -> dict:
    """Extend the lease, record device samples and GPU-sharing reports, and tell the node which of its
    attempts must stop and which sharing policy its pool uses."""
    from strata.telemetry.services import samples_record

    if str(node.session) != str(session):
        raise StaleSession("this node session was replaced; register again")
    now = timezone.now()
    if node.state == Node.State.DOWN:
        raise StaleSession("the node's lease expired and its attempts were requeued; register again")
    changes = {"last_heartbeat": now, "lease_expires_at": _lease_until(now)}
    if reports:
        changes["reports"] = reports_merge(node.reports, reports, now)
    Node.objects.filter(pk=node.pk).update(**changes)
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
    sharing_record(node, devices, sharing or [], now)
    known = {str(attempt_id): ended is not None or state in STOPPED_STATES
             for attempt_id, ended, state in Attempt.objects.filter(pk__in=attempt_ids)
             .values_list("id", "ended_at", "job__state")} if attempt_ids else {}
    stop = [attempt_id for attempt_id in attempt_ids if known.get(attempt_id, True)]
    return {"lease_seconds": settings.STRATA_NODE_LEASE_SECONDS, "stop": stop,
            "sharing_policy": pool_policy(node_pool(node.labels))}
