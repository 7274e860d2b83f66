"""``strata bench``: benchmarks of Strata's parts. The core's (control-plane, dashboard, storage) and every plugin's come
from the registry (:func:`components.runtime.contract.registry.benchmarks`); each is a ``main(quick, output)`` function
(``main(quick, output, peers)`` when it can also run real peer systems), imported only when asked for (a plugin's
may need a node's Python: torch). The benchmarks' code lives outside the product, in the top-level ``benchmarks``
package: the product names it by ``"module:function"`` strings only and never imports it (an import-linter
contract)."""

from __future__ import annotations

from components.runtime.contract import registry

CORE_BENCHMARKS: dict[str, str] = {
    "control-plane": "benchmarks.core.control_plane:main",
    "dashboard": "benchmarks.core.dashboard:main",
    "storage": "benchmarks.core.storage:main",
    "foresight": "benchmarks.foresight.bench:main",
}


def benchmarks() -> dict[str, str]:
    """Every benchmark ``strata bench`` can run: ``{name: "module:main"}``."""
    return {**registry.benchmarks(), **CORE_BENCHMARKS}


def run_benchmark(component: str, quick: bool = False, output: str | None = None, peers: bool = False) -> int:
    """Run the benchmark named ``component``; ``quick`` picks small sizes, ``output`` also writes JSON, ``peers``
    also runs the real peer systems a benchmark compares with (installed apart, by ``make bench-peers``); a
    benchmark whose ``main`` takes no ``peers`` has none, and asking for them is an error."""
    import inspect

    known = benchmarks()
    if component not in known:
        raise ValueError(f"unknown benchmark {component!r}; known benchmarks: {', '.join(sorted(known))}")
    try:
        function = registry.import_path(known[component])
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "benchmarks":
            raise
        raise ValueError(f"benchmark {component!r} is not installed here: the benchmarks ship with a source checkout "
                         "(make install), not with the product's image") from error
    if not peers:
        return function(quick=quick, output=output)
    if "peers" not in inspect.signature(function).parameters:
        raise ValueError(f"benchmark {component!r} runs no peer systems (no --peers)")
    return function(quick=quick, output=output, peers=True)
