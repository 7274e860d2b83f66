"""The node agent's Prometheus metrics (``strata node --metrics-port``; docs/operations/metrics.md).

:class:`NodeMetrics` keeps what the agent saw at its latest heartbeat (device samples, running attempts, the node
services' reports) and counts heartbeats; :class:`NodeCollector` turns it into metric families at scrape time:

* per device: utilization and memory used/total (labels ``node``, ``device``, ``kind``);
* attempts running, heartbeats sent and failed, the time of the last good heartbeat;
* each node service instance: up or not (labels ``node``, ``plugin``, ``service``);
* **each plugin's own metrics**: its manifest's ``metrics`` function (:attr:`components.runtime.contract.plugins.Plugin
  .metrics`) turns its latest report into :class:`~components.runtime.contract.plugins.Sample` objects. Samples are
  checked (:func:`~components.runtime.contract.plugins.sample_problems`) and get the ``node`` label; a function that
  raises or yields a bad sample costs only that plugin's samples for this scrape
  (``strata_node_plugin_metrics_up{plugin} 0``, the reason logged).

Light: prometheus_client is imported when a server starts or a scrape runs; no plugin is named here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.runtime.contract.plugins import Sample, sample_problems

log = logging.getLogger("strata.node.metrics")


@dataclass(frozen=True)
class Observation:
    """What one heartbeat carried (replaced as a whole: a scrape reads one consistent snapshot)."""

    samples: list[dict] = field(default_factory=list)  # [{"index", "utilization", "memory_used"}]
    reports: dict[str, Any] = field(default_factory=dict)  # {plugin: merged node-services payload}
    attempts: int = 0
    time: float = 0.0


class NodeMetrics:
    """The agent's observations, counted and kept for scrapes. ``agent`` is read for its node name, devices and
    services at scrape time (anything with ``options.name``, ``devices`` and ``services``)."""

    def __init__(self, agent: Any, plugin_metrics: Callable[[], dict[str, Any]] | None = None):
        self.agent = agent
        self.latest = Observation()
        self.heartbeats = 0
        self.failures = 0
        self.last_ok = 0.0
        self._lock = threading.Lock()
        self._plugin_metrics = plugin_metrics
        self.server = None

    # -- what the agent calls ------------------------------------------------------------------------------
    def observe(self, samples: list[dict], reports: dict[str, Any] | None, attempts) -> None:
        """A heartbeat is about to be sent with these device samples, plugin reports and running attempts."""
        self.latest = Observation(samples=list(samples), reports=dict(reports or {}), attempts=len(attempts),
                                  time=time.time())

    def heartbeat_ok(self) -> None:
        with self._lock:
            self.heartbeats += 1
            self.last_ok = time.time()

    def heartbeat_failed(self) -> None:
        with self._lock:
            self.heartbeats += 1
            self.failures += 1

    # -- the server ----------------------------------------------------------------------------------------
    def start(self, port: int, address: str):
        """Serve ``/metrics`` on ``address:port`` in a daemon thread (0: a free port; the agent calls this only
        when ``--metrics-port`` is set). A port that cannot be bound is
        logged and costs only the metrics. Returns the bound port, or None."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(NodeCollector(self))
        try:
            self.server, _ = start_http_server(port, addr=address, registry=registry)
        except (OSError, OverflowError, ValueError) as error:
            log.error("node metrics: cannot listen on %s:%s (%s); metrics are not served", address, port, error)
            return None
        bound = self.server.server_address[1]
        log.info("node metrics on http://%s:%s/metrics", address, bound)
        return bound

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def plugin_functions(self) -> dict[str, Any]:
        if self._plugin_metrics is not None:
            return self._plugin_metrics()
        from components.runtime.contract import registry

        return registry.metrics()


def plugin_samples(plugin: str, function: Any, report: Any) -> list[Sample]:
    """The checked samples ``function`` makes of ``report``; raises ValueError naming what is wrong."""
    samples = list(function(report) or ())
    problems = sample_problems(plugin, samples)
    if problems:
        raise ValueError("; ".join(problems[:5]))
    return samples


class NodeCollector:
    """A prometheus_client collector over one :class:`NodeMetrics`."""

    def __init__(self, metrics: NodeMetrics):
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        metrics = self.metrics
        agent = metrics.agent
        node = str(agent.options.name)
        latest = metrics.latest
        kinds = {d.index: str(getattr(d, "kind", "")) for d in getattr(agent, "devices", [])}
        totals = {d.index: int(getattr(d, "memory_total", 0) or 0) for d in getattr(agent, "devices", [])}
        labels = ["node", "device", "kind"]
        utilization = GaugeMetricFamily("strata_node_device_utilization_percent",
                                        "Device utilization at the last heartbeat (0-100).", labels=labels)
        used = GaugeMetricFamily("strata_node_device_memory_used_bytes",
                                 "Device memory used at the last heartbeat.", labels=labels)
        total = GaugeMetricFamily("strata_node_device_memory_total_bytes", "Device memory.", labels=labels)
        sampled = {int(sample["index"]): sample for sample in latest.samples}
        for index in sorted(set(kinds) | set(sampled)):
            key = [node, str(index), kinds.get(index, "")]
            total.add_metric(key, totals.get(index, 0))
            if index in sampled:
                utilization.add_metric(key, float(sampled[index].get("utilization") or 0.0))
                used.add_metric(key, float(sampled[index].get("memory_used") or 0))
        yield utilization
        yield used
        yield total
        yield _gauge("strata_node_attempts_running", "Attempts running on this node at the last heartbeat.",
                     node, latest.attempts)
        with metrics._lock:
            heartbeats, failures, last_ok = metrics.heartbeats, metrics.failures, metrics.last_ok
        family = CounterMetricFamily("strata_node_heartbeats", "Heartbeats sent (answered or not).",
                                     labels=["node"])
        family.add_metric([node], heartbeats)
        yield family
        family = CounterMetricFamily("strata_node_heartbeat_failures",
                                     "Heartbeats that failed (the control plane did not take them).",
                                     labels=["node"])
        family.add_metric([node], failures)
        yield family
        yield _gauge("strata_node_last_heartbeat_timestamp_seconds",
                     "Unix time of the last heartbeat the control plane took (0: none yet).", node, last_ok)

        services = getattr(agent, "services", None)
        up = GaugeMetricFamily("strata_node_service_up", "Node service instances: 1 running, 0 down "
                               "(waiting for a restart).", labels=["node", "plugin", "service"])
        for entry in list(getattr(services, "entries", None) or []):
            service = entry.service
            name = str(getattr(service, "name", "") or type(service).__name__)
            up.add_metric([node, str(service.plugin), name], 1.0 if entry.running else 0.0)
        yield up

        yield from self._plugins(node, latest.reports)

    def _plugins(self, node: str, reports: dict[str, Any]):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            functions = self.metrics.plugin_functions()
        except Exception as error:  # noqa: BLE001 - never cost the node's own metrics
            log.warning("node metrics: cannot read the plugins' metrics functions: %r", error)
            functions = {}
        status = GaugeMetricFamily("strata_node_plugin_metrics_up",
                                   "1 when the plugin's metrics function answered valid samples at this scrape.",
                                   labels=["node", "plugin"])
        families: dict[str, Any] = {}
        owners: dict[str, str] = {}
        for plugin, function in sorted(functions.items()):
            if plugin not in reports:
                continue  # no report this heartbeat (services off or silent): nothing to say
            try:
                samples = plugin_samples(plugin, function, reports[plugin])
                taken = sorted({s.name for s in samples if s.name in CORE_NAMES or
                                (s.name in families and owners[s.name] != plugin)})
                if taken:
                    raise ValueError(f"names already taken: {', '.join(taken)}")
            except Exception as error:  # noqa: BLE001 - a broken plugin costs only its own samples
                log.warning("node metrics of plugin %s left out: %s: %s", plugin, type(error).__name__, error)
                status.add_metric([node, plugin], 0.0)
                continue
            status.add_metric([node, plugin], 1.0)
            for sample in samples:
                family = families.get(sample.name)
                names = ["node", *sorted(sample.labels)]
                if family is None:
                    if sample.kind == "counter":
                        family = CounterMetricFamily(sample.name[: -len("_total")], sample.help, labels=names)
                    else:
                        family = GaugeMetricFamily(sample.name, sample.help, labels=names)
                    families[sample.name] = family
                    owners[sample.name] = plugin
                family.add_metric([node, *(sample.labels[k] for k in sorted(sample.labels))], float(sample.value))
        yield status
        yield from families.values()


# The agent's own metric names (a counter's with its _total): no plugin sample may take one.
CORE_NAMES = frozenset({
    "strata_node_device_utilization_percent", "strata_node_device_memory_used_bytes",
    "strata_node_device_memory_total_bytes", "strata_node_attempts_running", "strata_node_heartbeats_total",
    "strata_node_heartbeat_failures_total", "strata_node_last_heartbeat_timestamp_seconds",
    "strata_node_service_up", "strata_node_plugin_metrics_up",
})


def _gauge(name: str, help_text: str, node: str, value: float):
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, help_text, labels=["node"])
    family.add_metric([node], value)
    return family
