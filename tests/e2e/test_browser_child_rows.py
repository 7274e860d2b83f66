"""The rough edges a new user hit, in a real browser (headless Chromium) against ``strata up``: a sweep's trials
are folded under it in the job list (a toggle opens them, and they stay open across the live row swap), a
stopped trial says who stopped it, and the sweep's page draws no chart without a line and shows its numbers
rounded."""

from __future__ import annotations

import copy
import re

import pytest
from browser_support import admin_session

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
SWEEP = {
    "name": "e2e-folded-sweep", "kind": "tune", "resources": {"gpus": 1}, "max_attempts": 2,
    "spec": {
        "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.05}},
        "metric": "test_accuracy", "mode": "max", "trials": 4, "max_iterations": 2, "packing": 4, "seed": 3,
        "searcher": {"name": "random"},
        "scheduler": {"name": "asha", "options": {"grace_period": 1, "reduction_factor": 2}},
        "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}", "batch_size": 32}},
    },
}
LONG_FRACTION = re.compile(r"\d\.\d{5,}")  # more digits than the dashboard shows of any number


def test_a_sweeps_trials_fold_under_it_and_its_page_has_no_empty_chart(browser, cluster, tmp_path):
    sweep = cluster.submit(copy.deepcopy(SWEEP))["id"]
    job = cluster.wait_state(sweep, TERMINAL, 300)
    assert job["state"] == "SUCCEEDED", job
    children = cluster.get("jobs/", parent=sweep)["results"]
    assert len(children) == 4
    with admin_session(browser, cluster, tmp_path) as admin:
        page = admin.page
        admin.goto("/jobs/")
        child_rows = f"#jobs tr[data-parent-id='{sweep}']"
        assert page.locator(child_rows).count() == 4
        assert all(not row.is_visible() for row in page.locator(child_rows).all())  # collapsed
        toggle = page.locator(f"#jobs button[data-toggle='{sweep}']")
        assert toggle.inner_text().endswith("4") and toggle.get_attribute("aria-expanded") == "false"
        toggle.click()
        assert all(row.is_visible() for row in page.locator(child_rows).all())
        assert page.locator(f"#jobs button[data-toggle='{sweep}']").get_attribute("aria-expanded") == "true"
        # A new job swaps the rows: the sweep stays open.
        page.evaluate("() => { window.__oldBody = document.getElementById('jobs-body'); }")
        extra = cluster.submit({"name": "swaps-the-rows", "kind": "train", "resources": {"gpus": 1},
                                "max_attempts": 1, "spec": {"workload": "mlp-digits", "epochs": 1}})
        page.wait_for_selector(f"#jobs tr[data-job-id='{extra['id']}']", timeout=15_000)
        assert page.evaluate("() => window.__oldBody !== document.getElementById('jobs-body')")
        assert all(row.is_visible() for row in page.locator(child_rows).all())
        for child in children:  # a stopped trial says who stopped it, and when
            if child["state"] == "CANCELLED":
                reason = page.inner_text(f"#jobs tr[data-job-id='{child['id']}'] td.reason")
                assert reason.startswith("stopped early by ASHA at iteration "), reason
        page.locator(f"#jobs button[data-toggle='{sweep}']").click()
        assert all(not row.is_visible() for row in page.locator(child_rows).all())

        admin.goto(f"/jobs/{sweep}/")
        page.wait_for_selector("[data-panel='tune-rungs'] td", timeout=15_000)
        # Every chart drawn has a line (two steps or more); a metric with one step is a value.
        lines = page.evaluate("""() => Array.from(document.querySelectorAll('#charts .chart')).map(
            (el) => (el.data || []).map((t) => new Set(t.x).size))""")
        assert all(traces and min(traces) >= 2 for traces in lines), lines
        values = page.locator("#metric-values dd").all_inner_texts()
        rungs = page.locator("[data-panel='tune-rungs'] td").all_inner_texts()
        assert rungs and not [text for text in values + rungs if LONG_FRACTION.search(text)], (values, rungs)
        assert not admin.console_errors, admin.console_errors
    cluster.api("POST", f"jobs/{extra['id']}/cancel/")
