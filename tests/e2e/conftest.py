"""Fixtures of the end-to-end tests; the helpers live in e2e_support.py (next to this file) and tests/support.py."""

from browser_support import browser  # noqa: F401
from e2e_support import bare_cluster, cluster  # noqa: F401
