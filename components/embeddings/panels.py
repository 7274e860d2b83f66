"""The ``compress-embeddings`` job's panels (light: the dashboard imports them; they read only through PanelData).

Both read the job's latest ``embeddings`` attempt report (see ``components/embeddings/report.py``): the newest
attempt's, as ``PanelData.reports("embeddings", job_id=...)`` returns it. Until the job reports, each shows a
line of text saying so.
"""

from __future__ import annotations

from typing import Any, ClassVar

from components.embeddings.spec import KIND, PLUGIN
from components.runtime.contract.panels import Panel, PanelData, finite

DASH = "—"
NO_REPORT = "No compression report yet: the job has not started compressing."
UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def latest_report(data: PanelData) -> dict[str, Any] | None:
    """The newest ``embeddings`` report of the job's attempts (highest attempt number, then newest), or None."""
    job = data.job
    if not job or job.get("id") is None:
        return None
    attempts = [entry for entry in data.reports(PLUGIN, job_id=str(job["id"]))["attempts"]
                if isinstance(entry.get("payload"), dict)]
    if not attempts:
        return None
    return max(attempts, key=lambda entry: (entry.get("number") or 0, entry.get("time") or 0))["payload"]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def human_bytes(value: Any) -> str:
    """``12800`` -> ``"12.5 KiB"``; ``640`` -> ``"640 B"``; not a number -> a dash."""
    if not _is_number(value) or value < 0:
        return DASH
    size, unit = float(value), 0
    while size >= 1024 and unit < len(UNITS) - 1:
        size, unit = size / 1024, unit + 1
    return f"{int(value)} B" if unit == 0 else f"{size:.1f} {UNITS[unit]}"


def ratio_text(before: Any, after: Any) -> str:
    """How many times smaller: ``12800, 640`` -> ``"20.0x"``; a dash when it cannot be told."""
    if not _is_number(before) or not _is_number(after) or after <= 0:
        return DASH
    return f"{before / after:.1f}x"


def signed(value: Any, digits: int = 4) -> str:
    """``0.0012`` -> ``"+0.0012"``; None -> a dash."""
    return f"{value:+.{digits}f}" if _is_number(value) else DASH


def _plain(value: Any, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if _is_number(value) else DASH


def _difference(after: Any, before: Any) -> float | None:
    return after - before if _is_number(after) and _is_number(before) else None


class _CompressionPanel(Panel):
    kinds: ClassVar[tuple[str, ...]] = ("compress-embeddings",)
    placement: ClassVar[str] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        return job.get("kind") == KIND

    def render(self, data: PanelData) -> dict[str, Any] | None:
        if not data.job:
            return None
        report = latest_report(data)
        return {"text": NO_REPORT} if report is None else self.render_report(report)

    def render_report(self, report: dict[str, Any]) -> dict[str, Any]:
        """The panel for the job's latest report."""
        raise NotImplementedError


class CompressionSummaryPanel(_CompressionPanel):
    """Where the compression stands: phase, ratio reached against the target, embedding bytes, clustering time,
    and AUC and log loss before, after and after fine-tuning."""

    slug: ClassVar[str] = "embeddings-summary"
    title: ClassVar[str] = "Embedding compression"

    def render_report(self, report: dict[str, Any]) -> dict[str, Any]:
        target = report.get("ratio_target")
        reached = f"{report['ratio']:.1f}x" if _is_number(report.get("ratio")) else DASH
        ratio = f"{reached} (target {target:.1f}x)" if _is_number(target) else reached
        source = " · ".join(str(part) for part in (report.get("source"), report.get("artifact"),
                                                   report.get("workload"), report.get("dataset")) if part)
        seconds = report.get("clustering_s")
        auc = [report.get(f"auc_{when}") for when in ("before", "after", "finetuned")]
        loss = [report.get(f"logloss_{when}") for when in ("before", "after", "finetuned")]
        delta = signed(_difference(auc[1], auc[0]))
        if _is_number(auc[2]):
            delta += f" (after fine-tuning {signed(_difference(auc[2], auc[0]))})"
        rows = [["phase", str(report.get("phase") or DASH)],
                ["source", source or DASH],
                ["ratio reached", ratio],
                ["embedding bytes", f"{human_bytes(report.get('bytes_before'))} → "
                                    f"{human_bytes(report.get('bytes_after'))}"],
                ["clustering time", f"{seconds:.2f} s" if _is_number(seconds) else DASH],
                ["AUC before / after / fine-tuned", " / ".join(_plain(value) for value in auc)],
                ["ΔAUC", delta],
                ["log loss before / after / fine-tuned", " / ".join(_plain(value) for value in loss)]]
        return finite({"table": {"columns": ["", ""], "rows": rows}})


class FieldCompressionPanel(_CompressionPanel):
    """One row per field: its features, how many were seen, the clusters it got (``full`` when it kept its
    table), its bytes before and after, the ratio, the change in AUC it alone caused and whether it was lossless;
    and a bar chart of the bytes per field."""

    slug: ClassVar[str] = "embeddings-fields"
    title: ClassVar[str] = "Per field"
    COLUMNS: ClassVar[list[str]] = ["field", "features", "seen", "clusters", "bytes before", "bytes after",
                                    "ratio", "ΔAUC", "lossless"]

    def render_report(self, report: dict[str, Any]) -> dict[str, Any]:
        fields = [field for field in report.get("fields") or [] if isinstance(field, dict)]
        if not fields:
            return {"text": f"No field compressed yet (phase: {report.get('phase') or DASH})."}
        rows = []
        for field in fields:
            clusters = field.get("clusters")
            rows.append([str(field.get("name")), field.get("features"), field.get("seen"),
                         "full" if clusters is None else clusters,
                         human_bytes(field.get("bytes_before")), human_bytes(field.get("bytes_after")),
                         ratio_text(field.get("bytes_before"), field.get("bytes_after")),
                         signed(field.get("delta_auc")), "yes" if field.get("lossless") else "no"])
        if len(fields) > 1:
            def total(key: str) -> int | None:
                values = [field.get(key) for field in fields]
                return sum(values) if all(_is_number(value) for value in values) else None

            before, after = total("bytes_before"), total("bytes_after")
            rows.append([f"all {len(fields)} fields", total("features"), total("seen"), "",
                         human_bytes(before), human_bytes(after), ratio_text(before, after),
                         signed(_difference(report.get("auc_after"), report.get("auc_before"))),
                         "yes" if all(field.get("lossless") for field in fields) else "no"])
        names = [str(field.get("name")) for field in fields]
        figure = {"data": [{"type": "bar", "name": "bytes before", "x": names,
                            "y": [field.get("bytes_before") for field in fields]},
                           {"type": "bar", "name": "bytes after", "x": names,
                            "y": [field.get("bytes_after") for field in fields]}],
                  "layout": {"barmode": "group", "yaxis": {"title": "embedding bytes", "type": "log"},
                             "height": 260}}
        return finite({"figure": figure, "table": {"columns": list(self.COLUMNS), "rows": rows}})


__all__ = ["CompressionSummaryPanel", "FieldCompressionPanel", "human_bytes", "latest_report", "ratio_text",
           "signed"]
