"""The ``compress-embeddings`` job's panels, on a static PanelData (light: the dashboard imports them)."""

from __future__ import annotations

import pytest

from components.embeddings.panels import (
    CompressionSummaryPanel,
    FieldCompressionPanel,
    human_bytes,
    ratio_text,
    signed,
)
from components.embeddings.report import CompressionReport
from components.runtime.contract.panels import StaticPanelData
from components.runtime.testing.conformance.job_routes import JobRouteConformance
from components.runtime.testing.conformance.panels import PanelConformance

JOB = {"id": "j1", "kind": "compress-embeddings", "state": "RUNNING",
       "spec": {"source": {"job": "0b7a4c1e-1111-2222-3333-444455556666", "artifact": "model.pt"}, "ratio": 20.0}}
FIELD = {"name": "C1", "features": 100, "seen": 90, "distinct": 80, "clusters": 10, "head": 9,
         "bytes_before": 12800, "bytes_after": 640, "seconds": 0.5, "lossless": False, "distortion": 0.25,
         "delta_auc": -0.0012}
DONE = CompressionReport().attempt({
    "phase": "done", "source": "0b7a4c1e-1111-2222-3333-444455556666", "artifact": "model.pt",
    "workload": "dlrm-ctr", "dataset": "criteo-sample", "ratio_target": 20.0, "ratio": 19.5,
    "bytes_before": 2 * 2**20, "bytes_after": 107_546, "clustering_s": 1.25,
    "auc_before": 0.78, "auc_after": 0.775, "auc_finetuned": 0.779,
    "logloss_before": 0.45, "logloss_after": 0.46, "logloss_finetuned": None,
    "fields": [FIELD, {**FIELD, "name": "gender", "features": 3, "seen": 3, "distinct": 3, "clusters": None,
                       "bytes_before": 384, "bytes_after": 384, "lossless": True, "delta_auc": None}]})
EARLY = CompressionReport().attempt({"phase": "clustering", "ratio_target": 20.0})


def attempt(payload, number: int = 1, time: float = 3.0, job_id: str = "j1") -> dict:
    return {"attempt": f"a{number}", "number": number, "job_id": job_id, "job_name": "compress", "foreign": False,
            "device": None, "time": time, "current": True, "payload": payload}


def data(*attempts, job=JOB) -> StaticPanelData:
    return StaticPanelData(job=job, reports={"embeddings": {"nodes": [], "devices": [], "series": [],
                                                            "attempts": list(attempts)}})


class _Panel(PanelConformance):
    def data(self):
        return data(attempt(DONE))


class TestCompressionSummaryPanel(_Panel):
    panel_path = "components.embeddings.panels:CompressionSummaryPanel"


class TestFieldCompressionPanel(_Panel):
    panel_path = "components.embeddings.panels:FieldCompressionPanel"


class TestSummaryPanelWithoutAReport(PanelConformance):
    panel_path = "components.embeddings.panels:CompressionSummaryPanel"

    def data(self):
        return data()


class TestFieldPanelEarly(PanelConformance):
    panel_path = "components.embeddings.panels:FieldCompressionPanel"

    def data(self):
        return data(attempt(EARLY))


@pytest.mark.parametrize("panel", [CompressionSummaryPanel, FieldCompressionPanel])
def test_the_panels_apply_to_compression_jobs_only(panel):
    assert panel().applies(JOB)
    assert not panel().applies({**JOB, "kind": "train"})
    assert not panel().applies({})
    assert panel.placement == "job"


def test_the_field_table_has_one_row_per_field_and_a_total():
    rendered = FieldCompressionPanel().render(data(attempt(DONE)))
    table = rendered["table"]
    assert table["columns"] == ["field", "features", "seen", "clusters", "bytes before", "bytes after", "ratio",
                                "ΔAUC", "lossless"]
    c1, gender, total = table["rows"]
    assert c1 == ["C1", 100, 90, 10, "12.5 KiB", "640 B", "20.0x", "-0.0012", "no"]
    assert gender == ["gender", 3, 3, "full", "384 B", "384 B", "1.0x", "—", "yes"]
    assert total == ["all 2 fields", 103, 93, "", "12.9 KiB", "1.0 KiB", "12.9x", "-0.0050", "no"]
    bars = rendered["figure"]["data"]
    assert [bar["name"] for bar in bars] == ["bytes before", "bytes after"]
    assert bars[0]["x"] == ["C1", "gender"] and bars[0]["y"] == [12800, 384] and bars[1]["y"] == [640, 384]


def test_the_summary_shows_ratio_bytes_and_quality():
    rows = dict(CompressionSummaryPanel().render(data(attempt(DONE)))["table"]["rows"])
    assert rows["phase"] == "done"
    assert rows["ratio reached"] == "19.5x (target 20.0x)"
    assert rows["embedding bytes"] == "2.0 MiB → 105.0 KiB"
    assert rows["clustering time"] == "1.25 s"
    assert rows["AUC before / after / fine-tuned"] == "0.7800 / 0.7750 / 0.7790"
    assert rows["ΔAUC"] == "-0.0050 (after fine-tuning -0.0010)"
    assert rows["log loss before / after / fine-tuned"] == "0.4500 / 0.4600 / —"
    assert "dlrm-ctr" in rows["source"] and "criteo-sample" in rows["source"]


def test_the_latest_attempt_wins():
    rows = dict(CompressionSummaryPanel().render(data(attempt(DONE, number=1, time=9.0),
                                                      attempt(EARLY, number=2, time=5.0)))["table"]["rows"])
    assert rows["phase"] == "clustering"
    assert rows["ratio reached"] == "— (target 20.0x)" and rows["embedding bytes"] == "— → —"
    assert rows["ΔAUC"] == "—"


def test_no_report_renders_the_placeholder():
    for panel in (CompressionSummaryPanel, FieldCompressionPanel):
        assert "No compression report yet" in panel().render(data())["text"]
        assert "No compression report yet" in panel().render(data(attempt(DONE, job_id="other")))["text"]
        assert panel().render(StaticPanelData(job=None)) is None
    assert "clustering" in FieldCompressionPanel().render(data(attempt(EARLY)))["text"]


def test_the_formatting_helpers():
    assert human_bytes(0) == "0 B" and human_bytes(1023) == "1023 B" and human_bytes(1024) == "1.0 KiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB" and human_bytes(None) == "—"
    assert ratio_text(12800, 640) == "20.0x" and ratio_text(10, 0) == "—" and ratio_text(None, 5) == "—"
    assert signed(0.00123) == "+0.0012" and signed(-0.5) == "-0.5000" and signed(None) == "—"


class TestCompressionRoute(JobRouteConformance):
    """``GET /api/v1/jobs/{id}/compression/`` answers JSON matching its declared schema, early and done."""

    route_path = "components.embeddings.routes:compression"

    def examples(self):
        return [data(attempt(EARLY)), data(attempt(EARLY, 1, 1.0), attempt(DONE, 2, 2.0)), data()]
