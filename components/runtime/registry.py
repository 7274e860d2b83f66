"""The lazy, frozen plugin registry.

Plugins (:class:`components.runtime.plugins.Plugin` manifests) come from :data:`BUILTIN_PLUGINS` and from the
``strata.plugins`` entry-point group; outside packages that only add a job kind may still use the older
``strata.components`` group (a :class:`~components.runtime.spec.KindSpec` path, read as a one-kind plugin).

The registry is read once, on first use, then frozen. Each plugin is checked on its own: its manifest, the
uniqueness of its names (plugin, kinds, benchmarks, commands) and every light part, imported and type-checked.
Plugins load after the plugins their manifest ``requires``; one whose requirement is not installed, is left out,
is outside the required version range or is part of a cycle of requirements is left out too.
A plugin that fails any check is left out whole and its problem is recorded (:func:`problems`): a broken plugin
costs its own parts, never the platform. Heavy parts (components, node services, benchmarks) are imported only
where they run.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from components.runtime.plugins import NAME_RE, Command, Plugin, ReportSchema
from components.runtime.spec import KindSpec

log = logging.getLogger(__name__)

# The built-in plugins. This list is the one place the core names them.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "components.train.plugin:PLUGIN",
    "components.embeddings.plugin:PLUGIN",
    "components.serving.plugin:PLUGIN",
    "components.gpushare.plugin:PLUGIN",
    "components.tuning.plugin:PLUGIN",
    "components.datacache.plugin:PLUGIN",
    "components.straggler.plugin:PLUGIN",
    "components.decentral.plugin:PLUGIN",
)
ENTRY_POINT_GROUP = "strata.plugins"
KIND_ENTRY_POINT_GROUP = "strata.components"


class UnknownKind(LookupError):
    def __init__(self, kind: str, known: list[str]):
        self.kind = kind
        self.known = known
        super().__init__(f"unknown job kind {kind!r}; known kinds: {', '.join(known)}")


def import_path(path: str):
    """Import ``"package.module:attribute"``."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ImportError(f"{path!r} is not of the form 'package.module:attribute'")
    return getattr(importlib.import_module(module_name), attribute)


@dataclass(frozen=True)
class LoadedPlugin:
    """A checked plugin: its manifest, where it came from, and its light parts, imported."""

    plugin: Plugin
    source: str
    kinds: dict[str, KindSpec]
    panels: tuple[tuple[str, type], ...]  # (path, Panel class)
    report: ReportSchema | None
    hooks: tuple[Any, ...]
    subscribers: tuple[Any, ...]
    commands: dict[str, type]
    job_routes: dict[str, Any]  # name -> function(data: PanelData) -> JSON
    data_providers: tuple[Any, ...] = ()  # DataProvider instances
    collections: dict[str, Any] = field(default_factory=dict)  # name -> Collection instance
    strategies: dict[str, Any] = field(default_factory=dict)  # name -> distributed.Strategy instance
    metrics: Any = None  # function(report) -> Iterable[plugins.Sample]: the plugin's node metrics, or None

    @property
    def name(self) -> str:
        return self.plugin.name


@dataclass(frozen=True)
class _State:
    plugins: dict[str, LoadedPlugin]
    problems: dict[str, str]  # plugin name (or its source) -> why it was left out
    kinds: dict[str, KindSpec]


_lock = threading.Lock()
_state: _State | None = None


def _subclass(path: str, base: type) -> type:
    value = import_path(path)
    if not (isinstance(value, type) and issubclass(value, base)):
        raise TypeError(f"{path} is not a {base.__name__} subclass")
    return value


def _check_kind(path: str) -> KindSpec:
    spec_class = _subclass(path, KindSpec)
    kind = getattr(spec_class, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{path} declares no kind")
    if ":" not in getattr(spec_class, "component", ""):
        raise TypeError(f"{path}.component must be 'module:Class', got {getattr(spec_class, 'component', None)!r}")
    return spec_class()


def _load_plugin(plugin: Plugin, source: str) -> LoadedPlugin:
    from components.runtime.panels import Panel

    if not isinstance(plugin, Plugin):
        raise TypeError(f"{source} is not a components.runtime.plugins.Plugin")
    problems = plugin.problems()
    if problems:
        raise ValueError("; ".join(problems))
    kinds: dict[str, KindSpec] = {}
    for path in plugin.kinds:
        spec = _check_kind(path)
        if spec.kind in kinds:
            raise ValueError(f"kind {spec.kind!r} is declared twice")
        kinds[spec.kind] = spec
    panels = [(path, _subclass(path, Panel)) for path in plugin.panels]
    # A kind's own panels (KindSpec.panels) belong to the plugin too.
    for spec in kinds.values():
        panels.extend((path, _subclass(path, Panel)) for path in spec.panels if path not in plugin.panels)
    report = _subclass(plugin.reports, ReportSchema)() if plugin.reports else None
    hooks = tuple(_hook(path) for path in plugin.hooks)
    subscribers = []
    for path in plugin.subscribers:
        subscriber = import_path(path)
        if not callable(subscriber):
            raise TypeError(f"{path} is not callable")
        subscribers.append(subscriber)
    commands: dict[str, type] = {}
    for path in plugin.commands:
        command = _subclass(path, Command)
        name = getattr(command, "name", None)
        if not isinstance(name, str) or not name or name in commands:
            raise ValueError(f"{path}: a command needs a unique name")
        commands[name] = command
    job_routes: dict[str, Any] = {}
    for name, path in plugin.job_routes.items():
        function = import_path(path)
        if not callable(function):
            raise TypeError(f"{path} is not callable")
        from components.runtime.collections import schema_problem

        if problem := schema_problem(getattr(function, "schema", None)):
            raise TypeError(f"{path}.schema: {problem}")
        job_routes[name] = function
    from components.runtime.data import DataProvider

    providers = tuple(_subclass(path, DataProvider)() for path in plugin.data_providers)
    for provider in providers:
        options = provider.options
        if not isinstance(options, frozenset | set) or not all(isinstance(o, str) and o for o in options):
            raise TypeError(f"{type(provider).__name__}.options must be a set of option names")
    from components.runtime.collections import Collection, schema_problem

    collections: dict[str, Any] = {}
    for name, path in plugin.collections.items():
        collection = _subclass(path, Collection)()
        collection.name = name
        if problem := schema_problem(collection.schema):
            raise TypeError(f"{path}.schema: {problem}")
        collections[name] = collection
    from components.runtime.distributed import Strategy

    strategies: dict[str, Any] = {}
    for path in plugin.strategies:
        strategy = _subclass(path, Strategy)()
        if not isinstance(strategy.name, str) or not NAME_RE.match(strategy.name):
            raise ValueError(f"{path}: a strategy needs a name matching {NAME_RE.pattern}")
        if not isinstance(strategy.runtime, str) or ":" not in strategy.runtime:
            raise ValueError(f"{path}: runtime must be the 'module:Class' of a StrategyRuntime")
        if strategy.name in strategies:
            raise ValueError(f"{path}: strategy {strategy.name!r} is named twice")
        strategies[strategy.name] = strategy
    metrics = None
    if plugin.metrics:
        metrics = import_path(plugin.metrics)
        if not callable(metrics) or isinstance(metrics, type):
            raise TypeError(f"{plugin.metrics} is not a function (metrics(report) -> samples)")
    return LoadedPlugin(plugin=plugin, source=source, kinds=kinds, panels=tuple(panels), report=report,
                        hooks=hooks, subscribers=tuple(subscribers), commands=commands, job_routes=job_routes,
                        data_providers=providers, collections=collections, strategies=strategies,
                        metrics=metrics)


def _hook(path: str) -> Any:
    """A scheduler hook: a Policy subclass (instantiated with no arguments) or a ready Policy object."""
    from components.runtime.policies import Policy

    value = import_path(path)
    if isinstance(value, type) and issubclass(value, Policy):
        return value()
    if isinstance(value, Policy):
        return value
    raise TypeError(f"{path} is not a components.runtime.policies.Policy")


def _manifests() -> list[tuple[str, Any]]:
    """``(source, manifest or the error importing it)`` for every registered plugin, built-ins first."""
    found: list[tuple[str, Any]] = []
    for path in BUILTIN_PLUGINS:
        found.append((path, _try(lambda path=path: import_path(path))))
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.append((f"{entry.value} (entry point {entry.name!r})", _try(entry.load)))
    for entry in entry_points(group=KIND_ENTRY_POINT_GROUP):
        plugin = Plugin(name=entry.name, description=f"job kind {entry.name}", kinds=(entry.value,))
        found.append((f"{entry.value} (entry point {entry.name!r} of {KIND_ENTRY_POINT_GROUP})", plugin))
    return found


def _try(load):
    try:
        return load()
    except Exception as error:  # noqa: BLE001 - third-party import-time failures of any kind
        return error


# Names core commands already use: a plugin may not shadow them.
# (tests/platform/cli/test_reserved_verbs.py checks every core verb of the CLI's parser is here.)
RESERVED_COMMANDS = frozenset({"up", "server", "scheduler", "node", "token", "user", "submit", "jobs", "logs",
                               "cancel", "quota", "bench", "plugins", "job-token", "participants", "code", "env",
                               "data", "migrate", "check", "secrets", "artifacts"})
# The core's own benchmarks (strata.cli.bench): a plugin may not take these names either.
RESERVED_BENCHMARKS = frozenset({"control-plane", "dashboard"})
# The core's own job sub-resources (/api/v1/jobs/{id}/<name>/): a plugin's job route may not shadow them.
RESERVED_JOB_ROUTES = frozenset({"artifacts", "cancel", "download", "events", "logs", "metrics", "resubmit",
                                 "children", "attempts", "tokens", "participants"})

# The core's own top-level API resources (/api/v1/<name>/): a plugin's collection may not take these names.
# (tests/platform/api/test_reserved_names.py checks this and RESERVED_JOB_ROUTES against the URL map.)
RESERVED_COLLECTIONS = frozenset({"schema", "docs", "redoc", "node", "jobs", "nodes", "devices", "pools", "teams",
                                  "quotas", "tokens", "users", "auth", "plugins", "bench", "health", "participants",
                                  "code", "data", "uploads", "secrets"})


def _load_order(candidates: list[tuple[str, Plugin]]) -> tuple[list[tuple[str, Plugin]], dict[str, str]]:
    """The well-formed manifests in loading order -- every plugin after the plugins it requires, otherwise in
    registration order -- and ``{name: problem}`` for those whose requirements form a cycle (placed where the
    cycle stops the order, so that the plugins requiring them come after them)."""
    index = {plugin.name for _, plugin in candidates}
    needs = {plugin.name: {r.name for r in plugin.requirements() if r.name in index} for _, plugin in candidates}
    order: list[tuple[str, Plugin]] = []
    done: set[str] = set()
    cycles: dict[str, str] = {}
    waiting = list(candidates)
    while waiting:
        ready = next((entry for entry in waiting if needs[entry[1].name] <= done), None)
        if ready is not None:
            waiting.remove(ready)
            order.append(ready)
            done.add(ready[1].name)
            continue
        # Every waiting plugin waits on another waiting one: some of them form cycles.
        stuck = {plugin.name for _, plugin in waiting}
        before = len(waiting)
        for entry in list(waiting):
            cycle = _cycle(entry[1].name, {name: needs[name] & stuck for name in stuck})
            if cycle:
                cycles[entry[1].name] = "its requirements form a cycle: " + " -> ".join(cycle)
                waiting.remove(entry)
                order.append(entry)
                done.add(entry[1].name)
        if len(waiting) == before:  # cannot happen (a stuck set holds a cycle); never loop forever
            order.extend(waiting)
            break
    return order, cycles


def _cycle(start: str, needs: dict[str, set[str]]) -> list[str] | None:
    """A path of requirements from ``start`` back to itself (``[start, ..., start]``), or None."""
    path = [start]
    seen: set[str] = set()

    def walk(name: str) -> bool:
        for required in sorted(needs.get(name, ())):
            if required == start:
                path.append(start)
                return True
            if required in seen:
                continue
            seen.add(required)
            path.append(required)
            if walk(required):
                return True
            path.pop()
        return False

    return path if walk(start) else None


def _requirement_problem(plugin: Plugin, loaded: dict[str, LoadedPlugin], problems: dict[str, str]) -> str | None:
    """Why ``plugin`` cannot load given the plugins loaded so far, or None when every requirement is met."""
    for requirement in plugin.requirements():
        present = loaded.get(requirement.name)
        if present is None:
            if requirement.name in problems:
                return f"it requires plugin {requirement.name!r}, which is left out"
            return f"it requires plugin {requirement.name!r}, which is not installed"
        if not requirement.accepts(present.plugin.version):
            return f"it requires {requirement}, but {requirement.name} is version {present.plugin.version}"
    return None


def _load() -> _State:
    loaded_plugins: dict[str, LoadedPlugin] = {}
    problems: dict[str, str] = {}
    owners: dict[tuple[str, str], str] = {("benchmark", name): "core" for name in RESERVED_BENCHMARKS}
    owners.update({("command", name): "core" for name in RESERVED_COMMANDS})
    owners.update({("job route", name): "core" for name in RESERVED_JOB_ROUTES})
    owners.update({("collection", name): "core" for name in RESERVED_COLLECTIONS})
    owners.update({("data option", "mount"): "core"})  # components.runtime.data.Mounts
    manifests = _manifests()
    # Well-formed manifests load in the order of their requirements (a plugin after those it requires); the
    # others are checked first, in registration order, and left out with their problem.
    candidates: list[tuple[str, Plugin]] = []
    seen: set[str] = set()
    for source, manifest in manifests:
        if isinstance(manifest, Plugin) and not manifest.problems() and manifest.name not in seen:
            seen.add(manifest.name)
            candidates.append((source, manifest))
    order, cycles = _load_order(candidates)
    chosen = {id(manifest) for _, manifest in candidates}
    rest = [(source, manifest) for source, manifest in manifests if id(manifest) not in chosen]
    malformed = [(source, manifest) for source, manifest in rest if not isinstance(manifest, Plugin)
                 or manifest.problems()]
    twice = [entry for entry in rest if entry not in malformed]  # a second manifest of one name: after the first
    queue = malformed + order + twice
    for source, manifest in queue:
        name = getattr(manifest, "name", None) or source
        if isinstance(manifest, Exception):
            problems[source] = f"cannot import the manifest: {type(manifest).__name__}: {manifest}"
            continue
        try:
            if isinstance(manifest, Plugin) and not manifest.problems():
                if manifest.name in cycles:
                    raise ValueError(cycles[manifest.name])
                if missing := _requirement_problem(manifest, loaded_plugins, problems):
                    raise ValueError(missing)
            loaded = _load_plugin(manifest, source)
            if loaded.name in loaded_plugins:
                raise ValueError(f"plugin {loaded.name!r} is registered twice")
            claims = [("kind", kind) for kind in loaded.kinds] + \
                     [("benchmark", bench) for bench in loaded.plugin.benchmarks] + \
                     [("command", command) for command in loaded.commands] + \
                     [("job route", route) for route in loaded.job_routes] + \
                     [("collection", name) for name in loaded.collections] + \
                     [("strategy", name) for name in loaded.strategies] + \
                     [("data option", option) for provider in loaded.data_providers for option in provider.options]
            taken = [f"{what} {value!r} (already {owners[(what, value)]}'s)" for what, value in claims
                     if (what, value) in owners]
            if taken:
                raise ValueError("name clash: " + ", ".join(taken))
        except Exception as error:  # noqa: BLE001 - a broken plugin is left out, never fatal
            problems[str(name)] = f"{type(error).__name__}: {error}"
            log.error("plugin %s (%s) is left out: %s", name, source, problems[str(name)])
            continue
        for claim in claims:
            owners[claim] = loaded.name
        loaded_plugins[loaded.name] = loaded
    # Loaded in the order of their requirements, listed in the order they are registered in.
    plugins: dict[str, LoadedPlugin] = {}
    for _, manifest in manifests:
        loaded = loaded_plugins.get(getattr(manifest, "name", None)) if isinstance(manifest, Plugin) else None
        if loaded is not None and loaded.plugin is manifest:
            plugins[loaded.name] = loaded
    kinds = {kind: spec for loaded in plugins.values() for kind, spec in loaded.kinds.items()}
    return _State(plugins=plugins, problems=problems, kinds=kinds)


def _loaded() -> _State:
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = _load()
    return _state


def reload() -> None:
    """Forget the frozen registry (tests that install a plugin at run time)."""
    global _state
    with _lock:
        _state = None


def plugins() -> dict[str, LoadedPlugin]:
    """Every plugin that passed its checks, by name; loaded on first call, then frozen."""
    return _loaded().plugins


def problems() -> dict[str, str]:
    """Plugins left out, and why."""
    return dict(_loaded().problems)


def kinds() -> dict[str, KindSpec]:
    """All registered job kinds (frozen: the same dict on every call)."""
    return _loaded().kinds


def kind_plugin(kind: str) -> str | None:
    """The name of the plugin that contributes ``kind``."""
    return next((loaded.name for loaded in plugins().values() if kind in loaded.kinds), None)


def get_kind(kind: str) -> KindSpec:
    registered = kinds()
    if kind not in registered:
        raise UnknownKind(kind, sorted(registered))
    return registered[kind]


def panels(placement: str) -> list[tuple[str | None, str, type | None, str | None]]:
    """``(kind, path, Panel class, None)`` for every panel contributed to ``placement`` ("job" or "cluster").

    ``kind`` is the kind whose ``KindSpec.panels`` lists the panel (a job panel shown only on that kind's jobs),
    or None for a panel a plugin contributes for every kind (its ``applies`` decides). Broken plugins never
    reach this list (:func:`problems`)."""
    found: list[tuple[str | None, str, type | None, str | None]] = []
    seen: set[tuple[str | None, str]] = set()
    for loaded in plugins().values():
        owned = {path: kind for kind, spec in loaded.kinds.items() for path in spec.panels}
        for path, panel_class in loaded.panels:
            if panel_class.placement != placement:
                continue
            kind = None if path in loaded.plugin.panels else owned.get(path)
            if (kind, path) not in seen:
                seen.add((kind, path))
                found.append((kind, path, panel_class, None))
    return found


def report_schema(plugin: str) -> ReportSchema | None:
    """The report schema of ``plugin``, or None when it has none (or is not registered)."""
    loaded = plugins().get(plugin)
    return loaded.report if loaded else None


def hooks(kind_of: type | None = None) -> list[Any]:
    """Every plugin's scheduler hooks (instances), optionally only those that are instances of ``kind_of``."""
    found = [hook for loaded in plugins().values() for hook in loaded.hooks]
    return [hook for hook in found if kind_of is None or isinstance(hook, kind_of)]


def subscribers() -> list[Any]:
    """Every plugin's lifecycle subscribers."""
    return [subscriber for loaded in plugins().values() for subscriber in loaded.subscribers]


def commands() -> dict[str, type]:
    """CLI verbs plugins add: ``{name: Command class}``."""
    return {name: command for loaded in plugins().values() for name, command in loaded.commands.items()}


def node_services() -> list[tuple[str, str]]:
    """``(plugin, "module:Class")`` of every node service (imported by the node agent, not here)."""
    return [(loaded.name, path) for loaded in plugins().values() for path in loaded.plugin.node_services]


def job_routes() -> dict[str, Any]:
    """Plugins' read-only job sub-resources: ``{name: function(data) -> JSON}``."""
    return {name: function for loaded in plugins().values() for name, function in loaded.job_routes.items()}


def collections() -> dict[str, Any]:
    """Plugins' collections of named records: ``{name: Collection}`` (served at ``/api/v1/{name}/``)."""
    return {name: collection for loaded in plugins().values() for name, collection in loaded.collections.items()}


def data_providers() -> list[Any]:
    """Every plugin's prepared-data providers (:class:`components.runtime.data.DataProvider` instances)."""
    return [provider for loaded in plugins().values() for provider in loaded.data_providers]


def strategies() -> dict[str, Any]:
    """Plugins' distributed-training strategies: ``{name: components.runtime.distributed.Strategy}``."""
    return {name: strategy for loaded in plugins().values() for name, strategy in loaded.strategies.items()}


def metrics() -> dict[str, Any]:
    """Plugins' node metrics functions: ``{plugin: function(report) -> Iterable[plugins.Sample]}``."""
    return {loaded.name: loaded.metrics for loaded in plugins().values() if loaded.metrics is not None}


def benchmarks() -> dict[str, str]:
    """The plugins' benchmarks: ``{name: "module:main"}`` (``strata bench`` adds the core's own)."""
    found: dict[str, str] = {}
    for loaded in plugins().values():
        found.update(loaded.plugin.benchmarks)
    return found


def load_component(kind: str):
    """Import and instantiate the heavy component class of ``kind`` (on a node only)."""
    return import_path(get_kind(kind).component)()
