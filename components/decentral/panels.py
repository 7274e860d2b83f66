"""The swarm's panels (light: the dashboard imports them; they read only through PanelData).

They read rank 0's metrics (``peers``, ``loss``, ``test_loss``, ``epoch``), every cluster peer's tagged metrics
(``peer<r>.samples_per_s``, ``peer<r>.loss``) and rank 0's latest swarm report (the ``decentral`` plugin's attempt
report, which lists every live peer, volunteers included, the averaging rounds, dropped updates and, with layer
swapping, its timeline).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from components.runtime.contract.panels import Panel, PanelData, finite

PLUGIN = "decentral"
KIND = "decentralized-train"
PEER_METRIC = re.compile(r"^peer(\d+)\.(samples_per_s|loss|test_loss)$")


def latest_swarm(data: PanelData) -> dict[str, Any] | None:
    """Rank 0's newest swarm report for the job, or None."""
    job = data.job
    if not job:
        return None
    attempts = [entry for entry in data.reports(PLUGIN, job_id=str(job.get("id")))["attempts"]
                if isinstance(entry.get("payload"), dict)]
    if not attempts:
        return None
    return max(attempts, key=lambda entry: (entry.get("number") or 0, entry.get("time") or 0))["payload"]


def _series(points) -> tuple[list[int], list[float]]:
    kept = [(int(step), float(value)) for step, value, *_ in points if value is not None]
    return [step for step, _ in kept], [value for _, value in kept]


def _fmt(value: Any, digits: int = 3) -> Any:
    return round(value, digits) if isinstance(value, float) else value


class _SwarmPanel(Panel):
    kinds: ClassVar[tuple[str, ...]] = ("decentralized-train",)
    placement: ClassVar[str] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        return job.get("kind") == KIND


class SwarmPeersPanel(_SwarmPanel):
    """Who is in the swarm, over time and now (cluster peers and volunteers), and the updates it dropped."""

    slug: ClassVar[str] = "swarm-peers"
    title: ClassVar[str] = "Peers in the swarm"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        report = latest_swarm(data)
        points = data.metrics(["peers"]).get("peers") or []
        if not report and not points:
            return None
        steps, values = _series(points)
        rows = []
        for peer in (report or {}).get("peers") or []:
            rows.append([peer.get("name"), "volunteer" if peer.get("volunteer") else "cluster", peer.get("step"),
                         _fmt(peer.get("samples_per_s"), 1), _fmt(peer.get("loss")), _fmt(peer.get("test_loss")),
                         f"{peer.get('rounds_ok') or 0} / {peer.get('rounds_failed') or 0}"])
        for rejection in ((report or {}).get("rejections") or [])[-5:]:
            rows.append([f"dropped: {rejection.get('name') or str(rejection.get('peer'))[:12]}", rejection.get("role"),
                         "", "", "", "", str(rejection.get("problem"))[:80]])
        figure = {"data": [{"type": "scatter", "mode": "lines", "line": {"shape": "hv"}, "name": "live peers",
                            "x": steps, "y": values}],
                  "layout": {"xaxis": {"title": "rank 0's step"}, "yaxis": {"title": "peers", "rangemode": "tozero"},
                             "height": 220}}
        epoch = (report or {}).get("epoch")
        table = {"columns": ["peer", "where", "step", "samples/s", "loss", "held-out loss", "rounds ok / failed"],
                 "rows": rows + ([["global epoch (averaging rounds)", epoch, "", "", "", "", ""]]
                                 if epoch is not None else [])}
        return finite({"figure": figure, "table": table})


class PeerThroughputPanel(_SwarmPanel):
    """Samples per second of every cluster peer over time; volunteers' latest rate from the swarm report."""

    slug: ClassVar[str] = "swarm-throughput"
    title: ClassVar[str] = "Throughput per peer"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        traces = []
        for name, points in sorted(data.metrics().items()):
            match = PEER_METRIC.match(name)
            if match and match.group(2) == "samples_per_s":
                steps, values = _series(points)
                traces.append({"type": "scatter", "mode": "lines", "name": f"rank {match.group(1)}",
                               "x": steps, "y": values})
        report = latest_swarm(data) or {}
        volunteers = [peer for peer in report.get("peers") or [] if peer.get("volunteer")]
        if not traces and not volunteers:
            return None
        rows = [[peer.get("name"), _fmt(peer.get("samples_per_s"), 1)] for peer in report.get("peers") or []]
        return finite({"figure": {"data": traces, "layout": {"xaxis": {"title": "step"},
                                                             "yaxis": {"title": "samples/s"}, "height": 240}},
                       "table": {"columns": ["peer", "samples/s now"], "rows": rows}})


class SwarmLossPanel(_SwarmPanel):
    """The training loss (rank 0), the held-out loss of every cluster peer, and the global epoch."""

    slug: ClassVar[str] = "swarm-loss"
    title: ClassVar[str] = "Loss"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        metrics = data.metrics()
        traces = []
        for name, label in (("loss", "training loss (rank 0)"), ("test_loss", "held-out loss (rank 0)")):
            if metrics.get(name):
                steps, values = _series(metrics[name])
                traces.append({"type": "scatter", "mode": "lines", "name": label, "x": steps, "y": values})
        for name, points in sorted(metrics.items()):
            match = PEER_METRIC.match(name)
            if match and match.group(2) == "test_loss" and match.group(1) != "0":
                steps, values = _series(points)
                traces.append({"type": "scatter", "mode": "markers", "name": f"held-out, rank {match.group(1)}",
                               "x": steps, "y": values})
        if not traces:
            return None
        report = latest_swarm(data) or {}
        rows = [["global epoch", report.get("epoch")], ["rounds ok", report.get("rounds_ok")],
                ["rounds failed", report.get("rounds_failed")]]
        for key, value in (report.get("deadlines") or {}).items():
            rows.append([f"deadline: {key}", value])
        return finite({"figure": {"data": traces, "layout": {"xaxis": {"title": "step"},
                                                             "yaxis": {"title": "nats/char"}, "height": 260}},
                       "table": {"columns": ["", ""], "rows": rows}})


class SwapTimelinePanel(_SwarmPanel):
    """Atom's layer swapping on rank 0: when each segment loaded and computed in the last step (loads should
    overlap computes), with the plan and the bytes moved."""

    slug: ClassVar[str] = "swarm-swap"
    title: ClassVar[str] = "Layer swapping timeline"

    def applies(self, job: dict[str, Any]) -> bool:
        spec = job.get("spec") or {}
        return super().applies(job) and bool((spec.get("swap") or {}).get("budget_mb"))

    def render(self, data: PanelData) -> dict[str, Any] | None:
        swap = (latest_swarm(data) or {}).get("swap")
        if not isinstance(swap, dict):
            return None
        events = swap.get("events") or swap.get("timeline") or []
        colors = {"load": "#9ecae1", "forward": "#31a354", "backward": "#e6550d"}
        traces: dict[str, dict[str, Any]] = {}
        for event in events:
            if not isinstance(event, dict):
                continue
            kind = str(event.get("kind"))
            start, end = event.get("start"), event.get("end")
            if not isinstance(start, int | float) or not isinstance(end, int | float):
                continue
            trace = traces.setdefault(kind, {"type": "bar", "orientation": "h", "name": kind, "x": [], "y": [],
                                             "base": [], "marker": {"color": colors.get(kind, "#888")}})
            trace["x"].append(round((end - start) * 1000, 3))
            trace["base"].append(round(start * 1000, 3))
            trace["y"].append(f"{'load' if kind == 'load' else 'compute'} seg {event.get('segment')}")
        rows = [[key, value] for key, value in swap.items() if isinstance(value, int | float | str)]
        return finite({"figure": {"data": list(traces.values()),
                                  "layout": {"barmode": "overlay", "xaxis": {"title": "ms since the step began"},
                                             "height": 280}},
                       "table": {"columns": ["", ""], "rows": rows}})
