"""The web UI in a real browser: headless Debian Chromium, driven by Playwright, against ``strata up``.

Each test logs in through the login form and uses the pages as a person would. With STRATA_SCREENSHOT_DIR set
(``make screenshots``), the main pages are saved as PNG files there (docs/img in the repository).

Every test here shares one started ``strata up`` (and one Chromium): a browser test that needs no settings of its
own belongs in this file rather than in a new one, which would start (and stop) a platform of its own.
"""

from __future__ import annotations

import copy
import re

import pytest
from browser_support import Browser, admin_session
from e2e_support import Cluster, running_cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LONG_SPEC = {"workload": "mlp-digits", "epochs": 400, "batch_size": 16, "log_every": 100, "checkpoint_every": 500}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module")
def ui_cluster(tmp_path_factory):
    """``strata up`` with two virtual GPUs, shared by this module's tests."""
    with running_cluster(tmp_path_factory.mktemp("strata-ui-home"), virtual_gpus=2) as running:
        yield running


@pytest.fixture
def admin(browser, ui_cluster, tmp_path):
    with admin_session(browser, ui_cluster, tmp_path) as session:
        yield session


def cancel_all(cluster: Cluster) -> None:
    for job in cluster.get("jobs/", page_size=500)["results"]:
        if job["state"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            cluster.api("POST", f"jobs/{job['id']}/cancel/")


def test_submit_through_the_form_and_watch_the_loss_chart(admin, ui_cluster):
    page = admin.page
    admin.goto("/jobs/new/?kind=train")
    page.fill("input[name=name]", "ui-digits")
    page.select_option("select[name='spec.workload']", "mlp-digits")
    page.fill("input[name='spec.epochs']", "2")
    page.fill("input[name='resources.gpus']", "1")
    admin.screenshot("submit")
    page.click("#submit-job")
    page.wait_for_url("**/jobs/*-*/")  # the detail page of the new job (a UUID in the path)
    job_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    assert ui_cluster.job(job_id)["name"] == "ui-digits"

    page.wait_for_selector("#job-state[data-state=SUCCEEDED]", timeout=120_000)
    # The chart holds real points, drawn from the metrics the node reported, not just an empty div.
    wait_for(lambda: admin.figure_points("chart-loss") > 0, 20, message="loss points in the chart")
    reported = [point for point in ui_cluster.metrics(job_id) if point["name"] == "loss"]
    drawn = page.evaluate("() => document.getElementById('chart-loss').data.find(t => t.name === 'loss').y.length")
    assert drawn == len(reported) > 0
    ys = page.evaluate("() => document.getElementById('chart-loss').data.find(t => t.name === 'loss').y")
    assert ys[-1] < ys[0], "training loss should fall"
    assert admin.figure_points("chart-accuracy") > 0
    assert "epoch 2/2" in page.inner_text("#logs")
    assert page.locator("#attempts").inner_text().count("succeeded") == 1
    assert page.locator("#artifacts a", has_text="model.pt").count() == 1
    admin.screenshot("job-detail")

    admin.goto("/jobs/")
    row = page.locator(f"#jobs tr[data-job-id='{job_id}']")
    assert row.locator(".badge").get_attribute("data-state") == "SUCCEEDED"
    admin.screenshot("jobs")
    assert not admin.console_errors, admin.console_errors


def test_job_list_refreshes_without_reload(admin, ui_cluster):
    page = admin.page
    admin.goto("/jobs/")
    page.evaluate("() => { window.__sameDocument = true; }")
    job = ui_cluster.submit({"name": "live-row", "kind": "train", "resources": {"gpus": 1}, "max_attempts": 1,
                             "spec": {"workload": "mlp-digits", "epochs": 1}})
    page.wait_for_selector(f"#jobs tr[data-job-id='{job['id']}']", timeout=15_000)
    assert page.evaluate("() => window.__sameDocument") is True  # no full page load happened
    ui_cluster.wait_state(job["id"], {"SUCCEEDED"}, 120)
    page.wait_for_selector(f"#jobs tr[data-job-id='{job['id']}'] .badge[data-state=SUCCEEDED]", timeout=15_000)


def test_cluster_page_shows_utilization_from_the_real_node(admin, ui_cluster):
    page = admin.page
    # Keep a GPU busy so the node reports real utilization while the page is open.
    job = ui_cluster.submit({"name": "busy", "kind": "train", "resources": {"gpus": 0.5}, "max_attempts": 1,
                             "spec": LONG_SPEC})
    try:
        ui_cluster.wait_state(job["id"], {"RUNNING"}, 60)
        admin.goto("/cluster/?range=1h")
        assert page.locator("#nodes tr[data-node]").count() == 1
        assert page.locator("#devices tr[data-device]").count() == 2
        assert page.locator("#devices .badge.virtual").count() == 2
        wait_for(lambda: admin.figure_points("chart-utilization") > 0, 30, message="utilization points")
        utilization = page.evaluate(
            "() => document.getElementById('chart-utilization').data.flatMap(t => t.y).filter(v => v !== null)")
        assert utilization and max(utilization) > 0, "the busy virtual GPU must show non-zero utilization"
        assert admin.figure_points("chart-heatmap") == 2  # one heatmap row per device
        page.wait_for_selector(f"#sharing a[href*='{job['id']}']", timeout=15_000)
        admin.screenshot("cluster")
    finally:
        ui_cluster.api("POST", f"jobs/{job['id']}/cancel/")
        ui_cluster.wait_state(job["id"], {"CANCELLED"}, 60)


def test_admin_raises_a_quota_and_the_queued_job_starts(admin, ui_cluster):
    page = admin.page
    cancel_all(ui_cluster)
    ui_cluster.api("PATCH", "quotas/demo/", json={"max_gpus": 1})
    first = ui_cluster.submit({"name": "holds-the-quota", "kind": "train", "resources": {"gpus": 1},
                               "max_attempts": 1, "spec": LONG_SPEC})
    second = ui_cluster.submit({"name": "waits-for-quota", "kind": "train", "resources": {"gpus": 1},
                                "max_attempts": 1, "spec": {"workload": "mlp-digits", "epochs": 1}})
    try:
        ui_cluster.wait_state(first["id"], {"RUNNING"}, 60)
        assert ui_cluster.job(second["id"])["state"] == "PENDING"

        admin.goto("/usage/?team=demo")
        reason = page.locator(f"#queue tr[data-job-id='{second['id']}'] td.reason").inner_text()
        assert "max_gpus" in reason
        admin.screenshot("usage")

        admin.goto("/manage/quotas/")
        form = page.locator("form[data-team=demo]")
        form.locator("input[name=max_gpus]").fill("2")
        admin.screenshot("quotas")
        form.locator("button[data-save=demo]").click()
        page.wait_for_selector(".message.success")
        assert "demo" in page.inner_text(".messages")
        ui_cluster.wait_state(second["id"], {"RUNNING", "SUCCEEDED"}, 60)
        assert ui_cluster.get("quotas/demo/")["max_gpus"] == 2
    finally:
        cancel_all(ui_cluster)
        ui_cluster.api("PATCH", "quotas/demo/", json={"max_gpus": None})


def test_non_admin_cannot_reach_admin_pages(browser, ui_cluster, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("bob-password-123\n")
    created = ui_cluster.cli("user", "create", "bob", "--team", "demo", "--password-file", str(secret),
                             env={"STRATA_HOME": str(ui_cluster.home)})
    assert created.returncode == 0, created.stderr
    session = Browser(browser, ui_cluster, tmp_path)
    try:
        session.login("bob", "bob-password-123")
        assert session.goto("/manage/quotas/").status in {403, 404}
        assert session.page.locator("[data-nav=quotas]").count() == 0
        assert session.goto("/jobs/").status == 200
        # The Django admin sends a non-staff user back to its own login form rather than showing anything.
        session.goto("/admin/quotas/quota/")
        assert "/admin/login/" in session.page.url or session.page.locator("#site-name").count() == 0
    finally:
        session.close()


def test_a_bad_value_shows_the_field_error(admin, ui_cluster):
    page = admin.page
    before = ui_cluster.get("jobs/")["count"]
    admin.goto("/jobs/new/?kind=train")
    page.select_option("select[name='spec.workload']", "mlp-digits")
    page.fill("input[name='spec.epochs']", "0")
    # The browser's own min check would block the submit; the server must catch it too.
    page.evaluate("() => document.getElementById('submit-form').noValidate = true")
    page.click("#submit-job")
    error = page.wait_for_selector(".field-error[data-field='spec.epochs']")
    assert ">= 1" in error.inner_text()

    page.fill("#spec-editor", "kind: train\nspec:\n  workload: mlp-digits\n  epochs: -3\n")
    page.click("#validate-spec")
    item = page.wait_for_selector("#editor-errors li[data-field='spec.epochs']")
    assert ">= 1" in item.inner_text()
    page.fill("#spec-editor", "kind: train\nspec: [unclosed\n")
    page.click("#validate-spec")
    page.wait_for_selector("#editor-errors li[data-field=document]")
    assert ui_cluster.get("jobs/")["count"] == before


def test_upload_a_project_zip_on_the_submit_page_and_the_job_succeeds(admin, ui_cluster, tmp_path):
    """A zip of a project directory, chosen on the submit page next to the command: it becomes a code bundle of
    the team, the job runs it, and the job page shows the bundle's digest and files."""
    import zipfile

    archive = tmp_path / "my-project.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("my-project/main.py", "import pathlib, strata_report\n"
                                              "print('hello from the uploaded zip')\n"
                                              "strata_report.report(step=1, accuracy=0.75)\n")
        bundle.writestr("my-project/README.md", "A project.\n")
    page = admin.page
    admin.goto("/jobs/new/?kind=train")
    page.fill("input[name=name]", "ui-zip-project")
    page.fill("input[name='resources.gpus']", "0.5")
    page.set_input_files("input[name=code_archive]", str(archive))
    page.select_option("select[name='spec.workload']", "")  # a command instead of a built-in workload
    page.fill("[name='spec.command']", '["python", "main.py"]')
    page.click("#submit-job")
    try:
        page.wait_for_url("**/jobs/*-*/", timeout=60_000)
    except Exception:  # the form came back: say what it says
        errors = [page.inner_text(e) for e in ["#form-errors"] if page.locator(e).count()]
        fields = page.locator(".field-error").all_inner_texts()
        raise AssertionError(f"the form was not submitted: {errors} {fields} {page.url}") from None
    job_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    job = ui_cluster.job(job_id)
    assert job["code"]["file_count"] == 2, job
    page.wait_for_selector("#job-state[data-state=SUCCEEDED]", timeout=180_000)
    assert "hello from the uploaded zip" in page.inner_text("#logs") or \
        "hello from the uploaded zip" in "\n".join(ui_cluster.logs(job_id))
    assert [p["value"] for p in ui_cluster.metrics(job_id) if p["name"] == "accuracy"] == [0.75]
    code = page.inner_text("#job-code")
    assert job["code"]["digest"][:12] in code and "main.py" in page.inner_html("#job-code")
    assert not admin.console_errors, admin.console_errors


# -- a sweep's trials folded under it in the job list (a toggle opens them, and they stay open across the live row
# swap), a stopped trial says who stopped it, and the sweep's page draws no chart without a line and shows its
# numbers rounded.
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


@pytest.mark.timeout(400)
def test_a_sweeps_trials_fold_under_it_and_its_page_has_no_empty_chart(browser, ui_cluster, tmp_path):
    cluster = ui_cluster
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


# -- compare runs: two jobs that really ran are ticked in the job list, the ticks survive the list's live row swap,
# **Compare** opens the shareable address, and the page draws each job's real loss points and tables the runs and
# the spec diff.
def test_tick_two_jobs_and_compare_them(browser, ui_cluster, tmp_path):
    cluster = ui_cluster
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
    cluster.api("POST", f"jobs/{extra['id']}/cancel/")
