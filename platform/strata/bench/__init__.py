"""``strata bench``: benchmarks of Strata's parts. Each benchmark is a module with ``main(quick, output)``."""

from __future__ import annotations

import importlib

# name -> "module:function"; the function takes (quick: bool, output: str | None) and returns an exit code.
BENCHMARKS: dict[str, str] = {
    "control-plane": "strata.bench.control_plane:main",
    "dashboard": "strata.bench.dashboard:main",
    # Runs on a node's Python (torch); imported only when this benchmark is asked for.
    "gpushare": "components.gpushare.bench:main",
    "serving": "components.serving.bench:main",
}


def run_benchmark(component: str, quick: bool = False, output: str | None = None) -> int:
    """Run the benchmark named ``component``; ``quick`` picks small sizes, ``output`` also writes JSON."""
    if component not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {component!r}; known benchmarks: {', '.join(sorted(BENCHMARKS))}")
    module_name, _, function = BENCHMARKS[component].partition(":")
    return getattr(importlib.import_module(module_name), function)(quick=quick, output=output)
