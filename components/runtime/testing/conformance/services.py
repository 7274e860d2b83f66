"""Conformance suite for node services (:class:`components.runtime.contract.services.NodeService`).

Subclass :class:`NodeServiceConformance` in a test module (its name must start with ``Test``) and say how to
build the service; every test of the contract runs against it::

    class TestScratchDisk(NodeServiceConformance):
        service_path = "strata_primes.service:ScratchDiskService"

Override :meth:`~NodeServiceConformance.node` to give the service devices, :meth:`~NodeServiceConformance.kill`
to make one instance die the way it would in production (the default kills a :class:`ProcessService`'s
process), and ``start_timeout`` for services that take long to become healthy. Every test stops what it
started, also when it fails.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, ClassVar

import pytest

from components.runtime.contract.registry import import_path
from components.runtime.contract.services import NodeInfo, NodeService, ProcessService, Supervisor
from components.runtime.testing.conformance import wait_for


class FakeDevice:
    """A stand-in for :class:`components.runtime.node.devices.Device` (a virtual GPU)."""

    def __init__(self, index: int, memory_total: int = 2**30):
        self.index = index
        self.kind = "virtual"
        self.name = f"virtual-{index}"
        self.memory_total = memory_total
        self.virtual = True


class NodeServiceConformance:
    """The node-service contract, as pytest tests. Set :attr:`service_path` (``"module:Class"``)."""

    service_path: ClassVar[str] = ""
    plugin: ClassVar[str] = "conformance"
    devices: ClassVar[int] = 1  # virtual devices the node has
    start_timeout: ClassVar[float] = 180.0  # a liveness bound: a loaded machine warms services up slowly
    stop_timeout: ClassVar[float] = 15.0
    settings: ClassVar[dict[str, Any]] = {}  # a heartbeat answer to configure() with

    # -- factories --------------------------------------------------------------------------------------
    def service_class(self) -> type[NodeService]:
        return import_path(self.service_path)

    def node(self, state_dir: Path) -> NodeInfo:
        return NodeInfo(name="conformance-node", devices=[FakeDevice(i) for i in range(self.devices)],
                        state_dir=state_dir)

    def kill(self, service: NodeService) -> bool:
        """Make ``service`` die as it would by accident; False when this suite cannot (the test is skipped)."""
        if isinstance(service, ProcessService) and service.pid is not None:
            os.kill(service.pid, signal.SIGKILL)
            return True
        return False

    @pytest.fixture
    def services(self, tmp_path):
        # A short directory: some services put unix sockets under it.
        instances = self.service_class().instances(self.node(tmp_path))
        for instance in instances:
            instance.plugin = self.plugin
        try:
            yield instances
        finally:
            for instance in instances:
                instance.stop(self.stop_timeout)

    def started(self, services: list[NodeService]) -> list[NodeService]:
        for service in services:
            service.start()
        for service in services:
            def healthy(service=service) -> bool:
                if service.check():
                    return True
                code = getattr(service, "returncode", None)  # a process service whose process is gone
                if code is not None:
                    raise AssertionError(f"{service.label} exited with code {code} before it was healthy")
                return False

            wait_for(healthy, self.start_timeout, f"{service.label} to be healthy")
        return services

    # -- the contract -------------------------------------------------------------------------------------
    def test_instances_are_node_services(self, services):
        assert isinstance(services, list)
        assert all(isinstance(service, NodeService) for service in services)

    def test_start_check_stop(self, services):
        for service in self.started(services):
            assert service.check() is True
        for service in services:
            service.stop(self.stop_timeout)
        for service in services:
            wait_for(lambda service=service: not service.check(), self.stop_timeout, f"{service.label} to stop")
            service.stop(self.stop_timeout)  # stopping twice is harmless

    def test_reports_and_worker_config_are_json(self, services):
        self.started(services)
        payloads = []
        for service in services:
            payload = service.report()
            json.dumps(payload)
            if payload is not None:
                payloads.append(payload)
            config = service.worker_config()
            assert config is None or isinstance(config, dict)
            json.dumps(config)
            environment = service.environment()
            assert isinstance(environment, dict), environment
            assert all(isinstance(k, str) and k and "=" not in k and isinstance(v, str)
                       for k, v in environment.items()), environment
        if payloads:
            merged = type(services[0]).merge(payloads)
            json.dumps(merged)

    def test_configure_takes_any_heartbeat_answer(self, services):
        self.started(services)
        for service in services:
            service.configure({})
            service.configure({"lease_seconds": 30.0, "stop": [], "some_future_setting": 1, **self.settings})
            assert service.check()

    def test_start_again_after_a_stop(self, services):
        self.started(services)
        for service in services:
            service.stop(self.stop_timeout)
        self.started(services)  # what the agent does after check() said the service died

    def test_the_supervisor_restarts_a_service_that_died(self, tmp_path):
        supervisor = Supervisor(self.node(tmp_path), [(self.plugin, self.service_path)])
        assert not supervisor.problems, supervisor.problems
        try:
            supervisor.start_all()
            services = [entry.service for entry in supervisor.entries]
            for service in services:
                wait_for(service.check, self.start_timeout, f"{service.label} to be healthy")
            assert set(supervisor.reports()) <= {self.plugin}
            json.dumps(supervisor.worker_config())
            if not services or not self.kill(services[0]):
                pytest.skip("this suite cannot make the service die")
            victim = services[0]
            wait_for(lambda: not victim.check(), self.stop_timeout, "the service to die")

            def restarted() -> bool:
                supervisor.check()
                return victim.check()

            wait_for(restarted, self.start_timeout + 5.0, "the supervisor to start the service again")
            assert supervisor.entries[0].failures == 1
        finally:
            supervisor.stop_all(self.stop_timeout)
