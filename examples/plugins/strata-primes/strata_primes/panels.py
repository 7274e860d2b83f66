"""The plugin's panels (light: the control plane imports them to render pages)."""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.panels import Panel, PanelData


class PrimesPanel(Panel):
    """Job page of a ``primes`` job: how far the sieve got."""
    kinds: ClassVar[tuple[str, ...]] = ("primes",)

    slug: ClassVar[str] = "primes-progress"
    title: ClassVar[str] = "Sieve progress"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        series = data.metrics(["primes_found", "progress", "numbers_per_s"])
        found = series.get("primes_found") or []
        if not found:
            return {"text": "no segment sieved yet"}
        progress = (series.get("progress") or [(0, 0.0, 0.0)])[-1][1]
        speed = (series.get("numbers_per_s") or [(0, 0.0, 0.0)])[-1][1]
        limit = ((data.job or {}).get("spec") or {}).get("limit")
        rows = [["primes found", f"{int(found[-1][1]):,}"], ["progress", f"{progress:.1%}"],
                ["segments sieved", str(found[-1][0])], ["numbers per second", f"{speed:,.0f}"]]
        if limit:
            rows.insert(0, ["below", f"{int(limit):,}"])
        figure = {"data": [{"type": "scatter", "mode": "lines", "name": "primes found",
                            "x": [step for step, _, _ in found], "y": [value for _, value, _ in found]}],
                  "layout": {"xaxis": {"title": {"text": "segment"}}, "yaxis": {"title": {"text": "primes"}},
                             "height": 260, "margin": {"t": 10, "b": 40, "l": 60, "r": 10}}}
        return {"figure": figure, "table": {"columns": ["", ""], "rows": rows}}


class ScratchDiskPanel(Panel):
    """Cluster page: every node's scratch disk and load, as its ``primes`` node service reports them."""

    slug: ClassVar[str] = "primes-scratch-disk"
    title: ClassVar[str] = "Scratch disk (primes plugin)"
    placement: ClassVar[str] = "cluster"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        reports = data.reports("primes")  # the generic report channel: {"nodes": [{"node", "time", "payload"}]}
        nodes = reports.get("nodes") or []
        if not nodes:
            return None
        rows = []
        for entry in nodes:
            payload = entry.get("payload") or {}
            total = payload.get("disk_total") or 0
            free = payload.get("disk_free") or 0
            rows.append([entry.get("node"), f"{free / 2**30:,.1f} GiB", f"{total / 2**30:,.1f} GiB",
                         f"{free / total:.0%}" if total else "-", f"{payload.get('load1', 0):.2f}"])
        return {"table": {"columns": ["node", "free", "total", "free %", "load (1 min)"], "rows": rows}}
