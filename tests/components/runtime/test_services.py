"""Node services as the agent supervises them (components.runtime.contract.services), the agent's heartbeat body,
the worker's choice of a host, and outcomes as data (components.runtime.shared.protocol)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest

from components.runtime.client.client import ApiError
from components.runtime.contract.services import (
    DISABLE_ENV,
    NodeInfo,
    NodeService,
    Supervisor,
    disabled_plugins,
    find_host,
)
from components.runtime.shared import protocol
from components.runtime.shared.protocol import End, HostAddress, finish_for
from components.runtime.testing.conformance.services import NodeServiceConformance


class Memory(NodeService):
    """A service living in the agent: reports a counter, remembers its settings."""

    def __init__(self, index: int = 0):
        self.index = index
        self.alive = False
        self.settings: dict = {}
        self.beats = 0

    @classmethod
    def instances(cls, node: NodeInfo) -> list[Memory]:
        return [cls(device.index) for device in node.devices] or [cls()]

    def start(self) -> None:
        self.alive = True

    def check(self) -> bool:
        return self.alive

    def stop(self, timeout: float = 15.0) -> None:
        self.alive = False

    def report(self):
        self.beats += 1
        return {"items": [{"index": self.index, "beats": self.beats}], "node": "n"}

    def configure(self, settings: dict) -> None:
        self.settings = dict(settings)

    def worker_config(self):
        return {"where": f"/tmp/memory-{self.index}"}


class Flaky(Memory):
    """Fails its first start; dies when told to."""

    starts: ClassVar[int] = 0

    def start(self) -> None:
        type(self).starts += 1
        if type(self).starts == 1:
            raise OSError("the port is taken")
        self.alive = True


class NotAService:
    pass


class BrokenInstances(NodeService):
    @classmethod
    def instances(cls, node):
        raise RuntimeError("cannot read the node")

    def start(self):
        pass

    def check(self):
        return True

    def stop(self, timeout=15.0):
        pass


class Device:
    def __init__(self, index: int):
        self.index, self.kind, self.memory_total = index, "virtual", 2**30


def node(tmp_path: Path, devices: int = 2) -> NodeInfo:
    return NodeInfo(name="n", devices=[Device(i) for i in range(devices)], state_dir=tmp_path)


class TestMemoryService(NodeServiceConformance):
    service_path = f"{__name__}:Memory"

    def kill(self, service):
        service.alive = False
        return True


def test_a_broken_service_costs_only_itself(tmp_path):
    supervisor = Supervisor(node(tmp_path), [("gone", "no.such.module:Service"), ("odd", f"{__name__}:NotAService"),
                                             ("broken", f"{__name__}:BrokenInstances"),
                                             ("memory", f"{__name__}:Memory")])
    assert sorted(problem.split()[0] for problem in supervisor.problems) == ["broken", "gone", "odd"]
    assert "cannot read the node" in next(v for k, v in supervisor.problems.items() if k.startswith("broken"))
    assert [entry.service.plugin for entry in supervisor.entries] == ["memory", "memory"]
    supervisor.start_all()
    reports = supervisor.reports()
    # Two instances of one plugin: one payload, lists concatenated.
    assert reports == {"memory": {"items": [{"index": 0, "beats": 1}, {"index": 1, "beats": 1}], "node": "n"}}
    supervisor.configure({"sharing_policy": "pack"})
    assert all(entry.service.settings == {"sharing_policy": "pack"} for entry in supervisor.entries)
    config = supervisor.worker_config()
    assert config == {"memory": {"classes": [f"{__name__}:Memory"], "config": {"where": "/tmp/memory-1"}}}
    json.dumps(config)
    supervisor.stop_all()
    assert not any(entry.service.alive for entry in supervisor.entries)


def test_a_failed_start_and_a_death_are_retried_with_exponential_backoff(tmp_path):
    now = [100.0]
    Flaky.starts = 0
    supervisor = Supervisor(node(tmp_path, devices=0), [("flaky", f"{__name__}:Flaky")], clock=lambda: now[0])
    [entry] = supervisor.entries
    supervisor.start_all()  # raises inside: logged, retried later
    assert not entry.running and entry.failures == 1 and entry.next_start == pytest.approx(100.5)
    assert supervisor.reports() == {}  # a service that is down is not asked
    supervisor.check()
    assert not entry.service.alive
    now[0] = 100.6
    supervisor.check()
    assert entry.service.alive and entry.running and entry.next_start is None
    entry.service.alive = False  # it died
    now[0] = 200.0
    supervisor.check()
    assert entry.failures == 2 and entry.next_start == pytest.approx(201.0)
    now[0] = 201.0
    supervisor.check()
    assert entry.service.alive and Flaky.starts == 3
    for _ in range(20):  # the delay doubles up to a ceiling
        entry.service.alive = False
        supervisor.check()
        now[0] = entry.next_start
        supervisor.check()
    assert entry.failures == 22 and entry.service.alive


def test_services_of_disabled_plugins_stay_off(tmp_path, monkeypatch):
    assert disabled_plugins({DISABLE_ENV: " gpushare, other ,,"}) == {"gpushare", "other"}
    assert disabled_plugins({}) == frozenset()
    monkeypatch.setenv(DISABLE_ENV, "memory")
    supervisor = Supervisor(node(tmp_path), [("memory", f"{__name__}:Memory")], disabled_plugins())
    assert supervisor.entries == [] and supervisor.problems == {}


def test_the_default_merge():
    assert NodeService.merge([{"a": 1}]) == {"a": 1}
    assert NodeService.merge([{"a": [1], "b": 1}, {"a": [2], "b": 2}]) == {"a": [1, 2], "b": 2}
    assert NodeService.merge([1, 2]) == [1, 2]


class FakeClient:
    def __init__(self, refuse: bool):
        self.refuse = refuse
        self.bodies: list[dict] = []

    def post(self, path: str, body: dict):
        self.bodies.append(json.loads(json.dumps(body)))
        if self.refuse and "reports" in body:
            raise ApiError(400, "reports.memory: bad")
        return {"lease_seconds": 30.0, "stop": [], "sharing_policy": "srtf"}


@pytest.mark.parametrize("refuse", [False, True])
def test_the_heartbeat_carries_only_core_fields_and_reports_and_a_refusal_costs_only_them(tmp_path, refuse):
    from components.runtime.node.agent import NodeAgent

    agent = object.__new__(NodeAgent)
    agent.state_dir = tmp_path
    (tmp_path / "running").mkdir()
    agent.devices = []
    agent.registration = {"node": "n1", "session": "s1"}
    agent.client = FakeClient(refuse)
    agent.services = Supervisor(node(tmp_path, devices=1), [("memory", f"{__name__}:Memory")])
    agent.services.start_all()
    answer = agent.heartbeat()
    assert answer["sharing_policy"] == "srtf"
    first = agent.client.bodies[0]
    assert first["reports"] == {"memory": {"items": [{"index": 0, "beats": 1}], "node": "n"}}
    assert set(first) == {"node", "session", "samples", "attempts", "reports"}  # no plugin's own field
    if refuse:  # sent again without what the control plane refused, so the lease is kept
        assert len(agent.client.bodies) == 2
        assert set(agent.client.bodies[1]) == {"node", "session", "samples", "attempts"}
    else:
        assert len(agent.client.bodies) == 1
    assert agent.services.entries[0].service.settings["sharing_policy"] == "srtf"


# -- the worker's choice of a host ------------------------------------------------------------------------------

class Hosting(Memory):
    @classmethod
    def host_for(cls, config, claim, node):
        if claim["allocations"][0]["device"]["share"] < 1:
            return HostAddress(config["where"], "/key", label="the memory host")
        return None


class Crashing(Memory):
    @classmethod
    def host_for(cls, config, claim, node):
        raise RuntimeError("broken host")


def test_find_host_asks_each_plugin_and_a_broken_one_loses_only_its_attempts():
    claim = {"kind": "any", "world_size": 1, "allocations": [{"node": "n1", "device": {"share": 0.5}}]}
    services = {"crash": {"classes": [f"{__name__}:Crashing"], "config": {}},
                "memory": {"classes": [f"{__name__}:Hosting"], "config": {"where": "/sock"}}}
    assert find_host(services, claim, "n1") == ("memory", HostAddress("/sock", "/key", "the memory host"))
    whole = {**claim, "allocations": [{"node": "n1", "device": {"share": 1.0}}]}
    assert find_host(services, whole, "n1") is None
    assert find_host({}, claim, "n1") is None


def test_the_worker_hosts_only_hostable_components(tmp_path):
    from components.runtime.contract import registry
    from components.runtime.node import worker

    hostable = [kind for kind in registry.kinds() if worker.hostable(kind)]
    assert hostable, "no built-in kind is hostable"
    assert not worker.hostable("no-such-kind")
    config = {"server": "http://127.0.0.1:9", "node_token": "t", "node": "n1", "state_dir": str(tmp_path),
              "services": {"memory": {"classes": [f"{__name__}:Hosting"], "config": {"where": "/sock"}}}}
    runner = worker.AttemptRunner(config, "0" * 32, "token")
    claim = {"kind": hostable[0], "world_size": 1, "allocations": [{"node": "n1", "device": {"share": 0.5}}]}
    assert runner.find_host(claim) == HostAddress("/sock", "/key", "the memory host")
    assert runner.find_host({**claim, "kind": "no-such-kind"}) is None
    assert worker.AttemptRunner({**config, "services": {}}, "0" * 32, "t").find_host(claim) is None


# -- outcomes as data ------------------------------------------------------------------------------------------

def test_outcomes_are_data():
    assert protocol.FINISH_OUTCOMES == ("succeeded", "failed", "time_limit", "service_lost", "user_error")
    assert protocol.outcome("service_lost") is protocol.SERVICE_LOST
    assert protocol.USER_ERROR.counts_as_failure and protocol.USER_ERROR.final  # failed at once, not retried
    assert protocol.end_of_exit_code(protocol.EXIT_USER_ERROR) is End.USER_ERROR
    assert protocol.finish_for(End.USER_ERROR, detail="no module") == (protocol.USER_ERROR, "no module")
    assert not protocol.SERVICE_LOST.counts_as_failure and protocol.SERVICE_LOST.requeue
    assert protocol.FAILED.counts_as_failure and protocol.TIME_LIMIT.final
    assert str(protocol.SUCCEEDED) == "succeeded"


@pytest.mark.parametrize(("end", "stop", "expected"), [
    (End.SUCCEEDED, "", ("succeeded", "")),
    (End.SUCCEEDED, "time_limit", ("time_limit", "time limit of 5 s exceeded")),
    (End.STOPPED, "stopped", ("failed", "stopped at the control plane's request")),
    (End.STOPPED, "", ("failed", "stopped at the control plane's request")),
    (End.CANCELLED, "", ("failed", "dropped by the host")),
    (End.USER_ERROR, "", ("user_error", "boom")),
    (End.FAILED, "", ("failed", "failed in the host: boom")),
    (End.LOST, "", ("service_lost", "the host died under the attempt: boom")),
    (End.LOST, "stopped", ("failed", "stopped at the control plane's request")),
])
def test_finish_for(end, stop, expected):
    outcome, reason = finish_for(end, stop_reason=stop, time_limit=5, detail="boom", where="the host")
    assert (outcome.name, reason) == expected


def test_done_events_and_exit_codes():
    event = protocol.done_event("a1", End.LOST, error="segfault")
    assert event["lost"] and protocol.end_of_event(event) is End.LOST
    assert protocol.end_of_event({"state": "stopped", "lost": False}) is End.STOPPED
    assert protocol.end_of_event({"state": "weird"}) is End.FAILED
    assert protocol.end_of_exit_code(protocol.EXIT_OK) is End.SUCCEEDED
    assert protocol.end_of_exit_code(protocol.EXIT_STOPPED) is End.STOPPED
    assert protocol.end_of_exit_code(-9) is End.FAILED


@pytest.mark.parametrize(("event", "expected"), [
    ({"state": "succeeded"}, ("succeeded", "")),
    ({"state": "stopped"}, ("failed", "stopped at the control plane's request")),
    ({"state": "cancelled"}, ("failed", "dropped by the memory host")),
    ({"state": "failed", "error": "Traceback\nValueError: bad batch\n"}, ("failed",
                                                                         "failed in the memory host: ValueError: bad batch")),
    ({"state": "lost", "lost": True, "error": "executor crashed"}, ("service_lost",
                                                                    "the memory host died under the attempt: executor crashed")),
    (None, ("service_lost", "the memory host died under the attempt: the connection broke (EOFError)")),
])
def test_a_hosted_attempt_ends_as_its_host_says(tmp_path, monkeypatch, event, expected):
    from multiprocessing import Pipe

    from components.runtime.node import worker

    config = {"server": "http://127.0.0.1:9", "node_token": "t", "node": "n1", "state_dir": str(tmp_path)}
    runner = worker.AttemptRunner(config, "a" * 32, "token")
    monkeypatch.setattr(runner, "_poll", lambda: False)
    mine, theirs = Pipe()
    runner.service, runner.host = mine, HostAddress("/sock", "/key", "the memory host")
    if event is None:
        theirs.close()  # the host died
    else:
        theirs.send(protocol.done_event("b" * 32, End.SUCCEEDED))  # another attempt's end: ignored
        end = protocol.end_of_event(event)
        theirs.send(protocol.done_event("a" * 32, end, error=event.get("error")))
    assert runner.supervise_hosted(time_limit=3600) == expected


class SelectiveClient(FakeClient):
    """Refuses the ``memory`` plugin's report, naming it, the way the control plane does."""

    def post(self, path: str, body: dict):
        self.bodies.append(json.loads(json.dumps(body)))
        if "memory" in body.get("reports", {}):
            raise ApiError(400, "reports: bad", {"reports": {"memory": {"items": ["bad"]}}})
        return {"lease_seconds": 30.0, "stop": [], "sharing_policy": "srtf"}


def test_a_refused_plugin_report_costs_only_that_plugin(tmp_path):
    from components.runtime.node.agent import NodeAgent

    agent = object.__new__(NodeAgent)
    agent.state_dir = tmp_path
    (tmp_path / "running").mkdir()
    agent.devices = []
    agent.registration = {"node": "n1", "session": "s1"}
    agent.client = SelectiveClient(refuse=True)
    agent.services = Supervisor(node(tmp_path, devices=1), [("memory", f"{__name__}:Memory"),
                                                            ("other", f"{__name__}:Memory")])
    agent.services.start_all()
    assert agent.heartbeat()["sharing_policy"] == "srtf"
    assert len(agent.client.bodies) == 2
    retry = agent.client.bodies[1]
    assert set(retry["reports"]) == {"other"}  # the healthy plugin's report still goes through
    assert set(retry) == {"node", "session", "samples", "attempts", "reports"}


class Environ(Memory):
    def environment(self):
        return {"STRATA_MEMORY_DIR": f"/tmp/memory-{self.index}", "SHARED": "memory"}


class OtherEnviron(Memory):
    def environment(self):
        return {"SHARED": "other", "STRATA_OTHER": "1"}


class BadEnviron(Memory):
    def environment(self):
        return {"STRATA_BAD": 7}


def test_the_services_environment_is_merged_and_a_bad_one_costs_only_itself(tmp_path):
    supervisor = Supervisor(node(tmp_path), [("memory", f"{__name__}:Environ"), ("other", f"{__name__}:OtherEnviron"),
                                             ("bad", f"{__name__}:BadEnviron")])
    environment = supervisor.environment()
    # The first instance and the first plugin keep a name; a service answering non-strings gives nothing.
    assert environment == {"STRATA_MEMORY_DIR": "/tmp/memory-0", "SHARED": "memory", "STRATA_OTHER": "1"}
