"""The lazy, frozen plugin registry.

Plugins (:class:`components.runtime.contract.plugins.Plugin` manifests) come from :data:`BUILTIN_PLUGINS` and from the
``strata.plugins`` entry-point group; outside packages that only add a job kind may still use the older
``strata.components`` group (a :class:`~components.runtime.contract.spec.KindSpec` path, read as a one-kind plugin).

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

from components.runtime.contract.plugins import SEAMS, Plugin, ReportSchema, Seam
from components.runtime.contract.spec import KindSpec

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
    """A checked plugin: its manifest, where it came from, and its parts by seam (:data:`SEAMS`).

    ``parts[seam]`` is, for a ``"path"`` seam, its part or None; for a named seam (``named``), ``{name: part}``;
    otherwise ``{path: part}``. A part is what the seam's ``make`` keeps (an instance, a class, a function, or the
    path itself for a heavy seam). ``loaded.<seam>`` reads ``parts[seam]``.
    """

    plugin: Plugin
    source: str
    parts: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.plugin.name

    def __getattr__(self, seam: str) -> Any:
        parts = self.__dict__.get("parts")
        if parts is not None and seam in parts:
            return parts[seam]
        raise AttributeError(seam)


@dataclass(frozen=True)
class _State:
    plugins: dict[str, LoadedPlugin]
    problems: dict[str, str]  # plugin name (or its source) -> why it was left out
    kinds: dict[str, KindSpec]


_lock = threading.Lock()
_state: _State | None = None


def _make(row: Seam, path: str) -> Any:
    """What seam ``row`` keeps of ``path`` (its ``make``), checked against its ``base``."""
    if row.make == "path":
        return path
    value = import_path(path)
    base = import_path(row.base) if row.base else None
    if row.make in ("instance", "class") and base is not None:
        if isinstance(value, type) and issubclass(value, base):
            return value() if row.make == "instance" else value
        if row.make == "instance" and isinstance(value, base):
            return value
        raise TypeError(f"{path} is not a {base.__name__} subclass ({base.__module__}.{base.__name__})")
    if not callable(value) or (row.make == "function" and isinstance(value, type)):
        raise TypeError(f"{path} is not {'a function' if row.make == 'function' else 'callable'}")
    return value


def _names(row: Seam, name: str | None, part: Any) -> list[str]:
    """The names ``part`` claims in seam ``row``'s namespace."""
    if row.shape == "mapping" or row.name_from is None:
        return [name] if name else []
    value = getattr(part, row.name_from, None)
    names = [value] if isinstance(value, str) else sorted(value) if isinstance(value, set | frozenset) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"{row.name}: {part!r} has no {row.name_from} to be named by")
    return list(names)


def _load_seam(row: Seam, value: Any) -> Any:
    """Seam ``row`` of a manifest, imported and checked: its entry of :attr:`LoadedPlugin.parts`."""
    if row.shape == "path":
        if not value:
            return None
        part = _make(row, value)
        if row.check:
            import_path(row.check)(part, value, None)
        return part
    entries = value.items() if row.shape == "mapping" else [(None, path) for path in value]
    found: dict[str, Any] = {}
    for name, path in entries:
        part = _make(row, path)
        if row.check:
            import_path(row.check)(part, path, name)
        keys = _names(row, name, part) if row.named and row.shape == "paths" and row.combine == "by name" else \
            [name if name is not None else path]
        for key in keys:
            if key in found:
                raise ValueError(f"{row.named or row.name} {key!r} is named twice")
            found[key] = part
    return found


def _load_plugin(plugin: Plugin, source: str) -> LoadedPlugin:
    if not isinstance(plugin, Plugin):
        raise TypeError(f"{source} is not a components.runtime.contract.plugins.Plugin")
    problems = plugin.problems()
    if problems:
        raise ValueError("; ".join(problems))
    return LoadedPlugin(plugin=plugin, source=source,
                        parts={row.name: _load_seam(row, getattr(plugin, row.name)) for row in SEAMS})


def _claims(loaded: LoadedPlugin) -> list[tuple[str, str]]:
    """``(namespace, name)`` of every name ``loaded`` claims (:attr:`Seam.named`)."""
    claims: list[tuple[str, str]] = []
    for row in SEAMS:
        if not row.named:
            continue
        parts = loaded.parts[row.name]
        if row.shape == "mapping" or row.combine == "by name":
            claims.extend((row.named, name) for name in parts)
        else:
            claims.extend((row.named, name) for key, part in parts.items() for name in _names(row, key, part))
    return claims


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
                               "data", "migrate", "check", "secrets", "artifacts", "compare", "login", "tracking",
                               "webhooks", "notifier", "usage", "audit", "members"})
# The core's own benchmarks (strata.cli.bench): a plugin may not take these names either.
RESERVED_BENCHMARKS = frozenset({"control-plane", "dashboard"})
# The core's own job sub-resources (/api/v1/jobs/{id}/<name>/): a plugin's job route may not shadow them.
RESERVED_JOB_ROUTES = frozenset({"artifacts", "cancel", "download", "events", "logs", "metrics", "resubmit",
                                 "children", "attempts", "tokens", "participants"})

# The core's own top-level API resources (/api/v1/<name>/): a plugin's collection may not take these names.
# (tests/platform/api/test_reserved_names.py checks this and RESERVED_JOB_ROUTES against the URL map.)
RESERVED_COLLECTIONS = frozenset({"schema", "docs", "redoc", "node", "jobs", "nodes", "devices", "pools", "teams",
                                  "quotas", "tokens", "users", "auth", "plugins", "bench", "health", "participants",
                                  "code", "data", "uploads", "secrets", "compare", "logs", "tracking", "usage", "audit",
                                  "webhooks", "email-subscriptions", "eta"})


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
    owners.update({("data option", "mount"): "core"})  # components.runtime.contract.data.Mounts
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
            claims = _claims(loaded)
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
        found = loaded_plugins.get(manifest.name) if isinstance(manifest, Plugin) else None
        if found is not None and found.plugin is manifest:
            plugins[found.name] = found
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


def contributions(seam: str) -> Any:
    """Every plugin's parts of ``seam``, joined by the seam's ``combine`` rule: a list (plugins in order), a
    ``{name: part}`` mapping, or ``{plugin: part}`` for the plugins that have one."""
    row = next(row for row in SEAMS if row.name == seam)
    loaded_plugins = plugins().values()
    if row.combine == "by plugin":
        return {loaded.name: loaded.parts[seam] for loaded in loaded_plugins if loaded.parts[seam] is not None}
    if row.combine == "by name":
        return {name: part for loaded in loaded_plugins for name, part in loaded.parts[seam].items()}
    return [part for loaded in loaded_plugins for part in loaded.parts[seam].values()]


def panels(placement: str) -> list[tuple[str | None, str, type | None, str | None]]:
    """``(kind, path, Panel class, None)`` for every panel contributed to ``placement`` ("job" or "cluster").

    ``kind`` is one of the kinds the panel's ``kinds`` names (a job panel shown only on that kind's jobs; one
    entry per kind), or None for a panel of every kind (its ``applies`` decides). Broken plugins never reach this
    list (:func:`problems`)."""
    found: list[tuple[str | None, str, type | None, str | None]] = []
    for loaded in plugins().values():
        for path, panel_class in loaded.panels.items():
            if panel_class.placement == placement:
                found.extend((kind, path, panel_class, None) for kind in (panel_class.kinds or (None,)))
    return found


def report_schema(plugin: str) -> ReportSchema | None:
    """The report schema of ``plugin``, or None when it has none (or is not registered)."""
    loaded = plugins().get(plugin)
    return loaded.reports if loaded else None


def hooks(kind_of: type | None = None) -> list[Any]:
    """Every plugin's scheduler hooks (instances), optionally only those that are instances of ``kind_of``."""
    return [hook for hook in contributions("hooks") if kind_of is None or isinstance(hook, kind_of)]


def subscribers() -> list[Any]:
    """Every plugin's lifecycle subscribers."""
    return contributions("subscribers")


def commands() -> dict[str, type]:
    """CLI verbs plugins add: ``{name: Command class}``."""
    return contributions("commands")


def node_services() -> list[tuple[str, str]]:
    """``(plugin, "module:Class")`` of every node service (imported by the node agent, not here)."""
    return [(loaded.name, path) for loaded in plugins().values() for path in loaded.node_services]


def job_routes() -> dict[str, Any]:
    """Plugins' read-only job sub-resources: ``{name: function(data) -> JSON}``."""
    return contributions("job_routes")


def progress_route(kind: str) -> tuple[str, Any] | None:
    """``(route name, Progress)`` of the job route that gives jobs of ``kind`` a live table in ``strata submit
    --wait`` (:class:`components.runtime.contract.collections.Progress`), or None."""
    for name, function in sorted(job_routes().items()):
        progress = getattr(function, "progress", None)
        if progress is not None and kind in progress.kinds:
            return name, progress
    return None


def collections() -> dict[str, Any]:
    """Plugins' collections of named records: ``{name: Collection}`` (served at ``/api/v1/{name}/``)."""
    return contributions("collections")


def data_providers() -> list[Any]:
    """Every plugin's prepared-data providers (:class:`components.runtime.contract.data.DataProvider` instances)."""
    return contributions("data_providers")


def strategies() -> dict[str, Any]:
    """Plugins' distributed-training strategies: ``{name: components.runtime.contract.distributed.Strategy}``."""
    return contributions("strategies")


def metrics() -> dict[str, Any]:
    """Plugins' node metrics: ``{plugin: metrics(report) -> Iterable[plugins.Sample]}``, from every report schema
    that overrides :meth:`ReportSchema.metrics`."""
    return {name: schema.metrics for name, schema in contributions("reports").items() if schema.has_metrics()}


def benchmarks() -> dict[str, str]:
    """The plugins' benchmarks: ``{name: "module:main"}`` (``strata bench`` adds the core's own)."""
    return contributions("benchmarks")


def load_component(kind: str):
    """Import and instantiate the heavy component class of ``kind`` (on a node only)."""
    return import_path(get_kind(kind).component)()
