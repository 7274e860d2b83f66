"""Smoke test of ``strata bench dashboard --quick``: the whole benchmark at a small size, through the CLI."""

from __future__ import annotations

import json

from benchmarks.benchkit import validate_document
from strata.cli.main import main


def test_bench_dashboard_quick(tmp_path, capsys):
    output = tmp_path / "dashboard.json"
    assert main(["bench", "dashboard", "--quick", "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "Results (quick" in printed and "/cluster/?range=30d render p50 / p95" in printed
    assert "naive 30d chart build" in printed and "rollups_update, 2 h backlog" in printed

    document = json.loads(output.read_text())
    assert validate_document(document) == [] and document["benchmark"] == "dashboard"
    assert {"charts_30d_sqlite", "page_30d_sqlite", "payload_30d_sqlite"} <= set(document["figures"])
    charts = document["figures"]["charts_30d_sqlite"]
    assert charts["ratio"] == charts["baseline"] / charts["mechanism"] and charts["met"] is None  # quick: no target
    results = document["details"]
    assert results["quick"] is True and results["runs"]
    run = results["runs"][0]
    assert run["database"] == "sqlite" and run["devices"] == 12
    pages = {page["range"]: page for page in run["pages"]}
    assert set(pages) == {"1h", "24h", "7d", "30d"}
    assert [pages[key]["source"] for key in ("1h", "24h", "7d", "30d")] == ["raw", "minute", "hour", "hour"]
    for page in pages.values():
        assert page["buckets"] <= 240 and page["traces"] == 12 and page["values"] > 0
        assert 0 < page["page_p50_s"] <= page["page_p95_s"] < 10
        assert 0 < page["embedded_figure_bytes"] < page["page_bytes"]
        assert 0 < page["charts_bytes"] < 1_000_000
    # The naive baseline (every minute point with a timestamp) is far bigger than the bucketed payload.
    naive = run["baselines"]["naive_30d"]
    assert naive["extrapolated_payload_bytes"] > 10 * pages["30d"]["charts_bytes"]
    # About 2 h of minutes for 12 devices (119 or 120 per device, depending on where in its minute "now" fell),
    # then one beat: the new minute or two of every device.
    assert 12 * 119 <= run["rollups"]["backlog_rows"]["minute"] <= 12 * 120
    assert 12 <= run["rollups"]["beat_rows"]["minute"] <= 12 * 3
    assert {"measurement", "backend", "measured", "target", "met"} <= set(results["table"][0])
