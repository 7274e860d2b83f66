"""The example outside plugin is imported from its folder (tests/e2e/test_example_plugin.py installs it for real)."""

import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "strata-primes"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))
