"""Node services: what a plugin runs on every node, next to the node agent (the ``node_services`` seam).

A plugin names :class:`NodeService` subclasses in its manifest (``node_services=("pkg.module:Class",)``). The
node agent (:mod:`components.runtime.node.agent`) imports each one, asks it for this node's instances
(:meth:`NodeService.instances`: one per device, one per node, or none) and supervises them all the same way:

- :meth:`~NodeService.start` once, then :meth:`~NodeService.check` every heartbeat; a service that is not
  alive is started again with exponential backoff (0.5 s, 1 s, 2 s ... up to 30 s per instance);
- :meth:`~NodeService.report` with every heartbeat: the payloads of one plugin's instances are merged
  (:meth:`~NodeService.merge`) and sent as ``reports: {plugin: payload}``, checked by the control plane with
  the plugin's :class:`~components.runtime.contract.plugins.ReportSchema`;
- :meth:`~NodeService.configure` with the heartbeat's answer (node-wide settings, e.g. ``sharing_policy``);
- :meth:`~NodeService.worker_config`: what the node's Celery worker must know to reach the service (merged
  per plugin into the worker's configuration). A service that runs attempts for the worker (a *host*, such
  as a device's sharing service) also answers :meth:`~NodeService.host_for`, in the worker process;
- :meth:`~NodeService.environment`: variables every attempt on the node gets (merged over the plugins, set
  in the agent's environment before the worker and the services start, so the attempts' child processes and
  the sessions a service hosts all see them: e.g. where a node-local cache lives);
- :meth:`~NodeService.stop` when the agent stops.

A service that fails to import, to build its instances, to start, to report or to stop costs only itself: the
agent logs it and goes on. ``STRATA_NODE_SERVICES_DISABLE=plugin-a,plugin-b`` leaves those plugins' services
out on a node.

:class:`ProcessService` is the helper base for a service that is a child process: parent-death signal (no
orphan outlives the agent), liveness from the process, terminate-then-kill on stop.

This module is light: no torch, no plugin imports.
"""

from __future__ import annotations

import abc
import logging
import os
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

log = logging.getLogger("strata.node.services")

DISABLE_ENV = "STRATA_NODE_SERVICES_DISABLE"  # comma-separated plugin names whose node services stay off


def disabled_plugins(environ: dict[str, str] | None = None) -> frozenset[str]:
    """The plugins whose node services are turned off on this node (``STRATA_NODE_SERVICES_DISABLE``)."""
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Linux: deliver ``sig`` to this process when its parent dies (no orphan keeps a device busy). Use as a
    ``preexec_fn``, or call it first thing in a child."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class NodeInfo:
    """What a node service may know about the node it runs on."""

    name: str
    devices: list = field(default_factory=list)  # components.runtime.node.devices.Device
    state_dir: Path = field(default_factory=lambda: Path("."))  # the agent's state directory
    labels: dict[str, str] = field(default_factory=dict)

    def directory(self, plugin: str) -> Path:
        """A private directory for ``plugin`` under the node's state directory (created, mode 0700)."""
        path = Path(self.state_dir) / plugin
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
        return path


class NodeService(abc.ABC):
    """One service a plugin runs on a node. Subclasses implement :meth:`start`, :meth:`check`, :meth:`stop`;
    everything else has a default that does nothing.

    The agent sets :attr:`plugin` (the owning plugin's name) on every instance before starting it.
    :meth:`start` may be called again after :meth:`check` said the service died: it must start it afresh.
    """

    plugin: str = ""
    name: ClassVar[str] = ""  # a label for logs; defaults to the class name

    @classmethod
    def instances(cls, node: NodeInfo) -> list[NodeService]:
        """This node's instances of the service (e.g. one per device). Default: one, built with no argument."""
        return [cls()]

    @property
    def label(self) -> str:
        return f"{self.plugin or '?'}/{self.name or type(self).__name__}"

    @abc.abstractmethod
    def start(self) -> None:
        """Start the service (a process, a thread, or nothing to do). Raising costs only this service."""

    @abc.abstractmethod
    def check(self) -> bool:
        """True while the service is alive and healthy; the agent restarts it (with backoff) when False."""

    @abc.abstractmethod
    def stop(self, timeout: float = 15.0) -> None:
        """Stop the service, within about ``timeout`` seconds."""

    def report(self) -> Any | None:
        """A JSON-able payload sent with the next heartbeat under ``reports[plugin]``, or None (nothing)."""
        return None

    @classmethod
    def merge(cls, payloads: list[Any]) -> Any:
        """One plugin payload from its instances' reports (None ones dropped). Default: a single payload as it
        is; dicts merged key by key, list values concatenated (so per-device ``{"devices": [entry]}`` payloads
        become one ``{"devices": [...]}``)."""
        if len(payloads) == 1:
            return payloads[0]
        if not all(isinstance(payload, dict) for payload in payloads):
            return payloads
        merged: dict[str, Any] = {}
        for payload in payloads:
            for key, value in payload.items():
                if isinstance(value, list) and isinstance(merged.get(key), list):
                    merged[key] = merged[key] + value
                else:
                    merged[key] = list(value) if isinstance(value, list) else value
        return merged

    def configure(self, settings: dict[str, Any]) -> None:  # noqa: B027 -- optional hook
        """Node-wide settings from the control plane: the heartbeat's answer (e.g. ``sharing_policy``)."""

    def environment(self) -> dict[str, str]:
        """Environment variables for every attempt on this node (and the processes the agent starts after its
        services are built). Asked once, before any service starts; names must not clash across plugins."""
        return {}

    def worker_config(self) -> dict[str, Any] | None:
        """JSON the node's worker needs to reach this service (merged per plugin, see :meth:`host_for`)."""
        return None

    @classmethod
    def host_for(cls, config: dict[str, Any], claim: dict[str, Any], node: str) -> Any | None:
        """In the node's worker: where to run the claimed attempt when this plugin's service should host it,
        else None (the attempt runs in child processes). ``config`` is the plugin's merged
        :meth:`worker_config`, ``claim`` the attempt's claim answer, ``node`` this node's id. A host returns a
        :class:`components.runtime.shared.protocol.HostAddress`."""
        return None


class ProcessService(NodeService):
    """A node service that is one child process of the agent.

    Subclasses give the :meth:`command`; the process gets a parent-death signal (it dies with the agent),
    ``stdin`` closed and the agent's environment without the worker's configuration. :meth:`check` is the
    process being alive; :meth:`stop` sends SIGTERM, then SIGKILL after ``timeout`` seconds.
    """

    death_signal: ClassVar[int] = signal.SIGTERM  # what the child gets when the agent dies

    process: subprocess.Popen | None = None

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The command line of the process."""

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("STRATA_NODE_CONFIG", None)
        return env

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        death = self.death_signal
        self.process = subprocess.Popen(self.command(), env=self.environment(), stdin=subprocess.DEVNULL,
                                        preexec_fn=lambda: set_parent_death_signal(death))
        log.info("%s started (pid %d)", self.label, self.process.pid)

    def check(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    def stop(self, timeout: float = 15.0) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=max(0.1, timeout))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass
class _Supervised:
    service: NodeService
    path: str
    running: bool = False
    failures: int = 0
    next_start: float | None = None  # time.monotonic() of the next start attempt, while it is down


class Supervisor:
    """Every node service of every plugin on this node, supervised the same way (used by the node agent).

    ``services`` is ``[(plugin, "module:Class")]`` (:func:`components.runtime.contract.registry.node_services`);
    ``disabled`` are plugins left out. Nothing here raises because of one service."""

    def __init__(self, node: NodeInfo, services: Iterable[tuple[str, str]], disabled: Iterable[str] = (),
                 clock=None):
        import time

        self.node = node
        self.clock = clock or time.monotonic
        self.entries: list[_Supervised] = []
        self.classes: dict[str, dict[str, type]] = {}  # plugin -> {path: class}
        self.problems: dict[str, str] = {}  # "plugin path" -> why it is not running
        disabled = set(disabled)
        for plugin, path in services:
            if plugin in disabled:
                log.info("node services of plugin %s are disabled (%s)", plugin, DISABLE_ENV)
                continue
            self._load(plugin, path)

    def _load(self, plugin: str, path: str) -> None:
        from components.runtime.contract.registry import import_path

        try:
            service_class = import_path(path)
            if not (isinstance(service_class, type) and issubclass(service_class, NodeService)):
                raise TypeError(f"{path} is not a NodeService subclass")
            instances = list(service_class.instances(self.node))
            for instance in instances:
                if not isinstance(instance, NodeService):
                    raise TypeError(f"{path}.instances() returned {type(instance).__name__}, not a NodeService")
        except Exception as error:  # noqa: BLE001 - a broken service costs only itself
            self.problems[f"{plugin} {path}"] = f"{type(error).__name__}: {error}"
            log.exception("node service %s of plugin %s is left out", path, plugin)
            return
        self.classes.setdefault(plugin, {})[path] = service_class
        for instance in instances:
            instance.plugin = plugin
            self.entries.append(_Supervised(instance, path))

    def _start(self, entry: _Supervised) -> None:
        try:
            entry.service.start()
        except Exception as error:  # noqa: BLE001
            entry.running = False
            self._failed(entry, f"failed to start: {type(error).__name__}: {error}")
            return
        entry.running = True
        entry.next_start = None

    def _failed(self, entry: _Supervised, why: str) -> None:
        entry.failures += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (entry.failures - 1))
        entry.next_start = self.clock() + delay
        log.error("node service %s %s; starting it again in %.1f s", entry.service.label, why, delay)

    def start_all(self) -> None:
        for entry in self.entries:
            self._start(entry)

    def check(self) -> None:
        """Start again, with backoff per instance, the services that died or failed to start."""
        now = self.clock()
        for entry in self.entries:
            if entry.next_start is None:
                try:
                    alive = bool(entry.service.check())
                except Exception as error:  # noqa: BLE001
                    alive = False
                    log.warning("node service %s: check() raised %r", entry.service.label, error)
                if alive:
                    continue
                entry.running = False
                code = getattr(entry.service, "returncode", None)
                self._failed(entry, "is not alive" + (f" (exit code {code})" if code is not None else ""))
            if entry.next_start is not None and now >= entry.next_start:
                self._start(entry)

    def reports(self) -> dict[str, Any]:
        """``{plugin: merged payload}`` of the running services that had something to say."""
        found: dict[str, list[Any]] = {}
        owner: dict[str, type[NodeService]] = {}
        for entry in self.entries:
            if not entry.running:
                continue
            try:
                payload = entry.service.report()
            except Exception as error:  # noqa: BLE001
                log.warning("node service %s: report() raised %r", entry.service.label, error)
                continue
            if payload is not None:
                found.setdefault(entry.service.plugin, []).append(payload)
                owner.setdefault(entry.service.plugin, type(entry.service))
        merged = {}
        for plugin, payloads in found.items():
            try:
                merged[plugin] = owner[plugin].merge(payloads)
            except Exception as error:  # noqa: BLE001
                log.warning("node services of %s: merge() raised %r", plugin, error)
        return merged

    def configure(self, settings: dict[str, Any]) -> None:
        for entry in self.entries:
            if not entry.running:
                continue
            try:
                entry.service.configure(settings)
            except Exception as error:  # noqa: BLE001
                log.warning("node service %s: configure() raised %r", entry.service.label, error)

    def environment(self) -> dict[str, str]:
        """Every service's :meth:`NodeService.environment`, merged; a service that raises or answers something
        other than string pairs costs only its own variables (logged), and the first plugin to set a name keeps
        it."""
        merged: dict[str, str] = {}
        for entry in self.entries:
            try:
                part = entry.service.environment() or {}
                if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in part.items()):
                    raise TypeError("environment() must return {str: str}")
            except Exception as error:  # noqa: BLE001
                log.warning("node service %s: environment() failed: %r", entry.service.label, error)
                continue
            for name, value in part.items():
                if name in merged and merged[name] != value:
                    log.warning("node service %s: %s is already set by another service; kept the first",
                                entry.service.label, name)
                    continue
                merged[name] = value
        return merged

    def worker_config(self) -> dict[str, dict[str, Any]]:
        """``{plugin: {"classes": [paths], "config": merged worker_config}}`` for the node's worker."""
        config: dict[str, dict[str, Any]] = {}
        for entry in self.entries:
            try:
                part = entry.service.worker_config()
            except Exception as error:  # noqa: BLE001
                log.warning("node service %s: worker_config() raised %r", entry.service.label, error)
                continue
            plugin = config.setdefault(entry.service.plugin, {"classes": [], "config": {}})
            if entry.path not in plugin["classes"]:
                plugin["classes"].append(entry.path)
            if part:
                plugin["config"].update(part)
        return config

    def stop_all(self, timeout: float = 15.0) -> None:
        for entry in self.entries:
            try:
                entry.service.stop(timeout)
            except Exception as error:  # noqa: BLE001
                log.warning("node service %s: stop() raised %r", entry.service.label, error)
            entry.running = False


def find_host(services: dict[str, dict[str, Any]], claim: dict[str, Any], node: str) -> tuple[str, Any] | None:
    """In the node's worker: ``(plugin, address)`` of the first node service that hosts this attempt, or None.
    ``services`` is the worker configuration's ``services`` (:meth:`Supervisor.worker_config`)."""
    from components.runtime.contract.registry import import_path

    for plugin, entry in (services or {}).items():
        for path in entry.get("classes", []):
            try:
                address = import_path(path).host_for(entry.get("config") or {}, claim, node)
            except Exception as error:  # noqa: BLE001 - a broken host only loses its attempts to child processes
                log.warning("node service %s of %s: host_for() raised %r", path, plugin, error)
                continue
            if address is not None:
                return plugin, address
    return None
