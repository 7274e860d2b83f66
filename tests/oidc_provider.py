"""A real OpenID provider for the single sign-on tests: panva's node-oidc-provider (tests/support_oidc/provider.mjs)
under Node, on 127.0.0.1, in its own process group, stopped on exit.

``make install`` runs ``npm ci`` in tests/support_oidc (nothing is fetched at test time). Without Node or that
install the tests skip, except in CI (STRATA_REQUIRE_SERVICES=1), where they fail.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests
from support import free_port, kill_group, wait_for

SUPPORT = Path(__file__).resolve().parent / "support_oidc"
CLIENT_ID = "strata-test"
CLIENT_SECRET = "strata-test-client-secret"


def node_or_skip() -> str:
    """Node's path, once the provider is installed; else skip (fail under STRATA_REQUIRE_SERVICES=1)."""
    node = shutil.which("node")
    problem = None
    if node is None:
        problem = "Node.js is not installed (the single sign-on tests run node-oidc-provider)"
    elif not (SUPPORT / "node_modules" / "oidc-provider" / "package.json").exists():
        problem = "node-oidc-provider is not installed: run make install (npm ci in tests/support_oidc)"
    if problem:
        if os.environ.get("STRATA_REQUIRE_SERVICES") == "1":
            pytest.fail(f"STRATA_REQUIRE_SERVICES=1: {problem}", pytrace=False)
        pytest.skip(problem)
    assert node is not None
    return node


class Provider:
    """One running provider: ``issuer``, the client it knows, and its accounts (a file it reads at every
    sign-in, so :meth:`set_accounts` changes the claims of the next login)."""

    def __init__(self, home: Path, redirect_uris: list[str], accounts: dict | None = None):
        self.home = home
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.accounts_file = home / "accounts.json"
        self.redirect_uris = redirect_uris
        self.set_accounts(accounts or {})
        self.process: subprocess.Popen | None = None

    def set_accounts(self, accounts: dict) -> None:
        self.accounts_file.write_text(json.dumps(accounts))

    def start(self, timeout: float = 60.0) -> Provider:
        node = node_or_skip()
        config = self.home / "provider.json"
        config.write_text(json.dumps({"port": self.port, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                                      "redirect_uris": self.redirect_uris,
                                      "accounts_file": str(self.accounts_file)}))
        log = (self.home / "provider.log").open("ab")
        self.process = subprocess.Popen([node, str(SUPPORT / "provider.mjs"), str(config)], cwd=SUPPORT,
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)

        def ready():
            if self.process.poll() is not None:
                raise AssertionError(f"the OpenID provider exited:\n{self.output()}")
            try:
                return requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2).ok
            except requests.RequestException:
                return False

        wait_for(ready, timeout, message="the OpenID provider's discovery document")
        return self

    def output(self) -> str:
        path = self.home / "provider.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            kill_group(self.process, grace=2.0)

    def settings(self) -> dict:
        """The STRATA_OIDC_* settings that point Strata at this provider."""
        return {"STRATA_OIDC_ISSUER": self.issuer, "STRATA_OIDC_CLIENT_ID": CLIENT_ID,
                "STRATA_OIDC_CLIENT_SECRET": CLIENT_SECRET, "STRATA_OIDC_PROVIDER_NAME": "Test IdP"}


@contextlib.contextmanager
def running_provider(home: Path, redirect_uris: list[str], accounts: dict | None = None) -> Iterator[Provider]:
    home.mkdir(parents=True, exist_ok=True)
    provider = Provider(home, redirect_uris, accounts)
    try:
        yield provider.start()
    finally:
        provider.stop()


def sign_in(browser: requests.Session, authorize_url: str, login: str, redirect_prefix: str) -> str:
    """Go through the provider's own pages as a browser would, from the authorization request to the redirect
    back to Strata: returns that redirect's URL (``<redirect_prefix>?code=...&state=...``)."""
    url, submitted = authorize_url, False
    for _ in range(12):
        if url.startswith(redirect_prefix):
            return url
        answer = browser.get(url, allow_redirects=False, timeout=30)
        if answer.is_redirect:
            url = urljoin(url, answer.headers["Location"])
            continue
        assert answer.status_code == 200, (answer.status_code, answer.text[:500])
        form = re.search(r'<form[^>]*action="([^"]+)"[^>]*method="post"', answer.text)
        assert form and not submitted, answer.text[:1000]  # the login page, once (consent is granted at once)
        posted = browser.post(urljoin(url, html.unescape(form.group(1))), allow_redirects=False, timeout=30,
                              data={"prompt": "login", "login": login, "password": "any"})
        assert posted.is_redirect, (posted.status_code, posted.text[:500])
        url, submitted = urljoin(url, posted.headers["Location"]), True
    raise AssertionError(f"the provider never sent the browser back to {redirect_prefix}")


def query(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}
