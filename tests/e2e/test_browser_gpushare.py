"""The GPU-sharing panels in a real browser: two ``gpus: 0.5`` jobs share one virtual GPU of ``strata up``.

The cluster page's "GPU sharing: who ran when" Gantt chart must hold bars of both jobs and its table the shared
device (policy ``fair``, switches counted); a job's page must show its share, device and a timeline. With
STRATA_SCREENSHOT_DIR set the two panels are saved as ``gpushare-cluster.png`` and ``gpushare-job.png``.
"""

from __future__ import annotations

import pytest
from browser_support import admin_session
from e2e_support import running_cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NAMES = ("share-left", "share-right")
SPEC = {"workload": "mlp-digits", "epochs": 100, "batch_size": 64, "log_every": 20}
TIMELINE = "section.panel[data-panel=gpushare-timeline]"
JOB_PANEL = "section.panel[data-panel=gpushare-job]"

# Traces of the plotly chart inside a panel section: name and how many bars (x, base) each holds.
TRACES = """(selector) => {
    const plot = document.querySelector(selector + " .chart");
    if (!plot || !plot.data) return null;
    return plot.data.map(t => ({name: t.name, x: (t.x || []).length, base: (t.base || []).length,
                                y: Array.from(new Set(t.y || []))}));
}"""


@pytest.fixture(scope="module")
def share_cluster(tmp_path_factory):
    """``strata up`` with one virtual GPU, so two half-GPU jobs must share it."""
    with running_cluster(tmp_path_factory.mktemp("strata-gpushare-ui-home"), virtual_gpus=1) as running:
        yield running


@pytest.fixture
def admin(browser, share_cluster, tmp_path):
    with admin_session(browser, share_cluster, tmp_path) as session:
        yield session


def table_rows(page, selector: str) -> list[list[str]]:
    return page.evaluate(
        """(selector) => Array.from(document.querySelectorAll(selector + " table tbody tr"))
              .map(tr => Array.from(tr.cells).map(td => td.textContent.trim()))""",
        selector,
    )


def table_columns(page, selector: str) -> list[str]:
    return page.evaluate(
        "(selector) => Array.from(document.querySelectorAll(selector + ' table thead th')).map(th => th.textContent.trim())",
        selector,
    )


def test_two_half_gpu_jobs_on_the_cluster_timeline_and_the_job_panel(admin, share_cluster):
    page = admin.page
    jobs = [share_cluster.submit({"name": name, "kind": "train", "resources": {"gpus": 0.5}, "max_attempts": 1,
                                  "spec": SPEC})["id"] for name in NAMES]
    wait_for(lambda: all(share_cluster.job(job_id)["state"] == "RUNNING" for job_id in jobs), 60,
             message="both half-GPU jobs running")

    # The cluster page draws its panels when it loads: reload until the node has reported slices of both jobs.
    def timeline_has_both() -> bool:
        admin.goto("/cluster/")
        if page.locator(TIMELINE).count() != 1:
            return False
        traces = page.evaluate(TRACES, TIMELINE) or []
        drawn = {t["name"] for t in traces if t["x"] > 0 and t["x"] == t["base"]}
        # A couple of seconds of interleaving, so the picture shows more than the first slices.
        return set(NAMES) <= drawn and sum(t["x"] for t in traces) >= 400

    wait_for(timeline_has_both, 45, interval=1.0, message="bars of both jobs on the cluster timeline")
    traces = page.evaluate(TRACES, TIMELINE)
    assert len(traces) >= 2, traces
    device = next(t["y"] for t in traces if t["name"] == NAMES[0])
    assert len(device) == 1 and device[0].endswith(":gpu0"), traces  # both ran on the one device
    assert all(t["y"] == device for t in traces if t["name"] in NAMES), traces

    columns = table_columns(page, TIMELINE)
    rows = [dict(zip(columns, row, strict=True)) for row in table_rows(page, TIMELINE)]
    assert [row["device"] for row in rows] == device, rows
    assert rows[0]["policy"] == "fair", rows
    assert int(rows[0]["switches"]) > 0, rows
    # The Gantt bars must be visible, not drawn with zero width.
    page.locator(f"{TIMELINE} .chart g.trace.bars path").first.wait_for()
    page.locator(TIMELINE).scroll_into_view_if_needed()
    admin.screenshot("gpushare-cluster")

    assert all(share_cluster.job(job_id)["state"] == "RUNNING" for job_id in jobs), "the jobs ended too soon"

    job_id = jobs[0]
    admin.goto(f"/jobs/{job_id}/")
    page.locator(JOB_PANEL).wait_for()
    wait_for(lambda: (page.evaluate(TRACES, JOB_PANEL) or [{"x": 0}])[0]["x"] > 0, 30, interval=0.5,
             message="the job's own timeline")
    facts = {row[0]: row[1] for row in table_rows(page, JOB_PANEL) if len(row) >= 2}
    assert facts["share"] == "0.5 GPU", facts
    assert facts["device"] == device[0], facts
    assert facts["policy"] == "fair", facts
    own = page.evaluate(TRACES, JOB_PANEL)
    assert [t["name"] for t in own] == [NAMES[0]], own  # only its own slices, on the shared device
    assert own[0]["x"] == own[0]["base"] > 0 and own[0]["y"] == device, own
    page.locator(f"{JOB_PANEL} .chart g.trace.bars path").first.wait_for()
    admin.screenshot("gpushare-job")

    for job_id in jobs:
        record = share_cluster.wait_state(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, 120)
        assert record["state"] == "SUCCEEDED", (record, share_cluster.output())
    # The open page turns SUCCEEDED by itself, and its last refresh redraws the timeline with every slice.
    page.wait_for_selector("#job-state[data-state=SUCCEEDED]", timeout=20_000)
    wait_for(lambda: page.evaluate(TRACES, JOB_PANEL)[0]["x"] >= min(own[0]["x"] + 1, 1000), 15, interval=0.5,
             message="the finished job's full timeline")
    assert not admin.console_errors, admin.console_errors
