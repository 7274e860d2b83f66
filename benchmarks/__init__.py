"""Strata's benchmarks and their harness, outside the product (``strata bench NAME`` runs them).

- :mod:`benchmarks.benchkit`: the one harness (percentiles, repeated runs, arrival schedules, the common JSON
  document, the peers' interpreters).
- :mod:`benchmarks.stack`: the local stack they run against (``strata up`` in a process group of its own, free
  ports, scratch databases on PostgreSQL and key prefixes on Redis).
- :mod:`benchmarks.core`: the control plane's own (``control-plane``, ``dashboard``, ``storage``, the soak test) and
  what they share with the tests: network-namespace hosts, the SeaweedFS launcher, the package index, the history
  checker of the chaos suite.
- ``benchmarks.<plugin>``: each plugin's benchmark, its baselines and its peer-system runners.

The product (``strata``, ``dashboard``, ``components``) never imports this package: plugin manifests and
:mod:`strata.cli.bench` name benchmarks by ``"module:main"`` strings, resolved when ``strata bench`` runs
(``[tool.importlinter]`` in pyproject.toml checks it). Benchmarks import the product freely.
"""
