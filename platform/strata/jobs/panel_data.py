"""The database-backed :class:`~components.runtime.contract.panels.PanelData`: what a panel (or a plugin's job route)
reads of a job and the cluster, scoped to the teams the viewer may see. The dashboard's pages and the API's
plugin job routes both use it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import Q

from components.runtime.contract.panels import PanelData
from strata.cluster.models import Device, gpu_devices
from strata.jobs.models import Allocation, Job

MAX_PANEL_POINTS = 20_000  # per metric series handed to a panel
MAX_PANEL_SLICES = 5_000  # report series rows handed to a panel (the newest)
MAX_PANEL_ATTEMPTS = 5_000  # attempts' reports handed to a panel


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

    def reports(self, plugin, device_ids=None, since=None, job_id=None):
        return plugin_reports(self.team_ids, plugin, device_ids=device_ids, since=since, job_id=job_id)

    def children(self):
        if self._job is None or self._job.team_id not in self.team_ids:
            return []

        def stamp(value):
            return value.timestamp() if value else None

        from strata.jobs.models import Attempt

        rows = list(Job.objects.filter(parent=self._job).order_by("created_at", "id")
                    .values_list("id", "name", "kind", "state", "reason", "nested", "held", "resources", "created_at",
                                 "started_at", "finished_at")[:MAX_PANEL_ATTEMPTS])
        # Where each RUNNING child answers requests (its live attempt's endpoint; selectors.serving_endpoint).
        endpoints: dict = {}
        running = [row[0] for row in rows if row[3] == "RUNNING"]
        for job_id, endpoint in (Attempt.objects.filter(job_id__in=running, ended_at__isnull=True, endpoint__isnull=False)
                                 .exclude(endpoint="").order_by("number").values_list("job_id", "endpoint")):
            endpoints[job_id] = endpoint
        return [{"id": str(job_id), "name": name, "kind": kind, "state": state, "reason": reason, "nested": nested,
                 "held": held, "resources": resources, "created_at": stamp(created), "started_at": stamp(started),
                 "finished_at": stamp(finished), "endpoint": endpoints.get(job_id)}
                for job_id, name, kind, state, reason, nested, held, resources, created, started, finished in rows]


    def participants(self):
        if self._job is None or self._job.team_id not in self.team_ids:
            return []
        from strata.jobs.participants import job_participants

        def stamp(value):
            return value.timestamp() if value else None

        return [{**entry, "joined_at": stamp(entry["joined_at"]), "last_seen": stamp(entry["last_seen"]),
                 "ended_at": stamp(entry["ended_at"])} for entry in job_participants(self._job, MAX_PANEL_ATTEMPTS)]


def plugin_reports(team_ids, plugin: str, device_ids=None, since: float | None = None,
                   job_id: str | None = None) -> dict[str, Any]:
    """The generic report channel read for a viewer (see ``PanelData.reports``): node and device reports (about
    machines, which every viewer of the cluster page sees), attempts' reports and series rows, where another
    team's job is only ``foreign`` (no attempt, number, job id or name)."""
    from strata.cluster.models import Node
    from strata.jobs.models import Attempt
    from strata.telemetry.models import ReportSeries

    empty = {"nodes": [], "devices": [], "attempts": [], "series": []}
    visible = set(team_ids)
    if job_id is not None and not Job.objects.filter(pk=job_id, team_id__in=visible).exists():
        return empty
    wanted = None if device_ids is None else {int(device_id) for device_id in device_ids}

    def recent(entry: dict) -> bool:
        return since is None or float(entry.get("time") or 0) >= since

    nodes, node_times = [], {}
    for node_id, name, stored in Node.objects.filter(reports__has_key=plugin).order_by("name").values_list(
            "id", "name", "reports"):
        entry = (stored or {}).get(plugin)
        if isinstance(entry, dict):
            node_times[str(node_id)] = entry.get("time")
            if recent(entry):
                nodes.append({"node": name, "node_id": str(node_id), "time": entry.get("time"),
                              "payload": entry.get("payload")})
    devices, device_times, reporting = [], {}, set(node_times)
    rows = Device.objects.filter(reports__has_key=plugin).select_related("node").order_by("node__name", "index")
    for device in rows:
        entry = (device.reports or {}).get(plugin)
        if not isinstance(entry, dict):
            continue
        device_times[device.pk] = entry.get("time")
        reporting.add(str(device.node_id))
        if recent(entry) and (wanted is None or device.pk in wanted) and entry.get("payload") is not None:
            devices.append({"id": device.pk, "node": device.node.name, "index": device.index, "kind": device.kind,
                            "time": entry.get("time"), "payload": entry.get("payload")})

    def current(entry: dict) -> bool:
        # Reported with its node's (or device's) latest report of the plugin: what is there now.
        device = entry.get("device")
        latest = device_times.get(device) if device is not None else node_times.get(str(entry.get("node")))
        return latest is not None and entry.get("time") == latest

    attempts_query = Attempt.objects.filter(reports__has_key=plugin)
    if job_id is not None:
        attempts_query = attempts_query.filter(job_id=job_id)
    else:
        # The attempts of the latest node reports: those of the latest report times only.
        attempts_query = attempts_query.filter(node_id__in=list(reporting)).filter(
            Q(ended_at__isnull=True) | Q(ended_at__gte=_oldest(node_times, device_times)))
    attempts_query = attempts_query.order_by("job_id", "number").values_list(
        "id", "number", "job_id", "job__team_id", "job__name", "reports")
    attempts = []
    for attempt_id, number, owner_job, team, name, stored in attempts_query[:MAX_PANEL_ATTEMPTS]:
        entry = (stored or {}).get(plugin)
        if not isinstance(entry, dict) or not recent(entry):
            continue
        if wanted is not None and entry.get("device") not in wanted:
            continue
        now = current(entry)
        if job_id is None and not now:
            continue
        seen = team in visible
        attempts.append({
            "attempt": str(attempt_id) if seen else None, "number": number if seen else None,
            "job_id": str(owner_job) if seen else None, "job_name": name if seen else None, "foreign": not seen,
            "device": entry.get("device"), "time": entry.get("time"), "current": now,
            "payload": entry.get("payload")})

    series = ReportSeries.objects.filter(plugin=plugin).order_by("-start")
    if since is not None:
        series = series.filter(end__gte=datetime.fromtimestamp(float(since), tz=UTC))
    if wanted is not None:
        series = series.filter(device_id__in=list(wanted))
    if job_id is not None:
        series = series.filter(job_id=job_id)
    series_rows = list(series.values_list("device_id", "attempt_id", "job_id", "job__team_id", "job__name", "start",
                                          "end", "data")[:MAX_PANEL_SLICES])
    series_rows.reverse()
    return {"nodes": nodes, "devices": devices, "attempts": attempts, "series": [
        {"device": device, "start": start.timestamp(), "end": end.timestamp(), "data": data,
         **_who(attempt, owner_job, name, team is not None and team in visible or owner_job is None)}
        for device, attempt, owner_job, team, name, start, end, data in series_rows]}


def _who(attempt, job, name, seen: bool) -> dict[str, Any]:
    if seen:
        return {"attempt": str(attempt) if attempt else None, "job_id": str(job) if job else None,
                "job_name": name, "foreign": False}
    return {"attempt": None, "job_id": None, "job_name": None, "foreign": True}


def _oldest(node_times: dict, device_times: dict) -> datetime:
    times = [float(time) for time in [*node_times.values(), *device_times.values()] if time is not None]
    return datetime.fromtimestamp(min(times, default=0.0), tz=UTC)


def cluster_devices(team_ids) -> list[dict[str, Any]]:
    """Every device with the jobs holding a share of it now. Jobs of teams the viewer cannot see are listed
    as ``{"foreign": True, "share": ...}`` with no name, id or team, so nothing leaks across teams."""
    visible = set(team_ids)
    devices = {}
    for device in gpu_devices().select_related("node").order_by("node__name", "index"):  # CPUs: cluster_cpus
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
