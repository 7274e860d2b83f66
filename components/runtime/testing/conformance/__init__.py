"""Conformance suites shipped beside the contracts they check, for plugins to run against their own parts.

Each module holds a pytest test class to subclass with a factory (as Optuna's ``StorageTestCase``): the
subclass in a plugin's tests says how to build its object, and inherits every check of the contract::

    from components.runtime.testing.conformance.services import NodeServiceConformance

    class TestMyService(NodeServiceConformance):
        service_path = "my_plugin.node:MyService"

- :mod:`~components.runtime.testing.conformance.kinds`: job kinds (:class:`components.runtime.contract.spec.KindSpec`).
- :mod:`~components.runtime.testing.conformance.panels`: panels (:class:`components.runtime.contract.panels.Panel`), with a static
  ``PanelData`` twin for tests.
- :mod:`~components.runtime.testing.conformance.services`: node services (:mod:`components.runtime.contract.services`).
- :mod:`~components.runtime.testing.conformance.sessions`: sessions (:class:`components.runtime.contract.component.Session`).
- :mod:`~components.runtime.testing.conformance.reports`: report schemas (:class:`components.runtime.contract.plugins.ReportSchema`)
  and their node metrics.
- :mod:`~components.runtime.testing.conformance.strategies`: distributed strategies
  (:class:`components.runtime.contract.distributed.Strategy`).
- :mod:`~components.runtime.testing.conformance.collections`: collections (:class:`components.runtime.contract.collections.Collection`).
- :mod:`~components.runtime.testing.conformance.job_routes`: job routes (a manifest's ``job_routes``), with their answer schema.
"""

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, message: str = "condition",
             interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something true and return that; AssertionError after ``timeout``
    seconds. The suites (and the project's own tests) wait on states with generous deadlines, never on wall time."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(interval)

