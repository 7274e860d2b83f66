"""Node registration, heartbeats (the node's lease), plugins' reports (the generic report channel) and
device-pool policies."""

from __future__ import annotations

import json
import logging
import re
import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from strata.cluster import signals
from strata.cluster.models import CPU_INDEX, Device, DevicePool, Node, gpu_devices, node_pool

log = logging.getLogger(__name__)
SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,200}$")


class StaleSession(Exception):
    """A heartbeat from a node session that was replaced by a newer registration."""


def _lease_until(now):
    return now + timedelta(seconds=settings.STRATA_NODE_LEASE_SECONDS)


def node_register(*, name: str, hostname: str = "", address: str = "", labels: dict | None = None,
                  devices: list[dict], info: dict | None = None, cpus: float | None = None,
                  memory: int | None = None) -> Node:
    """Register (or re-register) a node with its devices and start a new session and lease.

    ``cpus`` and ``memory`` (bytes), when the node reports them, are what jobs that reserve CPUs share: the node
    gets (or keeps) its CPU device (``Device.Kind.CPU``), which their allocations point at; a node that reports
    no CPUs has none and takes no such job.

    Attempts that were dispatched to an earlier session of this node died with it: they are requeued now
    rather than when the old lease would have expired.
    """
    from strata.celery import request_pass

    now = timezone.now()
    with transaction.atomic():
        node, _ = Node.objects.update_or_create(
            name=name,
            defaults={"hostname": hostname, "address": address, "labels": labels or {}, "state": Node.State.UP,
                      "session": uuid.uuid4(), "registered_at": now, "last_heartbeat": now,
                      "lease_expires_at": _lease_until(now), "info": info or {}, "cpus": cpus,
                      "memory": memory},
        )
        seen = set()
        for item in devices:
            seen.add(int(item["index"]))
            Device.objects.update_or_create(
                node=node, index=int(item["index"]),
                defaults={"kind": item["kind"], "name": item.get("name", ""), "memory_total": int(item["memory_total"])},
            )
        if cpus:
            seen.add(CPU_INDEX)
            Device.objects.update_or_create(
                node=node, index=CPU_INDEX,
                defaults={"kind": Device.Kind.CPU, "name": f"{cpus:g} CPUs", "memory_total": int(memory or 0)})
        gone = Device.objects.filter(node=node).exclude(index__in=seen)
        signals.answers(signals.devices_removed, node=node, devices=gone)
        gone.delete()
        signals.answers(signals.node_lost, node=node, reason="node restarted", keep_session=node.session)
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
    counted = Count("devices", filter=~Q(devices__kind=Device.Kind.CPU))  # GPUs only, not the CPU devices
    for labels, devices in Node.objects.annotate(device_count=counted).values_list("labels", "device_count"):
        entry = counts.setdefault(node_pool(labels), [0, 0])
        entry[0] += 1
        entry[1] += devices
    default_policy = DevicePool._meta.get_field("sharing_policy").default
    return [{"name": name, "sharing_policy": rows[name].sharing_policy if name in rows else default_policy,
             "updated_at": rows[name].updated_at if name in rows else None, "nodes": nodes, "devices": devices}
            for name, (nodes, devices) in sorted(counts.items())]


def _epoch(value: float):
    return datetime.fromtimestamp(value, tz=UTC)


MAX_SERIES_ROWS = 64 * 2000  # series rows stored per plugin and heartbeat


def _parts(plugin: str, payload: dict):
    """The plugin's ReportParts of a checked node payload, or None when its schema failed (logged)."""
    from components.runtime.contract import registry
    from components.runtime.contract.plugins import ReportParts

    schema = registry.report_schema(plugin)
    if schema is None:
        return None
    try:
        parts = schema.parts(payload)
    except Exception:  # noqa: BLE001 - a plugin's schema must not turn a heartbeat into a 500
        log.exception("the report schema of plugin %s failed to split its report", plugin)
        return None
    return parts if isinstance(parts, ReportParts) else None


def _index(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def reports_record(node: Node, devices: dict[int, Device], reports: dict, now) -> None:
    """Store the plugins' checked node reports, split by each plugin's ``ReportSchema.parts``: the node's part on
    ``Node.reports``, each device's on ``Device.reports``, each attempt's on ``Attempt.reports`` (and its
    measured memory on ``Attempt.measured_memory``), and the series rows as ``telemetry.ReportSeries``.

    Parts naming a device the node does not have, or an attempt that is unknown or not on this node, are
    dropped; series rows of a device (or of the node, without a device) that start before the end of the last
    stored row are not stored twice (a retried heartbeat). A device a plugin no longer reports about (or every
    device, when the plugin sent nothing) loses that plugin's report."""
    from strata.telemetry.models import ReportSeries

    stamp = now.timestamp()
    split = {plugin: parts for plugin, payload in (reports or {}).items()
             if (parts := _parts(plugin, payload)) is not None}
    wanted = {str(entry.get("attempt")) for parts in split.values() for entry in parts.attempts}
    wanted |= {str(row["attempt"]) for parts in split.values() for row in parts.series if row.get("attempt")}
    owned = {}
    for answer in signals.answers(signals.node_attempts, node=node, attempt_ids=wanted) if wanted else ():
        owned.update(answer)

    node_reports = dict(node.reports or {})
    device_reports = {index: dict(device.reports or {}) for index, device in devices.items()}
    attempt_updates: dict[str, dict] = {}
    series = []
    for plugin, parts in split.items():
        previous = node_reports.get(plugin) or {}
        node_until = float(previous.get("series_until") or 0.0)
        node_entry = {"time": stamp, "payload": parts.node, "series_until": node_until}
        fresh = {}
        for index, payload in parts.devices.items():
            index = _index(index)
            if index in devices:
                old = (devices[index].reports or {}).get(plugin) or {}
                fresh[index] = {"time": stamp, "payload": payload, "series_until": float(old.get("series_until") or 0.0)}
        for index, stored in device_reports.items():
            if index in fresh:
                stored[plugin] = fresh[index]
            else:
                stored.pop(plugin, None)
        for entry in parts.attempts:
            attempt = str(entry.get("attempt"))
            if attempt not in owned:
                continue
            device = devices.get(_index(entry.get("device")))
            update = attempt_updates.setdefault(attempt, {"reports": dict(owned[attempt][1] or {})})
            update["reports"][plugin] = {"time": stamp, "payload": entry.get("payload"), "node": str(node.pk),
                                         "device": device.pk if device is not None else None}
            memory = entry.get("memory")
            if isinstance(memory, int | float) and not isinstance(memory, bool) and memory >= 0:
                update["measured_memory"] = max(int(memory), update.get("measured_memory", 0))
        for row in parts.series[:MAX_SERIES_ROWS]:
            attempt = str(row["attempt"]) if row.get("attempt") else None
            if attempt is not None and attempt not in owned:
                continue
            index = _index(row.get("device")) if row.get("device") is not None else None
            if index is not None and index not in fresh:
                if index not in devices:
                    continue
                # Rows about a device without a device part: the device's report is its series bookkeeping.
                old = (devices[index].reports or {}).get(plugin) or {}
                fresh[index] = device_reports[index][plugin] = {
                    "time": stamp, "payload": None, "series_until": float(old.get("series_until") or 0.0)}
            holder = fresh[index] if index is not None else node_entry
            until = holder["series_until"]
            try:
                start, end = float(row["start"]), float(row["end"])
            except (KeyError, TypeError, ValueError):
                continue
            if start < until or end < start:
                continue
            series.append((holder, end, ReportSeries(
                plugin=plugin, device=devices[index] if index is not None else None, attempt_id=attempt,
                job_id=owned[attempt][0] if attempt else None, start=_epoch(start), end=_epoch(end),
                data=row.get("data") or {})))
        node_reports[plugin] = node_entry
    # Each holder's series_until moves to the end of its newest stored row (after all rows were checked against
    # the previous value, so the rows of one heartbeat are never checked against each other).
    for holder, end, _ in series:
        holder["series_until"] = max(holder["series_until"], end)

    for stored in device_reports.values():
        for plugin in [plugin for plugin in stored if plugin not in split]:
            del stored[plugin]  # the plugin said nothing about its devices this time: nothing to show now
    if split:
        Node.objects.filter(pk=node.pk).update(reports=node_reports)
        node.reports = node_reports
    for index, device in devices.items():
        if device_reports[index] != (device.reports or {}):
            Device.objects.filter(pk=device.pk).update(reports=device_reports[index])
            device.reports = device_reports[index]
    if attempt_updates:
        signals.answers(signals.attempt_reports, updates=attempt_updates)
    ReportSeries.objects.bulk_create([row for _, _, row in series], batch_size=1000)


MAX_REPORT_PLUGINS = 64


def reports_clean(reports: object, scope: str) -> tuple[dict, dict]:
    """``(normalized, errors)`` of a ``{plugin: payload}`` report: each payload checked by its plugin's
    ``ReportSchema`` (``scope`` is "node" or "attempt"). ``errors`` is ``{plugin: {field: [message]}}``: an
    unregistered plugin, a plugin without a schema, a refused payload, or a schema that failed."""
    from components.runtime.contract import registry
    from components.runtime.contract.plugins import ReportError

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


SAMPLE_BACKLOG_S = 600.0  # a batched sample's time is kept within this long before its heartbeat (else clamped)


def _sample_time(sample: dict, now):
    """When a sample was taken: its ``time`` (Unix s; the agent batches the samples of several heartbeats into
    one full heartbeat) clamped to [now - SAMPLE_BACKLOG_S, now], else ``now``."""
    stamp = sample.get("time")
    if stamp is None:
        return now
    try:
        taken = datetime.fromtimestamp(float(stamp), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return now
    return min(now, max(now - timedelta(seconds=SAMPLE_BACKLOG_S), taken))


def node_heartbeat(node: Node, session: str, samples: list[dict], attempt_ids: list[str],
                   reports: dict | None = None) -> dict:
    """The full heartbeat: extend the lease, record device samples and the plugins' reports (already checked by
    their schemas, see ``reports_clean``), and answer as :func:`node_renew` does.

    Samples may carry the ``time`` they were taken: an agent that renews its lease with :func:`node_renew` in
    between sends the samples of those beats with its next full heartbeat (every ``telemetry_seconds``); each is
    stored at its time, and a device's current utilization and memory are its newest sample's."""
    from strata.telemetry.services import samples_record

    _check_session(node, session)
    # One transaction, so one commit per heartbeat (a thousand nodes heartbeat 333 times a second: the commits,
    # each a WAL flush, were what the database spent its time on), and the device rows in one UPDATE.
    with transaction.atomic():
        now = timezone.now()
        Node.objects.filter(pk=node.pk).update(last_heartbeat=now, lease_expires_at=_lease_until(now))
        devices = {device.index: device for device in gpu_devices(node.devices.all())}
        rows, newest = [], {}
        for sample in samples:
            device = devices.get(int(sample.get("index", -1)))
            if device is None:
                continue
            taken = _sample_time(sample, now)
            utilization = max(0.0, min(100.0, float(sample.get("utilization", 0.0))))
            memory_used = max(0, int(sample.get("memory_used", 0)))
            rows.append((device.pk, utilization, memory_used, taken))
            if device.index not in newest or taken >= newest[device.index][2]:
                newest[device.index] = (utilization, memory_used, taken)
        changed = []
        for index, (utilization, memory_used, _taken) in newest.items():
            device = devices[index]
            device.utilization, device.memory_used, device.updated_at = utilization, memory_used, now
            changed.append(device)
        if changed:
            _devices_update(changed)
        if rows:
            if all(row[3] == now for row in rows):
                samples_record([row[:3] for row in rows], now)
            else:
                samples_record_at(rows)
        reports_record(node, devices, reports or {}, now)
    return _beat_answer(node, attempt_ids, now)


def samples_record_at(rows: list[tuple[int, float, int, datetime]]) -> None:
    """Store (device id, utilization %, memory bytes, time) samples, each at its own time."""
    from strata.telemetry.models import DeviceSample

    DeviceSample.objects.bulk_create([DeviceSample(device_id=device_id, time=taken, utilization=utilization,
                                                   memory_used=memory)
                                      for device_id, utilization, memory, taken in rows])


def _beat_answer(node: Node, attempt_ids: list[str], now) -> dict:
    """What a heartbeat and a lease renewal answer: the attempts the node must stop (of those it listed), its
    pool's sharing policy, its state, the full-telemetry cadence; ``stalled`` and ``attempts_left`` when they
    apply. Holds the node to the attempts it listed (``signals.node_beat``, answered by the jobs app)."""
    stop, stalled = list(attempt_ids), 0  # no attempt runs where nothing answers: stop what it lists
    for answer in signals.answers(signals.node_beat, node=node, attempt_ids=attempt_ids, now=now):
        stop, stalled = answer["stop"], answer["stalled"]
    return _answer(node, stop, stalled)


def _answer(node: Node, stop: list[str], stalled: int, policy: str | None = None) -> dict:
    answer = {"lease_seconds": settings.STRATA_NODE_LEASE_SECONDS, "stop": stop,
              "sharing_policy": policy or pool_policy(node_pool(node.labels)), "state": node.state,
              "telemetry_seconds": telemetry_seconds()}
    if stalled:
        # Dispatched here, never claimed: the node's worker takes no work (hung after a broker outage, say).
        answer["stalled"] = {"attempts": stalled, "after_seconds": settings.STRATA_CLAIM_TIMEOUT_SECONDS}
    if node.state == Node.State.DRAINING:
        answer["attempts_left"] = node_attempts_left(node)
    return answer


def telemetry_seconds() -> float:
    """How often an agent that renews its lease with ``node/renew/`` sends a full heartbeat (its batched device
    samples and its plugins' reports): ``STRATA_NODE_TELEMETRY_SECONDS``, by default five heartbeat intervals,
    never less than one."""
    configured = settings.STRATA_NODE_TELEMETRY_SECONDS
    if configured is None:
        configured = 5 * settings.STRATA_HEARTBEAT_SECONDS
    return max(float(configured), float(settings.STRATA_HEARTBEAT_SECONDS))


class NodeUnknown(Exception):
    """A call about a node id that is not registered."""


class TokenRefused(Exception):
    """The node token of a lease renewal was revoked or expired after it was last checked."""


def _db(field, value):
    return field.get_db_prep_value(value, connection)


def node_renew(node_id, session, attempt_ids: list[str], token_id=None) -> dict:
    """The lean lease renewal (``POST node/renew/``): extend the lease of the node's current session and answer
    as a heartbeat does, recording nothing else (the samples and reports wait for the next full heartbeat).

    One fenced ``UPDATE ... RETURNING``: only the node's current ``session``, only while UP or DRAINING (a node
    the reaper marked DOWN, or that left, must register again), and, with ``token_id``, only while that node token
    is neither revoked nor expired (a revocation refuses the very next renewal, whatever the authentication cache
    holds). A node that holds no attempt and lists none costs one more query (are any allocated to it?); one
    that does is reconciled as a heartbeat is. Raises NodeUnknown, StaleSession or TokenRefused."""
    from strata.accounts.models import ApiToken

    now = timezone.now()
    node_table = connection.ops.quote_name(Node._meta.db_table)
    column = {name: connection.ops.quote_name(Node._meta.get_field(name).column)
              for name in ("id", "session", "state", "labels", "last_heartbeat", "lease_expires_at")}
    try:
        node_key = _db(Node._meta.pk, uuid.UUID(str(node_id)))
        session_key = _db(Node._meta.get_field("session"), uuid.UUID(str(session)))
    except ValueError:
        raise NodeUnknown("unknown node") from None
    stamp = _db(Node._meta.get_field("last_heartbeat"), now)
    sql = (f"UPDATE {node_table} SET {column['last_heartbeat']} = %s, {column['lease_expires_at']} = %s "
           f"WHERE {column['id']} = %s AND {column['session']} = %s AND {column['state']} IN (%s, %s)")
    params = [stamp, _db(Node._meta.get_field("lease_expires_at"), _lease_until(now)), node_key, session_key,
              Node.State.UP, Node.State.DRAINING]
    if token_id is not None:
        token_table = connection.ops.quote_name(ApiToken._meta.db_table)
        sql += (f" AND EXISTS (SELECT 1 FROM {token_table} WHERE id = %s AND revoked_at IS NULL "
                f"AND expires_at > %s)")
        params += [_db(ApiToken._meta.pk, token_id), stamp]
    sql += f" RETURNING {column['state']}, {column['labels']}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        _renewal_refused(node_id, session, token_id, now)
    state, labels = row
    if isinstance(labels, str | bytes):
        labels = json.loads(labels)
    node = Node(pk=uuid.UUID(str(node_id)), session=session, state=state, labels=labels or {})
    if attempt_ids or any(signals.answers(signals.node_holds_work, node_key=node_key)):
        return _beat_answer(Node.objects.get(pk=node.pk), [str(a) for a in attempt_ids], now)
    return _answer(node, [], 0)


def _renewal_refused(node_id, session, token_id, now) -> None:
    """Why a renewal's UPDATE matched no row: NodeUnknown, StaleSession (another session, or DOWN) or
    TokenRefused. Always raises."""
    from strata.accounts.models import ApiToken

    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        raise NodeUnknown("unknown node")
    _check_session(node, session)
    if token_id is not None and not ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True,
                                                            expires_at__gt=now).exists():
        raise TokenRefused("Token has been revoked.")
    # The row changed between the UPDATE and this look (a registration, the reaper): the node must start over.
    raise StaleSession("this node session changed while its lease was renewed; register again")


def _devices_update(devices: list[Device]) -> None:
    """Store the devices' sampled utilization and memory: one prepared UPDATE run for each (the ORM's
    ``bulk_update`` builds a CASE expression per row and cost more CPU than the database work it saved)."""
    table = connection.ops.quote_name(Device._meta.db_table)
    columns = {name: connection.ops.quote_name(Device._meta.get_field(name).column)
               for name in ("utilization", "memory_used", "updated_at", "id")}
    field = Device._meta.get_field("updated_at")
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET {columns['utilization']} = %s, {columns['memory_used']} = %s, "
            f"{columns['updated_at']} = %s WHERE {columns['id']} = %s",
            [(device.utilization, device.memory_used, field.get_db_prep_value(device.updated_at, connection),
              device.pk) for device in devices])


def _check_session(node: Node, session) -> None:
    """Fencing of the node's own calls: only its current session, and not after it went DOWN."""
    if str(node.session) != str(session):
        raise StaleSession("this node session was replaced; register again")
    if node.state == Node.State.DOWN:
        raise StaleSession("the node's lease expired or it left, and its attempts were requeued; register again")


def node_attempts_left(node: Node) -> int:
    """How many attempts that have not ended hold a device on ``node`` (dispatched, claimed or running)."""
    return sum(signals.answers(signals.node_work_left, node=node))


def node_drain(node: Node, session) -> dict:
    """The node stops taking work: DRAINING until it leaves or registers again. The scheduler places nothing new
    on it (its capacity counts only UP nodes); its attempts keep their devices and run on, and its lease goes
    on with its heartbeats. Draining twice is the same as once. Raises StaleSession (another session, or DOWN)."""
    _check_session(node, session)
    if Node.objects.filter(pk=node.pk, session=node.session, state=Node.State.UP).update(state=Node.State.DRAINING):
        log.info("node %s is draining", node.name)
    node.refresh_from_db(fields=["state"])
    if node.state == Node.State.DOWN:
        raise StaleSession("the node's lease expired or it left, and its attempts were requeued; register again")
    return {"state": node.state, "attempts_left": node_attempts_left(node),
            "lease_seconds": settings.STRATA_NODE_LEASE_SECONDS}


def node_leave(node: Node, session, reason: str = "node left") -> dict:
    """The node goes away on purpose (its agent stops, or its allocation ends): DOWN at once, and its remaining
    attempts end as for a lost node (``node_lost``: requeued without counting a failure, unless a kind's failure
    policy says otherwise), so the worker's late reports about them are refused as stale. A pass is requested.
    Leaving again (the same session, already DOWN) is harmless. Raises StaleSession (another session)."""
    from strata.celery import request_pass

    if str(node.session) != str(session):
        raise StaleSession("this node session was replaced; register again")
    with transaction.atomic():
        left = Node.objects.filter(pk=node.pk, session=node.session).exclude(state=Node.State.DOWN).update(
            state=Node.State.DOWN, lease_expires_at=timezone.now())
        # Attempts of every session: a node that leaves has nothing running any more.
        released = sum(signals.answers(signals.node_lost, node=node, reason=reason))
    if left:
        log.info("node %s left; %d attempt(s) requeued", node.name, released)
    transaction.on_commit(request_pass)
    return {"state": Node.State.DOWN.value, "released": released}
