"""gpushare's node service (one sharing-service process per device) against the node-service conformance suite,
and what it adds: per-device reports merged into ``{"devices": [...]}``, the legacy ``sharing`` heartbeat field,
the pool's policy from the heartbeat answer, and which attempts it hosts."""

from __future__ import annotations

import pytest

from components.gpushare.node import DeviceSharingService
from components.runtime.shared.protocol import HostAddress
from components.runtime.testing.conformance import wait_for
from components.runtime.testing.conformance.services import NodeServiceConformance

pytestmark = pytest.mark.timeout(180)


class TestDeviceSharingService(NodeServiceConformance):
    service_path = "components.gpushare.node:DeviceSharingService"
    plugin = "gpushare"
    devices = 2
    settings = {"sharing_policy": "pack"}


def test_reports_merge_per_device_and_the_policy_follows_the_heartbeat_answer(tmp_path):
    suite = TestDeviceSharingService()
    services = DeviceSharingService.instances(suite.node(tmp_path))
    try:
        suite.started(services)
        payloads = [wait_for(service.report, 30, "a report") for service in services]
        merged = DeviceSharingService.merge(payloads)
        assert [entry["index"] for entry in merged["devices"]] == [0, 1]
        assert {entry["policy"] for entry in merged["devices"]} == {"fair"}
        for service in services:
            service.configure({"sharing_policy": "pack", "lease_seconds": 30})
        assert all(service.call({"op": "ping"})["policy"] == "pack" for service in services)
        config = services[0].worker_config()
        assert set(config) == {"socket_dir", "authkey_file"}
    finally:
        for service in services:
            service.stop(15)


def test_hosts_one_worker_attempts_on_a_fraction_of_one_device():
    config = {"socket_dir": "/run/s", "authkey_file": "/run/key"}

    def claim(share, world_size=1, node="n1", allocations=1):
        return {"world_size": world_size, "allocations": [
            {"rank": 0, "node": node, "device": {"kind": "virtual", "index": i, "memory": 1, "share": share}}
            for i in range(allocations)]}

    address = DeviceSharingService.host_for(config, claim(0.5), "n1")
    assert address == HostAddress("/run/s/device-0.sock", "/run/key", label=address.label)
    assert "device 0" in address.label
    assert DeviceSharingService.host_for(config, claim(1.0), "n1") is None  # a whole GPU: a child process
    assert DeviceSharingService.host_for(config, claim(0.5, world_size=2), "n1") is None
    assert DeviceSharingService.host_for(config, claim(0.5, allocations=2), "n1") is None
    assert DeviceSharingService.host_for(config, claim(0.5, node="n2"), "n1") is None
    assert DeviceSharingService.host_for({}, claim(0.5), "n1") is None  # no service running
