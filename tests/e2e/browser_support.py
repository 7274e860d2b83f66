"""Headless Debian Chromium driven by Playwright for Python against a real ``strata up``.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium`` (Debian's package, which
``make test`` installs when missing). Without Chromium the browser tests skip, except in CI
(STRATA_REQUIRE_SERVICES=1), where a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-dev-shm-usage",
]
REPO = Path(__file__).resolve().parents[2]


def chromium_path() -> str | None:
    configured = os.environ.get("STRATA_CHROMIUM")
    if configured:
        return configured
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot_dir() -> Path | None:
    """Where pages are saved as PNG: STRATA_SCREENSHOT_DIR (``make screenshots`` sets docs/img)."""
    configured = os.environ.get("STRATA_SCREENSHOT_DIR")
    return Path(configured) if configured else None


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    if executable is None:
        message = "Debian's chromium is not installed (make test installs it: apt-get install chromium)"
        if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


class Browser:
    """One logged-in browser context against a cluster, with helpers the tests share."""

    def __init__(self, browser, cluster, tmp_path: Path):
        self.cluster = cluster
        self.context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=cluster.url)
        self.context.set_default_timeout(20_000)
        self.page = self.context.new_page()
        self.console_errors: list[str] = []
        self.page.on("console", lambda message: message.type == "error" and self.console_errors.append(message.text))
        self.page.on("pageerror", lambda error: self.console_errors.append(str(error)))
        # Nothing may leave 127.0.0.1: every other host is refused, and the test fails if a page asked for one.
        self.external_requests: list[str] = []

        def route(route_request):
            url = route_request.request.url
            if url.startswith(("http://127.0.0.1", "http://localhost", "data:", "blob:")):
                return route_request.continue_()
            self.external_requests.append(url)
            return route_request.abort()

        self.context.route("**/*", route)
        self.tmp_path = tmp_path

    def login(self, username: str, password: str) -> None:
        self.page.goto("/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.page.click("#login-submit")
        self.page.wait_for_selector("#whoami")

    def goto(self, path: str):
        response = self.page.goto(path)
        return response

    def figure_points(self, element_id: str) -> int:
        """Data points plotly actually holds for the chart (sum over traces of y, or z rows)."""
        return self.page.evaluate(
            """(id) => {
                const el = document.getElementById(id);
                if (!el || !el.data) return -1;
                return el.data.reduce((n, t) => n + ((t.y && t.y.length) || (t.z && t.z.length) || 0), 0);
            }""",
            element_id,
        )

    def screenshot(self, name: str) -> Path:
        target = screenshot_dir() or self.tmp_path
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@contextlib.contextmanager
def admin_session(browser, cluster, tmp_path: Path):
    """A browser logged in as the cluster's admin. On exit it checks that no page asked for a host other
    than 127.0.0.1 (the UI must work offline)."""
    session = Browser(browser, cluster, tmp_path)
    try:
        session.login(cluster.credentials["username"], cluster.credentials["password"])
        yield session
        assert not session.external_requests, f"pages asked for hosts other than 127.0.0.1: {session.external_requests}"
    finally:
        session.close()
