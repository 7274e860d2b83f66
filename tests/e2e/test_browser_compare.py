"""Compare runs in a real browser (headless Chromium, Playwright) against ``strata up``: two jobs that really ran
are ticked in the job list, the ticks survive the list's live row swap, **Compare** opens the shareable address,
and the page draws each job's real loss points and tables the runs and the spec diff."""

from __future__ import annotations

import pytest
from browser_support import admin_session
from e2e_support import running_cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def compare_cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("strata-compare-home"), virtual_gpus=2) as running:
        yield running


def test_tick_two_jobs_and_compare_them(browser, compare_cluster, tmp_path):
    cluster = compare_cluster
    jobs = [cluster.submit({"name": f"bs-{size}", "kind": "train", "resources": {"gpus": 1}, "max_attempts": 1,
                            "spec": {"workload": "mlp-digits", "epochs": 1, "batch_size": size}})
            for size in (16, 64)]
    for job in jobs:
        cluster.wait_state(job["id"], {"SUCCEEDED"}, 180)
    first, second = (job["id"] for job in jobs)
    with admin_session(browser, cluster, tmp_path) as admin:
        page = admin.page
        admin.goto("/jobs/")
        assert page.locator("#compare-jobs").is_disabled()  # nothing ticked yet
        page.check(f"#jobs tr[data-job-id='{second}'] input.pick-job")
        page.check(f"#jobs tr[data-job-id='{first}'] input.pick-job")
        assert page.inner_text("#compare-count") == "2 ticked"
        # A new job changes the rows: the list swaps its <tbody>, and the ticks come back on the fresh rows.
        page.evaluate("() => { window.__oldBody = document.getElementById('jobs-body'); }")
        extra = cluster.submit({"name": "swaps-the-rows", "kind": "train", "resources": {"gpus": 1},
                                "max_attempts": 1, "spec": {"workload": "mlp-digits", "epochs": 1}})
        page.wait_for_selector(f"#jobs tr[data-job-id='{extra['id']}']", timeout=15_000)
        assert page.evaluate("() => window.__oldBody !== document.getElementById('jobs-body')")
        assert page.is_checked(f"#jobs tr[data-job-id='{first}'] input.pick-job")
        assert page.is_checked(f"#jobs tr[data-job-id='{second}'] input.pick-job")
        assert not page.is_checked(f"#jobs tr[data-job-id='{extra['id']}'] input.pick-job")

        page.click("#compare-jobs")
        page.wait_for_url(lambda url: url.endswith(f"/compare/?jobs={second},{first}"))
        assert page.locator("#compare-runs tbody tr").count() == 2
        wait_for(lambda: admin.figure_points("chart-compare-0") > 0, 20, message="loss points on the compare chart")
        names = page.evaluate("() => document.getElementById('chart-compare-0').data.map(t => t.name)")
        assert names == [f"bs-64 ({second[:8]})", f"bs-16 ({first[:8]})"]
        drawn = page.evaluate("() => document.getElementById('chart-compare-0').data.map(t => t.y.length)")
        reported = [len([p for p in cluster.metrics(job_id) if p["name"] == "loss"]) for job_id in (second, first)]
        assert drawn == reported and min(drawn) > 0
        assert page.locator("#compare-diff tr[data-path='spec.batch_size'] td").all_inner_texts() == [
            "spec.batch_size", "64", "16"]
        admin.screenshot("compare")
        assert not admin.console_errors, admin.console_errors
    # The same comparison on the command line: the table, then one line per differing path.
    result = cluster.cli("compare", first, second)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:3] for line in lines[1:3]] == [[first[:8], "bs-16", "SUCCEEDED"],
                                                        [second[:8], "bs-64", "SUCCEEDED"]]
    assert "spec.batch_size: 16 | 64" in lines
