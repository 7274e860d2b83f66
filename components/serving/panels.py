"""The serve kind's job panel (light: the control plane imports it)."""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.panels import Panel, PanelData, finite

NOTE = ("It listens on the node's loopback interface only and has no authentication (auth: none), so only "
        "processes on that node can call it.")
TOKEN_NOTE = ("Every call needs one of the job's deployment tokens (gRPC metadata 'authorization: Bearer <token>'): "
              "strata job-token create {job} prints a new one; strata infer mints a short-lived one by itself.")


class ServeEndpointPanel(Panel):
    """How to call a running serve job: its gRPC endpoint, the CLI verb, and who can reach it."""

    slug: ClassVar[str] = "serve-endpoint"
    kinds: ClassVar[tuple[str, ...]] = ("serve",)
    title: ClassVar[str] = "Serving endpoint"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        job = data.job or {}
        endpoint = job.get("endpoint")
        if not endpoint:
            return None
        note = NOTE if (job.get("spec") or {}).get("auth") == "none" else TOKEN_NOTE.format(job=job.get("id"))
        return {"text": f"gRPC Predict on {endpoint}: strata infer {job.get('id')} --input rows.json. {note}"}


def _series(data: PanelData, name: str) -> list[tuple[float, float]]:
    return [(moment, value) for _, value, moment in data.metrics([name]).get(name, [])]


def _windowed_attainment(ok: list[tuple[float, float]], missed: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """SLO attainment between consecutive reports, from the cumulative ``answered_ok`` and ``missed`` counts."""
    missed_at = dict(missed)
    points, before_ok, before_missed = [], 0.0, 0.0
    for moment, count in ok:
        lost = missed_at.get(moment, before_missed)
        answered, late = count - before_ok, lost - before_missed
        if answered + late > 0:
            points.append((moment, answered / (answered + late)))
        before_ok, before_missed = count, lost
    return points


class ServeSloPanel(Panel):
    """A serve job's service level, live: SLO attainment (per report window), p50 and p99 latency inside the
    server, throughput, queue depth and mean batch size, from the metrics its endpoint reports every 2 s."""

    slug: ClassVar[str] = "serve-slo"
    kinds: ClassVar[tuple[str, ...]] = ("serve",)
    title: ClassVar[str] = "Service level: SLO attainment, latency, throughput, queue and batches"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        ok, missed = _series(data, "answered_ok"), _series(data, "missed")
        if not ok:
            return None
        start = ok[0][0]
        rows = [("SLO attainment", "%", [(m, v * 100) for m, v in _windowed_attainment(ok, missed)], "y"),
                ("p50 latency", "ms", _series(data, "p50_ms"), "y2"),
                ("p99 latency", "ms", _series(data, "p99_ms"), "y2"),
                ("throughput", "req/s", _series(data, "throughput_rps"), "y3"),
                ("queue depth", "requests", _series(data, "queue_depth"), "y3"),
                ("mean batch", "requests", _series(data, "mean_batch"), "y3")]
        traces = [{"type": "scatter", "mode": "lines", "name": f"{label} ({unit})", "yaxis": axis,
                   "x": [moment - start for moment, _ in points], "y": [value for _, value in points]}
                  for label, unit, points, axis in rows if points]
        layout = {"margin": {"t": 10}, "height": 420,
                  "xaxis": {"title": {"text": "seconds since the first report"}, "anchor": "y3"},
                  "yaxis": {"title": {"text": "SLO %"}, "domain": [0.7, 1.0], "range": [0, 105]},
                  "yaxis2": {"title": {"text": "ms"}, "domain": [0.37, 0.63]},
                  "yaxis3": {"title": {"text": "count"}, "domain": [0.0, 0.3]}}
        latest = {name: points[-1][1] for name, points in (("requests", _series(data, "requests")),
                                                              ("slo", _series(data, "slo_attainment")),
                                                              ("batches", _series(data, "batches")),
                                                              ("dropped", _series(data, "dropped_early"))) if points}
        summary = [[label, value] for label, value in (
            ("requests answered or refused", f"{latest['requests']:,.0f}" if "requests" in latest else "—"),
            ("SLO attainment since start", f"{latest['slo'] * 100:.2f}%" if "slo" in latest else "—"),
            ("batches run", f"{latest['batches']:,.0f}" if "batches" in latest else "—"),
            ("answered early (could not make their deadline)",
             f"{latest['dropped']:,.0f}" if "dropped" in latest else "—"))]
        return {"figure": finite({"data": traces, "layout": layout}),
                "table": {"columns": ["", "value"], "rows": summary}}


class ServeExpertsPanel(Panel):
    """eMoE on a mixture-of-experts endpoint: resident expert bytes and count over time, the hit rate, and the
    perplexity of the requests under the served model."""

    slug: ClassVar[str] = "serve-emoe"
    kinds: ClassVar[tuple[str, ...]] = ("serve",)
    title: ClassVar[str] = "eMoE: experts on the device"

    def render(self, data: PanelData) -> dict[str, Any] | None:
        resident = _series(data, "emoe_resident_bytes")
        if not resident:
            return None
        start = resident[0][0]
        rows = [("resident experts", _series(data, "emoe_resident_experts"), "y"),
                ("resident MiB", [(m, v / 2**20) for m, v in resident], "y2"),
                ("hit rate %", [(m, v * 100) for m, v in _series(data, "emoe_hit_rate")], "y3"),
                ("perplexity", _series(data, "emoe_perplexity"), "y3")]
        traces = [{"type": "scatter", "mode": "lines", "name": label, "yaxis": axis,
                   "x": [moment - start for moment, _ in points], "y": [value for _, value in points]}
                  for label, points, axis in rows if points]
        layout = {"margin": {"t": 10}, "height": 360,
                  "xaxis": {"title": {"text": "seconds since the first report"}, "anchor": "y3"},
                  "yaxis": {"title": {"text": "experts"}, "domain": [0.7, 1.0]},
                  "yaxis2": {"title": {"text": "MiB"}, "domain": [0.37, 0.63]},
                  "yaxis3": {"title": {"text": "% / ppl"}, "domain": [0.0, 0.3]}}
        return {"figure": finite({"data": traces, "layout": layout})}
