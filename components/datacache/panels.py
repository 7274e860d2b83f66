"""The datacache panels. Light: the dashboard imports them; they read only through PanelData.

Job panels read the metrics the streaming workload reports at each epoch end (``data_phase``, ``data_reuse``,
``data_variant``, ``data_cache_hit``, ``data_wait_s``, ``data_samples_per_s`` and ``compute_samples_per_s``);
cluster panels read the nodes' datacache reports.
"""

from __future__ import annotations

import datetime
from typing import Any, ClassVar

from components.datacache.report import PLUGIN, hit_rate
from components.runtime.contract.panels import Panel, PanelData, finite


def _reads_dataset(job: dict[str, Any]) -> bool:
    data = (job.get("spec") or {}).get("data")
    return isinstance(data, dict) and "dataset" in data


def _series(data: PanelData, *names: str) -> dict[str, list[tuple[int, float]]]:
    found = data.metrics(list(names))
    return {name: [(step, value) for step, value, *_ in found.get(name, []) if value is not None] for name in names}


class DataStagePanel(Panel):
    """Data-stage throughput against compute throughput, per epoch: the two rates PerFect balances."""

    slug: ClassVar[str] = "datacache-throughput"
    title: ClassVar[str] = "Data stage vs compute"
    placement: ClassVar[str] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        return _reads_dataset(job)

    def render(self, data: PanelData) -> dict[str, Any] | None:
        series = _series(data, "data_samples_per_s", "compute_samples_per_s", "data_wait_s")
        if not series["compute_samples_per_s"]:
            return None
        traces = [{"type": "scatter", "mode": "lines+markers", "name": label,
                   "x": [step for step, _ in series[name]], "y": [value for _, value in series[name]]}
                  for name, label in (("data_samples_per_s", "preprocessing (samples/s)"),
                                      ("compute_samples_per_s", "training (samples/s)")) if series[name]]
        waits = series["data_wait_s"]
        rows = [["Epochs measured", len(series["compute_samples_per_s"])],
                ["Training waited on data", f"{sum(v for _, v in waits):.1f} s in all"]]
        return finite({"figure": {"data": traces, "layout": {"xaxis": {"title": "step"},
                                                             "yaxis": {"title": "samples/s"}, "height": 280}},
                       "table": {"columns": [], "rows": rows}})


class PhaseTimelinePanel(Panel):
    """PerFect's phases over the run: which epochs trained on reused cached data (phase 1) and which on fresh
    data (phase 2), with the reuse factor and the held-out accuracy."""

    slug: ClassVar[str] = "datacache-phases"
    title: ClassVar[str] = "PerFect phases"
    placement: ClassVar[str] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        data = (job.get("spec") or {}).get("data") or {}
        return _reads_dataset(job) and data.get("perfect") not in (None, False)

    def render(self, data: PanelData) -> dict[str, Any] | None:
        series = _series(data, "data_phase", "data_reuse", "data_variant", "test_accuracy", "data_cache_hit")
        phases = series["data_phase"]
        if not phases:
            return None
        traces = [{"type": "scatter", "mode": "lines", "line": {"shape": "hv"}, "name": "phase",
                   "x": [s for s, _ in phases], "y": [v for _, v in phases]}]
        if series["test_accuracy"]:
            traces.append({"type": "scatter", "mode": "lines+markers", "name": "test accuracy", "yaxis": "y2",
                           "x": [s for s, _ in series["test_accuracy"]], "y": [v for _, v in series["test_accuracy"]]})
        reuse = series["data_reuse"][-1][1] if series["data_reuse"] else 1
        first_fresh = next((step for step, value in phases if value == 2), None)
        rows = [["Reuse factor", f"{reuse:g}"],
                ["Phase 1 (reused cached data)", f"{sum(1 for _, v in phases if v == 1)} epochs"],
                ["Phase 2 (fresh data)", f"{sum(1 for _, v in phases if v == 2)} epochs"
                 + (f", from step {first_fresh:,}" if first_fresh is not None else "")],
                ["Epochs served from the node cache", f"{int(sum(v for _, v in series['data_cache_hit']))}"]]
        layout = {"xaxis": {"title": "step"}, "yaxis": {"title": "phase", "tickvals": [1, 2], "range": [0.5, 2.5]},
                  "yaxis2": {"title": "test accuracy", "overlaying": "y", "side": "right"}, "height": 260}
        return finite({"figure": {"data": traces, "layout": layout}, "table": {"columns": [], "rows": rows}})


class CacheHitRatePanel(Panel):
    """Each node's cache: hit rate, lookups, size against budget, evictions and corrupt entries dropped."""

    slug: ClassVar[str] = "datacache-hit-rate"
    title: ClassVar[str] = "Data cache hit rate"
    placement: ClassVar[str] = "cluster"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        nodes = [n for n in data.reports(PLUGIN).get("nodes", []) if n.get("payload")]
        if not nodes:
            return None
        rows = []
        for node in sorted(nodes, key=lambda n: str(n.get("node"))):
            stats = node["payload"]
            rate = hit_rate(stats)
            rows.append([node.get("node"), "—" if rate is None else f"{rate * 100:.1f}%",
                         stats.get("hits", 0) + stats.get("misses", 0), stats.get("hits", 0), stats.get("misses", 0),
                         f"{stats.get('bytes', 0) / 2**20:.1f} / {stats.get('budget', 0) / 2**20:.0f} MiB",
                         stats.get("evictions", 0), stats.get("corrupt", 0)])
        figure = {"data": [{"type": "bar", "x": [r[0] for r in rows],
                            "y": [(hit_rate(n["payload"]) or 0.0) * 100 for n in sorted(
                                nodes, key=lambda n: str(n.get("node")))], "name": "hit rate %"}],
                  "layout": {"yaxis": {"title": "hit rate (%)", "range": [0, 100]}, "height": 220}}
        return finite({"figure": figure, "table": {
            "columns": ["node", "hit rate", "lookups", "hits", "misses", "size / budget", "evictions", "corrupt"],
            "rows": rows}})


class CacheContentsPanel(Panel):
    """What each node's cache holds: dataset, pipeline, part, size, hits, last use."""

    slug: ClassVar[str] = "datacache-contents"
    title: ClassVar[str] = "Data cache contents"
    placement: ClassVar[str] = "cluster"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        rows = []
        for node in data.reports(PLUGIN).get("nodes", []):
            for entry in (node.get("payload") or {}).get("entries", []):
                used = datetime.datetime.fromtimestamp(entry.get("last_used", 0), datetime.UTC)
                rows.append([node.get("node"), entry.get("dataset"), entry.get("pipeline"), entry.get("part"),
                             f"{entry.get('bytes', 0) / 2**20:.2f} MiB", entry.get("hits", 0),
                             used.strftime("%Y-%m-%d %H:%M:%S")])
        if not rows:
            return {"text": "No node's cache holds anything yet."}
        return {"table": {"columns": ["node", "dataset", "pipeline", "part", "size", "hits", "last used (UTC)"],
                          "rows": rows}}
