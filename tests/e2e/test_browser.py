"""The web UI in a real browser: headless Debian Chromium, driven by Playwright, against ``strata up``.

Each test logs in through the login form and uses the pages as a person would. With STRATA_SCREENSHOT_DIR set
(``make screenshots``), the main pages are saved as PNG files there (docs/img in the repository).
"""

from __future__ import annotations

import pytest
from browser_support import Browser, admin_session
from e2e_support import Cluster, running_cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LONG_SPEC = {"workload": "mlp-digits", "epochs": 400, "batch_size": 16, "log_every": 100, "checkpoint_every": 500}


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
