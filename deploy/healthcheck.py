#!/usr/bin/env python3
"""The image's HEALTHCHECK: exit 0 when STRATA_HEALTHCHECK_URL answers 2xx within the timeout, 1 otherwise.

Standard library only (the slim image has no curl). ``Host: localhost`` is sent so that Django's
ALLOWED_HOSTS check passes whatever the container's address is (the default ALLOWED_HOSTS and the shipped
configurations include localhost).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/healthz"


def check(url: str, timeout: float) -> tuple[bool, str]:
    request = urllib.request.Request(url, headers={"Host": "localhost", "User-Agent": "strata-healthcheck"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return 200 <= response.status < 300, f"{url}: HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return False, f"{url}: HTTP {error.code}"
    except (OSError, ValueError) as error:
        return False, f"{url}: {error}"


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else os.environ.get("STRATA_HEALTHCHECK_URL") or DEFAULT_URL
    timeout = float(os.environ.get("STRATA_HEALTHCHECK_TIMEOUT", "4"))
    healthy, message = check(url, timeout)
    print(message, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
