"""The manifest: everything this plugin contributes, by seam, as "module:attribute" paths (read lazily)."""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="primes",
    description="Count primes with a segmented sieve: an example of every plugin seam.",
    kinds=("strata_primes.spec:PrimesSpec",),
    panels=("strata_primes.panels:PrimesPanel", "strata_primes.panels:ScratchDiskPanel"),
    reports="strata_primes.report:ScratchDiskReport",
    hooks=("strata_primes.hooks:SmallestLimitFirst",),
    subscribers=("strata_primes.events:on_event",),
    commands=("strata_primes.commands:PrimesCommand",),
    node_services=("strata_primes.service:ScratchDiskService",),
    benchmarks={"primes": "strata_primes.bench:main"},
)
