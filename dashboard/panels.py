"""Component panels on dashboard pages: the database-backed PanelData and the render loop.

Components declare panels on their ``KindSpec.panels`` (see :mod:`components.runtime.panels`); this module is the
only place the dashboard touches them, so a new component's panels appear without editing any page.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from components.runtime import registry
from components.runtime.panels import (
    PanelData,
    finite,  # noqa: F401 - the one definition, used here and by views
)
from strata.cluster.models import Device
from strata.jobs.models import Allocation, Job

log = logging.getLogger(__name__)

MAX_PANEL_POINTS = 20_000  # per metric series handed to a panel
MAX_PANEL_SLICES = 5_000  # GPU-sharing slices handed to a panel (the newest)


class DatabasePanelData(PanelData):
    """PanelData over the control-plane database, limited to the teams the viewer may see."""

    def __init__(self, team_ids: list[int], job: Job | None = None, job_data: dict | None = None):
        self.team_ids = list(team_ids)
        self._job = job
        self.job = job_data

    def metrics(self, names=None):
        if self._job is None:
            return {}
        rows = self._job.metric_points.order_by("step", "id")
        if names:
            rows = rows.filter(name__in=list(names))
        series: dict[str, list[tuple[int, float, float]]] = {}
        for name, step, value, time in rows.values_list("name", "step", "value", "time")[: MAX_PANEL_POINTS * 8]:
            points = series.setdefault(name, [])
            if len(points) < MAX_PANEL_POINTS:
                points.append((step, value, time.timestamp()))
        return series

    def events(self, kind=None):
        if self._job is None:
            return []
        rows = self._job.events.order_by("id")
        if kind:
            rows = rows.filter(kind=kind)
        return [{"time": time.timestamp(), "kind": event_kind, "message": message, "data": data}
                for time, event_kind, message, data in rows.values_list("time", "kind", "message", "data")[:5000]]

    def devices(self):
        return cluster_devices(self.team_ids)

    def sharing(self, device_ids=None, since=None, job_id=None):
        return cluster_sharing(self.team_ids, device_ids=device_ids, since=since, job_id=job_id)

    def reports(self, plugin, device_ids=None, since=None, job_id=None):
        return plugin_reports(self.team_ids, plugin, since=since, job_id=job_id)


def plugin_reports(team_ids, plugin: str, since: float | None = None, job_id: str | None = None) -> dict[str, Any]:
    """The generic report channel, read for a viewer: every node's latest report of ``plugin`` (node reports are
    about the machines, which every viewer of the cluster page sees), and the latest report of ``plugin`` about
    each attempt of job ``job_id`` when the viewer may see that job (another team's job gives nothing)."""
    from strata.cluster.models import Node
    from strata.jobs.models import Attempt

    nodes = []
    for node_id, name, stored in Node.objects.order_by("name").values_list("id", "name", "reports"):
        entry = (stored or {}).get(plugin)
        if entry and (since is None or entry.get("time", 0) >= since):
            nodes.append({"node": name, "node_id": str(node_id), "time": entry.get("time"),
                          "payload": entry.get("payload")})
    attempts = []
    if job_id is not None:
        rows = (Attempt.objects.filter(job_id=job_id, job__team_id__in=team_ids, reports__isnull=False)
                .order_by("number").values_list("id", "number", "reports"))
        for attempt_id, number, stored in rows:
            entry = (stored or {}).get(plugin)
            if entry and (since is None or entry.get("time", 0) >= since):
                attempts.append({"attempt": str(attempt_id), "number": number, "job_id": str(job_id),
                                 "time": entry.get("time"), "payload": entry.get("payload")})
    return {"nodes": nodes, "attempts": attempts}


def cluster_sharing(team_ids, device_ids=None, since=None, job_id=None) -> dict[str, Any]:
    """GPU-sharing state and slices (see ``PanelData.sharing``); other teams' jobs carry no id or name."""
    from strata.cluster.selectors import device_policy, pool_policies
    from strata.telemetry.models import ShareSlice

    visible = set(team_ids)
    slices = ShareSlice.objects.order_by("-start")
    if since is not None:
        slices = slices.filter(end__gte=datetime.fromtimestamp(float(since), tz=UTC))
    if device_ids is not None:
        slices = slices.filter(device_id__in=list(device_ids))
    devices = Device.objects.select_related("node").exclude(sharing={}).order_by("node__name", "index")
    if device_ids is not None:
        devices = devices.filter(pk__in=list(device_ids))
    if job_id is not None:
        if not Job.objects.filter(pk=job_id, team_id__in=visible).exists():
            return {"devices": [], "slices": []}
        slices = slices.filter(job_id=job_id)
        held = set(Allocation.objects.filter(attempt__job_id=job_id).values_list("device_id", flat=True))
        held |= set(slices.values_list("device_id", flat=True).distinct())
        devices = devices.filter(pk__in=held)
    rows = list(slices.values_list("device_id", "attempt_id", "job_id", "start", "end")[:MAX_PANEL_SLICES])
    rows.reverse()
    devices = list(devices)
    job_ids = {row[2] for row in rows}
    for device in devices:
        job_ids.update(job.get("job") for job in device.sharing.get("jobs", []) if job.get("job"))
    jobs = {str(pk): (team, name) for pk, team, name in
            Job.objects.filter(pk__in=list(job_ids)).values_list("id", "team_id", "name")} if job_ids else {}

    def who(job, attempt) -> dict[str, Any]:
        team, name = jobs.get(str(job), (None, None))
        if team in visible:
            return {"attempt": str(attempt), "job_id": str(job), "job_name": name, "foreign": False}
        return {"attempt": None, "job_id": None, "job_name": None, "foreign": True}

    policies = pool_policies()
    entries = []
    for device in devices:
        report = device.sharing
        shared = []
        for job in report.get("jobs", []):
            shared.append({**who(job.get("job"), job.get("attempt")), "state": job.get("state"),
                           "persistent": job.get("persistent"), "ephemeral": job.get("ephemeral"),
                           "lane": job.get("lane"), "steps": job.get("steps")})
        entries.append({
            "id": device.pk, "node": device.node.name, "index": device.index, "kind": device.kind,
            "policy": device_policy(device, policies), "switches": report.get("switches"),
            "switch_latency_ms": report.get("switch_latency_ms") or {}, "utilization": report.get("utilization"),
            "budget": report.get("budget"),
            "lanes": [{"id": lane.get("id"), "size": lane.get("size"), "jobs": len(lane.get("attempts", []))}
                      for lane in report.get("lanes", [])],
            "jobs": shared})
    return {"devices": entries, "slices": [
        {"device": device, **who(job, attempt), "start": start.timestamp(), "end": end.timestamp()}
        for device, attempt, job, start, end in rows]}


def cluster_devices(team_ids) -> list[dict[str, Any]]:
    """Every device with the jobs holding a share of it now. Jobs of teams the viewer cannot see are listed
    as ``{"foreign": True, "share": ...}`` with no name, id or team, so nothing leaks across teams."""
    visible = set(team_ids)
    devices = {}
    for device in Device.objects.select_related("node").order_by("node__name", "index"):
        devices[device.pk] = {
            "id": device.pk, "node": device.node.name, "node_state": device.node.state, "index": device.index,
            "kind": device.kind, "name": device.name, "memory_total": device.memory_total,
            "utilization": device.utilization, "memory_used": device.memory_used, "allocations": [],
        }
    allocations = (Allocation.objects.filter(active=True, attempt__ended_at__isnull=True)
                   .select_related("attempt__job__team", "attempt__job__owner").order_by("device_id", "rank"))
    for allocation in allocations:
        entry = devices.get(allocation.device_id)
        if entry is None:
            continue
        job = allocation.attempt.job
        if job.team_id in visible:
            entry["allocations"].append({
                "job_id": str(job.pk), "job_name": job.name, "team": job.team.slug, "owner": job.owner.username,
                "kind": job.kind, "state": job.state, "rank": allocation.rank, "share": allocation.share,
                "memory": allocation.memory, "foreign": False})
        else:
            entry["allocations"].append({"foreign": True, "share": allocation.share, "memory": allocation.memory})
    return list(devices.values())


def render_panels(placement: str, data: PanelData, kind: str | None = None) -> list[dict[str, Any]]:
    """Render every registered panel for ``placement``; job panels only for the job's own ``kind``.

    A panel that cannot be imported, built or rendered is shown as an error box instead of breaking the page:
    one buggy component must not take the dashboard down. Non-finite numbers in what a panel returns become
    null, so a NaN loss cannot make the page's JSON invalid.
    """
    rendered = []
    for panel_kind, path, panel_class, load_error in registry.panels(placement):
        if placement == "job" and panel_kind is not None and panel_kind != kind:
            continue
        if panel_class is None:
            rendered.append({"slug": path.rpartition(":")[2].lower(), "title": path, "kind": panel_kind,
                             "error": f"could not load the panel: {load_error}"})
            continue
        entry = {"slug": panel_class.slug, "title": panel_class.title, "kind": panel_kind}
        try:
            panel = panel_class()
            if placement == "job" and not panel.applies(data.job or {}):
                continue
            content = panel.render(data)
        except Exception as error:  # noqa: BLE001 - isolate third-party panels
            log.exception("panel %s of kind %s failed", panel_class.slug, panel_kind)
            content = {"error": f"{type(error).__name__}: {error}"}
        if content is None:
            continue
        entry.update(finite(content))
        rendered.append(entry)
    return rendered
