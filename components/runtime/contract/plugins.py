"""The plugin manifest: what one plugin contributes to Strata, by named seam.

Every research system is a plugin: a package with one :class:`Plugin` manifest, registered either in the
built-in list (:data:`components.runtime.contract.registry.BUILTIN_PLUGINS`) or, for outside packages, through the
``strata.plugins`` entry-point group, whose value points at the manifest object::

    [project.entry-points."strata.plugins"]
    hello = "strata_hello.plugin:PLUGIN"

A manifest names its parts as ``"package.module:attribute"`` paths, never as imported objects, so that
reading it costs nothing: the control plane imports only the *light* parts (kinds, panels, report schemas,
scheduler hooks, lifecycle subscribers, CLI commands) and never torch, hivemind or grpc; a node imports the
heavy ones (components, node services) and a benchmark is imported only when it is run.

What each seam's path points at, whether it is light, who reads it, how the registry checks and joins it and its
conformance suite is the seam's row of :data:`SEAMS`, the one table the registry, the manifest's checker and the
docs (``make docs``) read.

The registry (:mod:`components.runtime.contract.registry`) reads every manifest once, checks it, and freezes the result.
A plugin whose manifest or light parts are broken is left out whole, with its problem recorded
(:func:`components.runtime.contract.registry.problems`): it costs its own parts, never the platform.
"""

from __future__ import annotations

import abc
import argparse
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
"""Plugin, kind, benchmark and command names: lower case, digits and dashes, starting with a letter."""
VERSION_RE = re.compile(r"^\d+(\.\d+)*$")
"""A plugin's version: dotted whole numbers (``1``, ``0.1.0``)."""
REQUIREMENT_RE = re.compile(r"^(?P<name>[a-z][a-z0-9-]{0,39})\s*(?P<range>(?:(?:>=|<=|==|!=|>|<)\s*\d+(?:\.\d+)*"
                            r"\s*,?\s*)*)$")
"""One entry of :attr:`Plugin.requires`: a plugin name, then an optional version range (``base``,
``base>=0.1``, ``base>=0.1,<1``)."""
_COMPARISONS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
                "!=": lambda a, b: a != b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}


def version_key(version: str) -> tuple[int, ...]:
    """A version as a comparable tuple, trailing zeros dropped (``1.0`` is ``1``)."""
    parts = [int(part) for part in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


@dataclass(frozen=True)
class Requirement:
    """A parsed entry of :attr:`Plugin.requires`: the plugin ``name`` and the ``(operator, version)`` bounds its
    version must satisfy (none: any version)."""

    name: str
    bounds: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Requirement:
        match = REQUIREMENT_RE.match(text.strip()) if isinstance(text, str) else None
        if not match:
            raise ValueError(f"requirement {text!r} must be a plugin name with an optional version range, "
                             "e.g. 'name' or 'name>=1.0,<2'")
        bounds = tuple(re.findall(r"(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)", match.group("range")))
        return cls(match.group("name"), bounds)

    def accepts(self, version: str) -> bool:
        """True when ``version`` is within every bound."""
        return all(_COMPARISONS[op](version_key(version), version_key(bound)) for op, bound in self.bounds)

    def __str__(self) -> str:
        return self.name + ",".join(op + bound for op, bound in self.bounds)


@dataclass(frozen=True)
class Seam:
    """One row of the seam table (:data:`SEAMS`): what a manifest field names and how the registry reads it.

    * ``shape``: ``"paths"`` (a tuple of paths), ``"mapping"`` (``{name: path}``) or ``"path"`` (one path or None);
    * ``make``: what the registry keeps of each path -- ``"instance"`` (a ``base`` subclass, instantiated with no
      arguments, or a ready ``base`` instance), ``"class"`` (a ``base`` subclass), ``"function"`` (a function, not
      a class), ``"callable"`` (anything callable) or ``"path"`` (heavy: kept as the path, imported where it runs);
    * ``check``: a ``"module:function"`` taking ``(part, path, name)`` that raises ``TypeError`` or ``ValueError``
      on what the base class cannot say (and may complete the part, e.g. give a collection its name);
    * ``named``: the namespace the part's names claim (two plugins, or a plugin and the core, may not claim one
      name); the names are the mapping's keys, or ``name_from``, an attribute of the part (a string or strings);
    * ``combine``: how the registry joins the plugins' parts (:func:`components.runtime.contract.registry.contributions`):
      ``"list"`` (every part, plugins in order), ``"by name"`` (``{name: part}``) or ``"by plugin"``
      (``{plugin: part}``);
    * ``suite``: the conformance suite of the seam (``components.runtime.testing.conformance``), or None.

    Adding a seam is one row here, the manifest field that :func:`seam_field` makes for it, and its suite.
    """

    name: str
    shape: str
    points_at: str
    light: bool | str
    read_by: str
    make: str = "instance"
    base: str | None = None
    check: str | None = None
    named: str | None = None
    name_from: str | None = None
    combine: str = "list"
    suite: str | None = None


SHAPES = ("paths", "mapping", "path")
MAKES = ("instance", "class", "function", "callable", "path")
COMBINES = ("list", "by name", "by plugin")

SEAMS: tuple[Seam, ...] = (
    Seam("kinds", "paths", "a `KindSpec` subclass (`components/runtime/contract/spec.py`): one job kind", True,
         "API, web UI, nodes", base="components.runtime.contract.spec:KindSpec", check="components.runtime.contract.spec:check_kind",
         named="kind", name_from="kind", combine="by name", suite="components.runtime.testing.conformance.kinds"),
    Seam("panels", "paths", "a `Panel` subclass (`components/runtime/contract/panels.py`), job or cluster placement; its "
         "`kinds` limit a job panel to those kinds", True, "web UI", make="class",
         base="components.runtime.contract.panels:Panel", suite="components.runtime.testing.conformance.panels"),
    Seam("reports", "path", "a `ReportSchema` subclass (`components/runtime/contract/plugins.py`): the plugin's reports, "
         "and its node metrics (`metrics(report)`)", True, "API (heartbeats, attempt reports), node agent "
         "(`/metrics`)", base="components.runtime.contract.plugins:ReportSchema", combine="by plugin",
         suite="components.runtime.testing.conformance.reports"),
    Seam("hooks", "paths", "a scheduler policy class (`components/runtime/contract/policies.py`)", True, "scheduler",
         base="components.runtime.contract.policies:Policy", suite="components.runtime.testing.conformance.policies"),
    Seam("subscribers", "paths", "a callable taking a lifecycle event (`components/runtime/contract/events.py`)", True,
         "control plane", make="callable"),
    Seam("commands", "paths", "a `Command` subclass (`components/runtime/contract/plugins.py`): one `strata` verb", True,
         "CLI", make="class", base="components.runtime.contract.plugins:Command",
         check="components.runtime.contract.plugins:check_command", named="command", name_from="name", combine="by name"),
    Seam("node_services", "paths", "a `NodeService` subclass (`components/runtime/contract/services.py`)", False,
         "node agent", make="path", suite="components.runtime.testing.conformance.services"),
    Seam("data_providers", "paths", "a `DataProvider` subclass (`components/runtime/contract/data.py`): options of a "
         "spec's `data`", True, "API (spec check), the job's process", base="components.runtime.contract.data:DataProvider",
         check="components.runtime.contract.data:check_provider", named="data option", name_from="options",
         suite="components.runtime.testing.conformance.data"),
    Seam("strategies", "paths", "a `Strategy` subclass (`components/runtime/contract/distributed.py`); its `runtime` names "
         "the node-side `StrategyRuntime`", "yes (the runtime: no)", "API (spec check); the runtime: the job's "
         "ranks", base="components.runtime.contract.distributed:Strategy",
         check="components.runtime.contract.distributed:check_strategy", named="strategy", name_from="name",
         combine="by name", suite="components.runtime.testing.conformance.strategies"),
    Seam("benchmarks", "mapping", "`{name: \"module:main\"}`, `main(quick, output) -> int`", False,
         "`strata bench NAME`", make="path", named="benchmark", combine="by name"),
    Seam("job_routes", "mapping", "`{name: \"module:function\"}`, `function(data: PanelData) -> JSON`: "
         "`GET /api/v1/jobs/{id}/{name}/`", True, "API", make="callable",
         check="components.runtime.contract.collections:check_job_route", named="job route", combine="by name",
         suite="components.runtime.testing.conformance.job_routes"),
    Seam("collections", "mapping", "`{name: \"module:Class\"}`, a `Collection` subclass "
         "(`components/runtime/contract/collections.py`): `/api/v1/{name}/`", True, "API, CLI",
         base="components.runtime.contract.collections:Collection", check="components.runtime.contract.collections:check_collection",
         named="collection", combine="by name", suite="components.runtime.testing.conformance.collections"),
)
"""The seam table: every seam of the manifest, in order. The registry's loader, the manifest's checker, the
docs' seam table (``make docs``) and ``strata plugins`` read it."""


def seam(name: str) -> Seam:
    """The row of seam ``name``."""
    return next(row for row in SEAMS if row.name == name)


def seam_field(name: str) -> Any:
    """The :class:`Plugin` field of seam ``name``: an empty tuple, an empty mapping or None by its shape."""
    shape = seam(name).shape
    if shape == "mapping":
        return field(default_factory=dict, metadata={"seam": name})
    return field(default=() if shape == "paths" else None, metadata={"seam": name})


def seams() -> list[tuple[str, dict[str, Any]]]:
    """Every seam as ``(name, its row as a dict)``, in the table's order."""
    return [(row.name, dict(vars(row))) for row in SEAMS]


def check_command(command: type[Command], path: str, name: str | None) -> None:
    """A command needs a name (the registry checks that it is unique)."""
    named = getattr(command, "name", None)
    if not isinstance(named, str) or not NAME_RE.match(named):
        raise ValueError(f"{path}: a command needs a name matching {NAME_RE.pattern}")


@dataclass(frozen=True)
class Plugin:
    """One plugin's manifest. Every value is a ``"module:attribute"`` path (see the module docstring)."""

    name: str
    description: str = ""
    # The plugin's version, dotted whole numbers; plugins that require this one may bound it.
    version: str = "0"
    # The plugins this one imports or builds on, by name, each with an optional version range
    # ("base", "base>=0.1,<1"): the registry loads them first and leaves this plugin out when one is missing,
    # left out or outside its range. The only plugin-to-plugin imports allowed (pyproject.toml's import contracts).
    requires: tuple[str, ...] = ()
    # The seams: see SEAMS for what each path points at. Job routes are read-only job sub-resources,
    # ``GET /api/v1/jobs/{id}/{name}/`` answering ``function(data)`` as JSON, where ``data`` is the viewer's
    # PanelData of the job; the function may carry ``function.schema``, the JSON Schema (2020-12) of its answer,
    # which the served OpenAPI schema declares for the route's own path. Collections are team-owned named
    # records served at ``/api/v1/{name}/``.
    kinds: tuple[str, ...] = seam_field("kinds")
    panels: tuple[str, ...] = seam_field("panels")
    reports: str | None = seam_field("reports")
    hooks: tuple[str, ...] = seam_field("hooks")
    subscribers: tuple[str, ...] = seam_field("subscribers")
    commands: tuple[str, ...] = seam_field("commands")
    node_services: tuple[str, ...] = seam_field("node_services")
    data_providers: tuple[str, ...] = seam_field("data_providers")
    strategies: tuple[str, ...] = seam_field("strategies")
    benchmarks: Mapping[str, str] = seam_field("benchmarks")
    job_routes: Mapping[str, str] = seam_field("job_routes")
    collections: Mapping[str, str] = seam_field("collections")

    def paths(self) -> list[tuple[str, str]]:
        """Every ``(seam, path)`` this manifest names."""
        found: list[tuple[str, str]] = []
        for row in SEAMS:
            value = getattr(self, row.name)
            if row.shape == "paths":
                found.extend((row.name, path) for path in value)
            elif row.shape == "mapping":
                found.extend((row.name, path) for path in value.values())
            elif value:
                found.append((row.name, value))
        return found

    def requirements(self) -> list[Requirement]:
        """:attr:`requires`, parsed (call on a manifest whose :meth:`problems` are none)."""
        return [Requirement.parse(text) for text in self.requires]

    def problems(self) -> list[str]:
        """What is malformed in the manifest itself (names and path shapes), without importing anything."""
        problems = []
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            problems.append(f"name {self.name!r} must match {NAME_RE.pattern}")
        for row in SEAMS:
            value = getattr(self, row.name)
            if row.shape == "paths" and (isinstance(value, str) or not isinstance(value, tuple | list)):
                problems.append(f"{row.name} must be a tuple of 'module:attribute' paths")
            elif row.shape == "mapping":
                if not isinstance(value, Mapping):
                    problems.append(f"{row.name} must map a name to a 'module:attribute' path")
                    continue
                for name in value:
                    if not isinstance(name, str) or not NAME_RE.match(name):
                        problems.append(f"{row.name[:-1].replace('_', ' ')} name {name!r} must match "
                                        f"{NAME_RE.pattern}")
            elif row.shape == "path" and value is not None and not isinstance(value, str):
                problems.append(f"{row.name} must be a 'module:attribute' path or None")
        if not isinstance(self.version, str) or not VERSION_RE.match(self.version):
            problems.append(f"version {self.version!r} must be dotted whole numbers, e.g. '1.0'")
        if isinstance(self.requires, str) or not isinstance(self.requires, tuple | list):
            problems.append("requires must be a tuple of plugin names (each with an optional version range)")
        else:
            for text in self.requires:
                try:
                    requirement = Requirement.parse(text)
                except ValueError as error:
                    problems.append(str(error))
                    continue
                if requirement.name == self.name:
                    problems.append(f"a plugin cannot require itself ({text!r})")
        if problems:
            return problems
        for seam, path in self.paths():
            if not isinstance(path, str) or not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", path):
                problems.append(f"{seam}: {path!r} is not a 'module:attribute' path")
        return problems


METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
"""A valid Prometheus metric name."""
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
"""A valid Prometheus label name (``__``-prefixed ones are reserved)."""
SAMPLE_KINDS = ("gauge", "counter")


def metric_prefix(plugin: str) -> str:
    """The prefix every metric of ``plugin`` carries: ``strata_<plugin>_`` (dashes become underscores)."""
    return f"strata_{plugin.replace('-', '_')}_"


@dataclass(frozen=True)
class Sample:
    """One metric sample a plugin's report schema yields (see :meth:`ReportSchema.metrics`).

    ``name`` is the full Prometheus name, prefixed ``strata_<plugin>_``; a ``counter``'s ends in ``_total``.
    ``labels`` are string pairs (the node agent adds ``node``); ``value`` a finite number. Samples of one name
    share ``kind``, ``help`` and label names."""

    name: str
    value: float
    help: str = ""
    kind: str = "gauge"  # "gauge" or "counter"
    labels: Mapping[str, str] = field(default_factory=dict)


def sample_problems(plugin: str, samples: list[Any]) -> list[str]:
    """What is wrong with ``samples`` of ``plugin`` (empty when they are all valid); pure and cheap."""
    import math

    problems: list[str] = []
    prefix = metric_prefix(plugin)
    shapes: dict[str, tuple[str, tuple[str, ...]]] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for sample in samples:
        if not isinstance(sample, Sample):
            problems.append(f"{sample!r} is not a components.runtime.contract.plugins.Sample")
            continue
        name = sample.name
        if not isinstance(name, str) or not METRIC_NAME_RE.match(name) or not name.startswith(prefix):
            problems.append(f"{name!r} is not a Prometheus name starting {prefix!r}")
            continue
        if sample.kind not in SAMPLE_KINDS:
            problems.append(f"{name}: kind {sample.kind!r} is not one of {', '.join(SAMPLE_KINDS)}")
        elif sample.kind == "counter" and (not name.endswith("_total") or name == prefix + "total"):
            problems.append(f"{name}: a counter's name ends in '_total'")
        elif sample.kind == "gauge" and name.endswith(("_total", "_created", "_bucket", "_count", "_sum")):
            problems.append(f"{name}: a gauge's name may not end in a reserved suffix")
        if not isinstance(sample.help, str):
            problems.append(f"{name}: help must be a string")
        value = sample.value
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(f"{name}: value {value!r} is not a finite number")
        elif sample.kind == "counter" and value < 0:
            problems.append(f"{name}: a counter is never negative ({value!r})")
        labels = sample.labels
        if not isinstance(labels, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            problems.append(f"{name}: labels must map str to str")
            continue
        bad = [k for k in labels if not LABEL_NAME_RE.match(k) or k.startswith("__") or k == "node"]
        if bad:
            problems.append(f"{name}: bad label name(s) {', '.join(map(repr, bad))} ('node' is the agent's)")
        shape = (sample.kind, tuple(sorted(labels)))
        if shapes.setdefault(name, shape) != shape:
            problems.append(f"{name}: every sample of one name needs the same kind and label names")
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            problems.append(f"{name}: the same labels {dict(labels)!r} twice")
        seen.add(key)
    clash = sorted(name for name, (kind, _) in shapes.items() if kind == "counter" and shapes.get(name[:-6]))
    problems.extend(f"{name}: a counter and a gauge {name[:-6]!r} share one name" for name in clash)
    return problems


class ReportError(ValueError):
    """A plugin report failed its schema. ``errors`` maps a dotted field path to a message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name}: {message}" for name, message in self.errors.items()))


class ReportSchema:
    """The light schema of what a plugin reports through the generic report channel.

    Heartbeats carry ``reports: {plugin: payload}`` for the node (:meth:`node`), and attempt reports carry
    ``reports: {plugin: payload}`` for one attempt (:meth:`attempt`). The control plane validates each payload
    with its plugin's schema, stores what is returned, and answers a 400 naming the fields a schema refused.
    Validation must be pure and cheap: it runs on every heartbeat.
    """

    def node(self, payload: Any) -> dict[str, Any]:
        """The normalized node-level payload, or raise :class:`ReportError`. By default nodes report nothing."""
        raise ReportError({"": "this plugin takes no node reports"})

    def attempt(self, payload: Any) -> dict[str, Any]:
        """The normalized attempt-level payload, or raise :class:`ReportError`."""
        raise ReportError({"": "this plugin takes no attempt reports"})

    def parts(self, payload: dict[str, Any]) -> ReportParts:
        """How the control plane stores a node payload that :meth:`node` returned: what to keep as the node's
        latest report, each device's and each attempt's latest report, and the rows to append to the plugin's
        time series. Pure and cheap like :meth:`node`. By default the whole payload is the node's report."""
        return ReportParts(node=payload)

    def metrics(self, report: dict[str, Any]) -> Iterable[Sample]:
        """The plugin's own Prometheus samples on the node's ``/metrics`` (:mod:`components.runtime.node.metrics`),
        named ``strata_<plugin>_...``, from its latest node-services report (what its services' ``report()`` sent
        with the last heartbeat, merged). Light and cheap: it runs in the scrape's thread. None by default."""
        return ()

    @classmethod
    def has_metrics(cls) -> bool:
        """True when the schema overrides :meth:`metrics`."""
        return cls.metrics is not ReportSchema.metrics


@dataclass
class ReportParts:
    """One node payload of a plugin, split for storage (see :meth:`ReportSchema.parts`). Indexes are the node's
    device indexes and attempts are attempt ids (strings); the control plane drops what names a device the node
    does not have or an attempt not placed on the node.

    * ``node``: kept as the node's latest report of the plugin (None keeps nothing);
    * ``devices``: ``{index: payload}``, each device's latest report (a device of the node left out, or every
      device when the plugin does not report in a heartbeat, loses its report: it has nothing to say now);
    * ``attempts``: ``[{"attempt", "device" (index or None), "memory" (bytes measured or None), "payload"}]``:
      each attempt's latest report; ``memory`` is the device memory the attempt was measured to use, which
      the scheduler reserves for the job's next attempt;
    * ``series``: ``[{"start", "end" (unix s), "device" (index or None), "attempt" (id or None), "data"}]``:
      rows appended to the plugin's time series (kept as long as raw telemetry); rows of a device that start
      before the end of the last row stored for it (a retried heartbeat) are not stored twice.
    """

    node: dict[str, Any] | None = None
    devices: dict[int, dict[str, Any]] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)


class Command(abc.ABC):
    """One ``strata`` CLI verb a plugin adds (``strata <name> ...``).

    The class is light: :meth:`arguments` only declares argparse arguments, and :meth:`run` does the work and
    may import heavy modules. It returns the exit code; a ``ValueError`` or ``OSError`` it raises is printed by
    the CLI as one line (``strata: error: ...``), like the built-in verbs' errors. ``client`` is the configured
    :class:`components.runtime.client.client.ControlPlaneClient`-like REST client of the CLI (or None when the verb
    sets ``needs_server = False``).
    """

    name: ClassVar[str]
    help: ClassVar[str] = ""
    needs_server: ClassVar[bool] = True

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this verb's arguments to its sub-parser (none by default)."""
        return None

    @abc.abstractmethod
    def run(self, args: argparse.Namespace, client: Any) -> int:
        """Run the verb."""
