"""Single sign-on in a real browser: headless Debian Chromium (Playwright) against ``strata up`` configured with a
real OpenID provider (node-oidc-provider, tests/oidc_provider.py), and ``strata login --sso`` getting its token
from the browser session.

The cluster has password logins turned off: the only way in is the provider.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import requests
import yaml
from browser_support import Browser
from e2e_support import Cluster, e2e_env, strata_command
from oidc_provider import running_provider
from support import kill_group

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ACCOUNTS = {"alice": {"email": "alice@example.test", "groups": ["demo", "strata-admins"]},
            "bob": {"email": "bob@example.test", "groups": ["demo:viewer", "elsewhere"]}}


@pytest.fixture(scope="module")
def sso_cluster(tmp_path_factory):
    """``strata up`` (no node) pointed at a provider that knows it; passwords off."""
    home = tmp_path_factory.mktemp("strata-sso")
    cluster = Cluster(home / "strata", virtual_gpus=0)
    with running_provider(home / "provider", [f"{cluster.url}/oidc/callback/"], ACCOUNTS) as provider:
        cluster.env.update(provider.settings())
        cluster.env.update({"STRATA_OIDC_SCOPES": "openid,email,profile,groups", "STRATA_OIDC_TEAM_CLAIM": "groups",
                            "STRATA_OIDC_ADMIN_GROUP": "strata-admins", "STRATA_PASSWORD_LOGIN": "false"})
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def visitor(browser, sso_cluster, tmp_path):
    session = Browser(browser, sso_cluster, tmp_path)
    try:
        yield session
        assert not session.external_requests, session.external_requests
    finally:
        session.close()


def provider_login(page, login: str) -> None:
    """The provider's own sign-in page (devInteractions): any password."""
    page.wait_for_selector("input[name=login]")
    assert page.url.startswith("http://127.0.0.1:") and "/interaction/" in page.url
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "anything")
    page.click("button[type=submit]")


def test_sign_in_through_the_provider_lands_logged_in_with_the_claims_team(visitor, sso_cluster):
    page = visitor.page
    visitor.goto("/login/")
    assert page.locator("input[name=password]").count() == 0  # passwords are off here
    assert "Password login is turned off" in page.inner_text("#password-login-off")
    button = page.locator("#sso-login")
    assert button.inner_text() == "Sign in with Test IdP"
    visitor.screenshot("login-sso")
    button.click()
    provider_login(page, "alice")
    page.wait_for_selector("#whoami")
    assert page.url == f"{sso_cluster.url}/jobs/"
    assert page.inner_text("#whoami") == "alice (admin)"  # strata-admins: a cluster admin
    visitor.goto("/team/secrets/")
    assert page.inner_text("#team-name") == "demo"  # the team of the claim
    assert not visitor.console_errors, visitor.console_errors
    # The API's login page refuses the right password too, saying why.
    with requests.Session() as http:
        form = http.get(f"{sso_cluster.url}/api-auth/login/", timeout=30)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        answer = http.post(f"{sso_cluster.url}/api-auth/login/", timeout=30,
                           headers={"Referer": f"{sso_cluster.url}/api-auth/login/"},
                           data={"csrfmiddlewaretoken": csrf, "username": sso_cluster.credentials["username"],
                                 "password": sso_cluster.credentials["password"]})
    assert answer.status_code == 403 and "Password login is turned off on this cluster" in answer.text


def test_strata_login_sso_gets_a_token_approved_in_the_browser(visitor, sso_cluster, tmp_path):
    config = tmp_path / "cli.yaml"
    env = e2e_env(STRATA_CONFIG=str(config))
    process = subprocess.Popen([*strata_command(), "--url", sso_cluster.url, "login", "--sso", "--no-browser",
                                "--team", "demo", "--timeout", "120"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        lines = [process.stdout.readline(), process.stdout.readline()]
        code = lines[0].split("shows the code ", 1)[1].split(",", 1)[0]
        link = lines[1].strip()
        assert link.startswith(f"{sso_cluster.url}/cli-login/?") and "sso=1" in link, lines
        page = visitor.page
        page.goto(link)  # a browser that is not logged in: straight to the provider, then back to the page
        provider_login(page, "bob")
        page.wait_for_selector("#cli-login-code")
        assert page.inner_text("#cli-login-code") == code
        assert page.inner_text("#whoami") == "bob"
        page.click("#cli-login-approve")
        page.wait_for_selector("#cli-login-approved")
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output
        assert f"saved to {config}" in output and "as bob to team demo" in output, output
    finally:
        if process.poll() is None:
            kill_group(process, grace=1.0)
    saved = yaml.safe_load(config.read_text())
    assert saved["url"] == sso_cluster.url
    tokens = requests.get(f"{sso_cluster.url}/api/v1/tokens/", timeout=30,
                          headers={"Authorization": f"Bearer {saved['token']}"}).json()["results"]
    assert [(row["user"], row["team"]) for row in tokens] == [("bob", "demo")]
    # The CLI works with it: bob is a viewer of demo, who may list its jobs.
    listed = subprocess.run([*strata_command(), "jobs"], env=env, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, listed.stdout + listed.stderr


def test_strata_login_gives_up_when_nobody_approves(sso_cluster, tmp_path):
    started = time.monotonic()
    done = subprocess.run([*strata_command(), "--url", sso_cluster.url, "login", "--no-browser", "--timeout", "3"],
                          env=e2e_env(STRATA_CONFIG=str(tmp_path / "cli.yaml")), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "not approved within 3 s" in done.stderr, done.stdout + done.stderr
    assert time.monotonic() - started >= 3
    assert not (tmp_path / "cli.yaml").exists()
