"""The cluster page: nodes, devices, who shares each device now, utilization charts and component panels.

Any logged-in user may look; jobs of teams the viewer cannot see appear only as "another team's job" with
their share (``dashboard.panels.cluster_devices`` anonymizes them). The page polls two endpoints: the charts
as JSON (redrawn in place with ``Plotly.react``) and the tables as an HTML fragment.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q, Sum
from django.http import HttpResponseBadRequest, JsonResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from dashboard.cluster_figures import GIB, cluster_figures, device_label
from dashboard.panels import DatabasePanelData, cluster_devices, render_panels
from dashboard.views.common import figure_json, json_reply, live_login_required, login_required, page_context
from strata.accounts.selectors import visible_team_ids
from strata.cluster.models import Device, Node
from strata.jobs.models import Allocation
from strata.telemetry.selectors import device_grid

RANGES = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_RANGE = "1h"
CHART_POINTS = 240  # buckets per device and chart
POLL_MS = 5000
CHARTS = ("utilization", "memory", "heatmap")


def selected_range(request, default: str = DEFAULT_RANGE) -> str | None:
    """The ``?range=`` key (1h, 24h, 7d, 30d), the default when absent, None when it is not one of those."""
    value = request.GET.get("range") or default
    return value if value in RANGES else None


def bad_range(as_json: bool = False):
    message = f"range must be one of {', '.join(RANGES)}"
    return json_reply({"detail": message}, status=400) if as_json else HttpResponseBadRequest(message)


def chart_data(devices: list[dict], range_key: str, now=None) -> tuple[dict, dict]:
    """(figures by name, facts about the grid) for ``devices`` over the range ending ``now``."""
    now = now or timezone.now()
    grid = device_grid([device["id"] for device in devices], now - RANGES[range_key], now, points=CHART_POINTS)
    facts = {"range": range_key, "source": grid.source, "step": grid.step, "buckets": grid.count,
             "start": grid.start.isoformat(), "end": grid.end.isoformat(),
             "text": f"{grid.count} buckets of {duration_text(grid.step)}, from {grid.source} data"}
    return cluster_figures(grid, devices), facts


def duration_text(seconds: int) -> str:
    """``20 s``, ``10 min``, ``4 h``, ``2 d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def _cpus_text(node: Node, held: dict) -> str:
    """A node's CPUs: "held / reported" (jobs that reserve CPUs share them), or "" when it reported none."""
    if not node.cpus:
        return ""
    text = f"{held.get(node.pk, 0.0):.4g} / {node.cpus:g}"
    return text + (f" · {_gib(node.memory)} GiB" if node.memory else "")


def table_context(team_ids, devices: list[dict] | None = None) -> dict:
    """Nodes, devices with their current sharers, and cluster totals, ready for cluster_tables.html."""
    now = timezone.now()
    cpus_held = dict(Allocation.objects.filter(active=True, attempt__ended_at__isnull=True, device__kind=Device.Kind.CPU)
                     .values("device__node_id").annotate(held=Sum("share")).values_list("device__node_id", "held"))
    devices = cluster_devices(team_ids) if devices is None else devices
    nodes = []
    gpus_only = Count("devices", filter=~Q(devices__kind=Device.Kind.CPU))  # a node's CPUs are its cpus column
    for node in Node.objects.annotate(device_count=gpus_only).order_by("name"):
        nodes.append({"name": node.name, "state": node.state.upper(), "labels": sorted(node.labels.items()),
                      "lease_age": max(0, int((now - node.last_heartbeat).total_seconds())),
                      "lease_valid": node.lease_valid, "devices": node.device_count, "hostname": node.hostname,
                      "cpus": _cpus_text(node, cpus_held)})
    rows, sharing = [], []
    allocated = total_memory = used_memory = utilization = 0.0
    for device in devices:
        held = sum(allocation["share"] for allocation in device["allocations"])
        for allocation in device["allocations"]:
            allocation["memory_gib"] = f"{allocation['memory'] / GIB:.3g}"
            allocation["share_text"] = f"{allocation['share']:.4g}"
        row = {**device, "label": device_label(device), "held": held, "held_text": f"{held:.4g}",
               "memory_used_gib": _gib(device["memory_used"]), "memory_total_gib": _gib(device["memory_total"]),
               "memory_percent": min(100.0, 100.0 * device["memory_used"] / device["memory_total"])
               if device["memory_total"] else 0.0,
               "utilization_percent": min(100.0, max(0.0, device["utilization"]))}
        rows.append(row)
        if device["allocations"]:
            sharing.append(row)
        allocated += held
        total_memory += device["memory_total"]
        used_memory += device["memory_used"]
        utilization += row["utilization_percent"]
    summary = {
        "nodes_up": sum(1 for node in nodes if node["lease_valid"]), "nodes": len(nodes),
        "devices": len(rows), "virtual": sum(1 for row in rows if row["kind"] == "virtual"),
        "allocated": f"{allocated:.4g}", "shared": sum(1 for row in sharing if len(row["allocations"]) > 1),
        "utilization": utilization / len(rows) if rows else 0.0,
        "memory_used_gib": _gib(used_memory), "memory_total_gib": _gib(total_memory),
    }
    return {"nodes": nodes, "devices": rows, "sharing": sharing, "summary": summary}


def _panel_entries(team_ids) -> list[dict]:
    panels = render_panels("cluster", DatabasePanelData(team_ids))
    for panel in panels:
        if panel.get("figure") is not None:
            panel["figure_json"] = figure_json(panel["figure"])
    return panels


@login_required
@require_GET
def cluster_page(request):
    range_key = selected_range(request)
    if range_key is None:
        return bad_range()
    team_ids = visible_team_ids(request)
    devices = cluster_devices(team_ids)
    figures, facts = chart_data(devices, range_key)
    context = page_context(
        request, "cluster", **table_context(team_ids, devices), range=range_key, ranges=list(RANGES),
        grid=facts, poll_seconds=POLL_MS // 1000, panels=_panel_entries(team_ids),
        live={"charts": f"{reverse('dashboard:cluster-charts')}?range={range_key}",
              "tables": reverse("dashboard:cluster-tables"), "panels": reverse("dashboard:cluster-panels"),
              "poll_ms": POLL_MS},
        figures=[{"name": name, "json": figure_json(figures[name])} for name in CHARTS])
    return render(request, "dashboard/cluster.html", context)


@live_login_required
@require_GET
def cluster_charts(request):
    """The page's three figures as JSON, for live redraws: ``{"grid": {...}, "figures": {name: figure}}``."""
    range_key = selected_range(request)
    if range_key is None:
        return bad_range(as_json=True)
    figures, facts = chart_data(cluster_devices(visible_team_ids(request)), range_key)
    # Compact separators: a 100-device payload is mostly numbers, and ", " per value adds ~15 %.
    return JsonResponse({"grid": facts, "figures": figures, "generated_at": timezone.now().isoformat()},
                        json_dumps_params={"separators": (",", ":"), "allow_nan": False})


@live_login_required
@require_GET
def cluster_tables(request):
    """The nodes, devices and sharing tables as an HTML fragment, for live refreshes."""
    return render(request, "dashboard/cluster_live.html", table_context(visible_team_ids(request)))


@live_login_required
@require_GET
def cluster_panels(request):
    """The component panels as an HTML fragment, for live refreshes."""
    return render(request, "dashboard/cluster_panels.html", {"panels": _panel_entries(visible_team_ids(request))})


urlpatterns = [
    path("cluster/", cluster_page, name="cluster"),
    path("cluster/charts/", cluster_charts, name="cluster-charts"),
    path("cluster/tables/", cluster_tables, name="cluster-tables"),
    path("cluster/panels/", cluster_panels, name="cluster-panels"),
]
