"""``strata login``: a token for the command line, approved from a browser session (single sign-on or password).

The command makes a token itself and keeps it; the link it prints (and opens) carries only the token's prefix and
SHA-256 digest to ``/cli-login/`` (dashboard.views.sso). The user, logged in there (``--sso``: through the single
sign-on provider straight away), checks that the page shows the code printed here and approves; the control plane
then creates the token with that digest. Meanwhile this command polls with the token until it works, and writes it
with the URL to the config file (``STRATA_CONFIG``, else ~/.config/strata/config.yaml).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import webbrowser
from urllib.parse import urlencode

import yaml

from components.runtime.client.client import ApiError, ControlPlaneClient
from components.runtime.shared.tokens import new_api_token, token_digest
from strata.cli.config import ConfigError, config_path, write_client_config

POLL_S = 2.0


def server_url(args) -> str:
    """--url, else STRATA_URL, else the config file's url."""
    url = getattr(args, "url", None) or os.environ.get("STRATA_URL")
    if not url:
        path = config_path()
        try:
            data = yaml.safe_load(path.read_text()) if path.exists() else {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path} is not valid YAML: {error}") from None
        url = (data or {}).get("url") if isinstance(data, dict) else None
    if not url:
        raise ConfigError("no control plane to log in to: pass --url or set STRATA_URL")
    return str(url).rstrip("/")


def login_link(url: str, prefix: str, digest: str, *, team: str | None, sso: bool) -> str:
    query = {"prefix": prefix, "digest": digest, "name": f"strata login on {socket.gethostname()}"[:100]}
    if team:
        query["team"] = team
    if sso:
        query["sso"] = "1"
    return f"{url}/cli-login/?{urlencode(query)}"


def _mine(answer, prefix: str) -> dict:
    rows = answer.get("results", []) if isinstance(answer, dict) else answer or []
    return next((row for row in rows if isinstance(row, dict) and row.get("prefix") == prefix), {})


def login(args) -> int:
    url = server_url(args)
    prefix, raw = new_api_token()
    digest = token_digest(raw)
    link = login_link(url, prefix, digest, team=args.team, sso=args.sso)
    code = f"{digest[:4]}-{digest[4:8]}".upper()
    print(f"Open this link in a browser, log in, check that the page shows the code {code}, and approve:", flush=True)
    print(link, flush=True)
    if not args.no_browser:
        try:
            webbrowser.open(link)
        except Exception:  # no browser here: the printed link is enough
            pass
    client = ControlPlaneClient(url, raw, retries=2)
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            answer = client.get("tokens/")
            break
        except ApiError as error:
            if error.status != 401:
                raise
        if time.monotonic() >= deadline:
            print(f"strata: error: not approved within {args.timeout:g} s; run strata login again", file=sys.stderr)
            return 1
        time.sleep(POLL_S)
    path = config_path()
    write_client_config(path, url, raw)
    row = _mine(answer, prefix)
    who = f" as {row['user']}" if row.get("user") else ""
    print(f"logged in{who} to team {row.get('team') or '?'} (token {prefix}, expires {row.get('expires_at', '?')}); "
          f"saved to {path}", flush=True)
    return 0
