"""The node agent's Prometheus metrics (components.runtime.node.metrics) and a report schema's ``metrics``."""

from __future__ import annotations

import math

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from components.runtime.contract import registry
from components.runtime.contract.plugins import Plugin, ReportSchema, Sample, sample_problems
from components.runtime.contract.services import NodeInfo, NodeService, Supervisor
from components.runtime.node.agent import NodeAgent, NodeOptions

# -- two outside plugins: one whose metrics work, one whose metrics function raises ----------------------------


class ProbeService(NodeService):
    name = "probe"

    def __init__(self):
        self.alive = False

    @classmethod
    def instances(cls, node):
        return [cls()]

    def start(self):
        self.alive = True

    def check(self):
        return self.alive

    def stop(self, timeout=15.0):
        self.alive = False

    def report(self):
        return {"queue": 4, "served": 17}


class BrokenProbeService(ProbeService):
    name = "broken"


class DownService(ProbeService):
    name = "down"

    def start(self):
        raise RuntimeError("cannot start")


def probe_metrics(report):
    yield Sample("strata_probe_queue", report["queue"], help="Requests waiting.", labels={"lane": "a"})
    yield Sample("strata_probe_served_total", report["served"], kind="counter", help="Requests served.")


def broken_metrics(report):
    raise RuntimeError("boom")


class ProbeReport(ReportSchema):
    def node(self, payload):
        return dict(payload)

    def metrics(self, report):
        return probe_metrics(report)


class BrokenProbeReport(ProbeReport):
    def metrics(self, report):
        return broken_metrics(report)


class QuietReport(ReportSchema):
    """A report schema with no metrics of its own."""


PROBE = Plugin(name="probe", reports=f"{__name__}:ProbeReport")
BROKEN = Plugin(name="broken-probe", reports=f"{__name__}:BrokenProbeReport")
QUIET = Plugin(name="quiet", reports=f"{__name__}:QuietReport")
REPORTS_NOT_A_SCHEMA = Plugin(name="not-a-schema", reports=f"{__name__}:probe_metrics")
REPORTS_MISSING = Plugin(name="missing", reports="no_such_module_here:Report")
REPORTS_BAD_SHAPE = Plugin(name="bad-shape", reports="not a path")
REPORTS_NOT_A_STRING = Plugin(name="not-a-string", reports=ProbeReport)  # type: ignore[arg-type]


def test_the_registry_reads_metrics_from_report_schemas(install_plugins):
    install_plugins(*(f"{__name__}:{name}" for name in (
        "PROBE", "BROKEN", "QUIET", "REPORTS_NOT_A_SCHEMA", "REPORTS_MISSING", "REPORTS_BAD_SHAPE",
        "REPORTS_NOT_A_STRING")))
    found = registry.metrics()
    assert list(found["probe"]({"queue": 1, "served": 2}))[0].value == 1
    with pytest.raises(RuntimeError, match="boom"):
        found["broken-probe"]({})
    assert "quiet" in registry.plugins() and "quiet" not in found  # no metrics of its own: none served
    problems = registry.problems()
    assert "is not a ReportSchema subclass" in problems["not-a-schema"]
    assert "ModuleNotFoundError" in problems["missing"]
    assert "is not a 'module:attribute' path" in problems["bad-shape"]
    assert "reports must be a 'module:attribute' path or None" in problems["not-a-string"]
    # A broken report schema costs only its own plugin.
    assert "probe" in registry.plugins() and "train" in registry.plugins()


def test_the_built_in_plugins_with_node_reports_have_metrics():
    assert {"gpushare", "datacache"} <= set(registry.metrics())


def test_sample_problems_name_what_is_wrong():
    good = [Sample("strata_probe_x", 1.0, labels={"a": "b"}), Sample("strata_probe_y_total", 3, kind="counter")]
    assert sample_problems("probe", good) == []
    bad = {
        "prefix": Sample("strata_other_x", 1.0),
        "name": Sample("strata_probe_x-y", 1.0),
        "finite": Sample("strata_probe_x", math.nan),
        "bool": Sample("strata_probe_x", True),
        "labels": Sample("strata_probe_x", 1.0, labels={"a": 1}),
        "node label": Sample("strata_probe_x", 1.0, labels={"node": "n"}),
        "counter suffix": Sample("strata_probe_x", 1.0, kind="counter"),
        "kind": Sample("strata_probe_x", 1.0, kind="summary"),
        "negative counter": Sample("strata_probe_x_total", -1.0, kind="counter"),
    }
    for why, sample in bad.items():
        assert sample_problems("probe", [sample]), why
    assert sample_problems("probe", [Sample("strata_probe_x", 1.0)] * 2)  # the same labels twice
    assert sample_problems("probe", ["not a sample"])
    assert sample_problems("broken-probe", [Sample("strata_broken_probe_x", 1.0)]) == []


# -- the agent's metrics server ------------------------------------------------------------------------------


@pytest.fixture
def agent(tmp_path, install_plugins):
    install_plugins(f"{__name__}:PROBE", f"{__name__}:BROKEN")
    agent = NodeAgent(NodeOptions(server="http://127.0.0.1:9", token="t", name="node-a", virtual_gpus=2,
                                  virtual_gpu_memory=4 << 30, state_dir=tmp_path / "node"))
    agent.registration = {"node": "00000000-0000-0000-0000-000000000001", "session": "s"}
    node = NodeInfo(name="node-a", devices=list(agent.devices), state_dir=agent.state_dir)
    agent.services = Supervisor(node, [("probe", f"{__name__}:ProbeService"),
                                       ("broken-probe", f"{__name__}:BrokenProbeService"),
                                       ("probe", f"{__name__}:DownService")])
    agent.services.start_all()
    sent = []
    agent.client.post = lambda path, body: sent.append((path, body)) or {}
    agent.sent = sent
    yield agent
    agent.metrics.stop()
    agent.services.stop_all()


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert answer.status_code == 200
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text) for sample in family.samples}


def test_the_node_serves_devices_heartbeats_services_and_plugin_metrics(agent):
    agent.options.metrics_port = 0
    assert agent.start_metrics() is None  # 0: off
    port = agent.metrics.start(0, "127.0.0.1")  # a free port
    assert port
    before = _scrape(port)
    assert before[("strata_node_heartbeats_total", (("node", "node-a"),))] == 0
    assert ("strata_node_device_memory_total_bytes", (("device", "1"), ("kind", "virtual"), ("node", "node-a"))) \
        in before

    agent.heartbeat()
    assert agent.sent and agent.sent[-1][1]["reports"]["probe"] == {"queue": 4, "served": 17}
    agent.metrics.heartbeat_failed()
    found = _scrape(port)
    device = (("device", "0"), ("kind", "virtual"), ("node", "node-a"))
    assert found[("strata_node_device_memory_total_bytes", device)] == 4 << 30
    assert ("strata_node_device_utilization_percent", device) in found
    assert ("strata_node_device_memory_used_bytes", device) in found
    assert found[("strata_node_heartbeats_total", (("node", "node-a"),))] == 2
    assert found[("strata_node_heartbeat_failures_total", (("node", "node-a"),))] == 1
    assert found[("strata_node_last_heartbeat_timestamp_seconds", (("node", "node-a"),))] > 0
    assert found[("strata_node_attempts_running", (("node", "node-a"),))] == 0
    services = {key[1]: value for key, value in found.items() if key[0] == "strata_node_service_up"}
    assert services[(("node", "node-a"), ("plugin", "probe"), ("service", "probe"))] == 1
    assert services[(("node", "node-a"), ("plugin", "probe"), ("service", "down"))] == 0
    # The plugin's own samples, with the node label; the broken one costs only its own.
    assert found[("strata_probe_queue", (("lane", "a"), ("node", "node-a")))] == 4
    assert found[("strata_probe_served_total", (("node", "node-a"),))] == 17
    up = {key[1]: value for key, value in found.items() if key[0] == "strata_node_plugin_metrics_up"}
    assert up == {(("node", "node-a"), ("plugin", "probe")): 1.0,
                  (("node", "node-a"), ("plugin", "broken-probe")): 0.0}
    assert not any(name.startswith("strata_broken_probe_") for name, _ in found)


def test_a_plugin_sample_that_takes_a_core_or_another_plugins_name_is_left_out(agent):
    from components.runtime.node.metrics import NodeMetrics

    functions = {"probe": lambda report: [Sample("strata_probe_queue", 1.0)],
                 "node": lambda report: [Sample("strata_node_attempts_running", 5.0)]}
    metrics = NodeMetrics(agent, plugin_metrics=lambda: functions)
    metrics.observe([], {"probe": {}, "node": {}}, [])
    port = metrics.start(0, "127.0.0.1")
    try:
        found = _scrape(port)
    finally:
        metrics.stop()
    assert found[("strata_probe_queue", (("node", "node-a"),))] == 1.0
    assert found[("strata_node_attempts_running", (("node", "node-a"),))] == 0  # the agent's own, not 5
    assert found[("strata_node_plugin_metrics_up", (("node", "node-a"), ("plugin", "node")))] == 0


def test_the_agent_starts_the_server_on_its_address_when_asked(agent):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent.options.metrics_port = port
    assert agent.start_metrics() == port  # --metrics-bind defaults to the node's --address (127.0.0.1)
    assert ("strata_node_heartbeats_total", (("node", "node-a"),)) in _scrape(port)
    # A taken port costs only the metrics.
    from components.runtime.node.metrics import NodeMetrics

    assert NodeMetrics(agent).start(port, "127.0.0.1") is None


def test_the_cli_passes_the_metrics_options(monkeypatch):
    from strata.cli import main as cli

    args = cli.build_parser().parse_args(["node", "--server", "http://x", "--metrics-port", "9108",
                                          "--metrics-bind", "0.0.0.0"])
    assert (args.metrics_port, args.metrics_bind) == (9108, "0.0.0.0")
    args = cli.build_parser().parse_args(["node", "--server", "http://x"])
    assert (args.metrics_port, args.metrics_bind) == (0, None)
