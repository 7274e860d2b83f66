"""``strata bench embeddings`` runs for real on a tiny set and writes the common JSON."""

import json

from benchmarks.benchkit import validate_document
from benchmarks.embeddings import bench


def test_a_tiny_bench_writes_every_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "QUICK_SIZES", (600, 60, 5))
    monkeypatch.setattr(bench, "QUICK_ROWS", (6000, 3000))
    monkeypatch.setattr(bench, "LADDERS", {"ctr-synthetic": (2, 8)})
    monkeypatch.setattr(bench, "EPOCHS", {"ctr-synthetic": 1})
    monkeypatch.setattr(bench, "TIMING_RUNS", 1)
    monkeypatch.setattr(bench, "FINETUNE_STEPS", 3)
    monkeypatch.setattr(bench, "QUICK_LARGE_SIZES", (900, 40))
    monkeypatch.setattr(bench, "QUICK_LARGE_ROWS", (4000, 1000))
    output = tmp_path / "embeddings.json"
    assert bench.main(quick=True, output=str(output), datasets=("ctr-synthetic", "ctr-large")) == 0
    doc = json.loads(output.read_text())
    assert validate_document(doc) == []
    assert set(doc["figures"]) == {"ctr_ratio", "ctr_auc_vs_hashing", "ctr_auc_vs_qr", "ctr_clustering_time",
                                   "clustering_time"}
    run = doc["details"]["ctr-synthetic"]["runs"][0]
    assert [row["target"] for row in run["ladder"]] == [2, 8]
    assert run["same_bytes"]["hashing"]["bytes"] <= run["same_bytes"]["saec"]["bytes"]
    # QR cannot go below about 2 sqrt(features) rows per field: on tiny fields it may hold a little more.
    assert run["same_bytes"]["qr"]["bytes"] <= run["same_bytes"]["saec"]["bytes"] * 1.25
    figure = doc["figures"]["clustering_time"]
    assert figure["mechanism"] > 0 and figure["baseline"] > 0 and figure["target"] == 10.0
    large = doc["details"]["ctr-large"]["runs"][0]
    assert [field["features"] for field in large["fields"][0]] == [900, 40]
    assert 0.5 < large["auc"]["saec"] <= 1 and doc["figures"]["ctr_clustering_time"]["target"] is None
    assert doc["figures"]["ctr_ratio"]["mechanism"] in {1.0} | {row["ratio"] for row in run["ladder"]}
    assert "CTR: AUC at the same bytes" in capsys.readouterr().out
