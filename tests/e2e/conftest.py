"""Fixtures of the end-to-end tests; the helpers live in e2e_support.py (next to this file)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from browser_support import browser  # noqa: E402, F401
from e2e_support import bare_cluster, cluster  # noqa: E402, F401
