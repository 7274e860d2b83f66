"""Dashboard panels that components contribute to the job detail and cluster pages.

A component lists its panels on its light :class:`~components.runtime.contract.spec.KindSpec` as ``panels``, a tuple of
``"module:Class"`` paths to :class:`Panel` subclasses. Panel modules are light like spec modules (no torch, no
hivemind): the control plane imports them when it renders a page. A panel never touches the database; the
dashboard hands it a :class:`PanelData` reader scoped to what the viewer may see.

The dashboard shows a panel's title and draws what :meth:`Panel.render` returns, one of:

* ``{"figure": {...}}``: a plotly figure as JSON (``data`` and ``layout``), drawn with the bundled plotly.js;
* ``{"table": {"columns": [...], "rows": [[...], ...]}}``: a table of plain values;
* ``{"figure": {...}, "table": {...}}``: both, the table below the figure;
* ``{"text": "..."}``: a line of plain text (escaped when shown);
* ``None``: nothing to show for this job or cluster right now (the panel is hidden).
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar, Literal

Placement = Literal["job", "cluster"]


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (recursively through dicts and lists): what a
    panel returns becomes valid JSON this way."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


class PanelData(abc.ABC):
    """What a panel may read. The dashboard implements it over the database, scoped to the viewer."""

    job: dict[str, Any] | None
    """For job panels: the job as the API shows it (id, kind, state, spec, resources, attempts...)."""

    @abc.abstractmethod
    def metrics(self, names: list[str] | None = None) -> dict[str, list[tuple[int, float, float]]]:
        """The job's metric series, ``name -> [(step, value, unix time), ...]`` in step order."""

    @abc.abstractmethod
    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The job's events (``time`` as unix seconds, ``kind``, ``message``, ``data``), oldest first."""

    @abc.abstractmethod
    def devices(self) -> list[dict[str, Any]]:
        """The cluster's devices: ``id``, ``node``, ``index``, ``kind``, ``memory_total``, ``utilization``,
        ``memory_used`` and ``allocations``: the jobs holding a share of it now. Jobs of teams the viewer may
        see carry ``job_id``, ``job_name``, ``team``, ``owner``, ``kind``, ``state``, ``rank``, ``share`` and
        ``memory``; other teams' jobs appear only as ``{"foreign": True, "share", "memory"}``."""

    def reports(self, plugin: str, device_ids: list[int] | None = None, since: float | None = None,
                job_id: str | None = None) -> dict[str, Any]:
        """The generic report channel: what ``plugin`` reported, as its ``ReportSchema`` normalized and split it
        (``components.runtime.contract.plugins.ReportParts``), scoped to the viewer. Returns::

            {"nodes":    [{"node", "node_id", "time", "payload"}],
             "devices":  [{"id", "node", "index", "kind", "time", "payload"}],
             "attempts": [{"attempt", "number", "job_id", "job_name", "foreign", "device", "time", "current",
                           "payload"}],
             "series":   [{"device", "attempt", "job_id", "job_name", "foreign", "start", "end", "data"}]}

        ``nodes`` and ``devices`` are each node's and device's latest report (machines: every viewer sees them).
        ``attempts`` are the latest reports about attempts: without ``job_id``, those of the latest node reports
        (``current``); with ``job_id``, every attempt of that job (nothing when the viewer may not see it).
        ``series`` are the plugin's time-series rows, oldest first (the newest few thousand), with ``job_id``
        only that job's. An attempt or row of another team's job has ``foreign`` true and ``attempt``,
        ``number``, ``job_id`` and ``job_name`` None (its payload and times stay: they are not secret).
        ``device`` is a device id (as in :meth:`devices`) or None; times are unix seconds. ``device_ids`` keeps
        the devices, attempts and rows of those devices; ``since`` keeps reports at least that recent and rows
        that end at or after it. The default implementation has nothing."""
        return {"nodes": [], "devices": [], "attempts": [], "series": []}

    def children(self) -> list[dict[str, Any]]:
        """The job's child jobs, oldest first: ``id``, ``name``, ``kind``, ``state``, ``reason``, ``nested``,
        ``held``, ``resources``, ``created_at``, ``started_at``, ``finished_at`` (unix seconds or None) and
        ``endpoint`` (where a RUNNING child answers requests, else None). The default implementation has none."""
        return []

    def participants(self) -> list[dict[str, Any]]:
        """The job's participants (machines outside the cluster that joined it, ``KindSpec.accepts_participants``),
        oldest first: ``id``, ``name``, ``gpus``, ``state`` (``active``, ``left``, ``stopped`` or ``lost``; an active
        one that missed its lease shows ``lost``), ``reason``, ``info`` (what it says about itself), ``metrics``
        (its latest values), ``joined_at``, ``last_seen`` and ``ended_at`` (unix seconds or None). The default
        implementation has none."""
        return []


class Panel(abc.ABC):
    """One panel on the job detail page (``placement = "job"``) or the cluster page (``"cluster"``).

    Lifecycle: the dashboard instantiates the class once per page render, calls :meth:`applies` (job panels
    only) and then :meth:`render`. Pages refresh panels by rendering them again, so ``render`` must be cheap
    and side-effect free.
    """

    slug: ClassVar[str]
    title: ClassVar[str]
    placement: ClassVar[Placement] = "job"
    # The job kinds a job panel is shown on (an empty tuple: every kind, and :meth:`applies` decides).
    kinds: ClassVar[tuple[str, ...]] = ()

    def applies(self, job: dict[str, Any]) -> bool:
        """Whether this job panel has anything to say about ``job`` (a job of the panel's own kind)."""
        return True

    @abc.abstractmethod
    def render(self, data: PanelData) -> dict[str, Any] | None:
        """The panel's content (see the module docstring), or None to hide it."""


class StaticPanelData(PanelData):
    """The static twin of the dashboard's :class:`PanelData`: serves what it is given, filtered as the real one
    filters (metric names, event kind, report plugin, devices, time and job), with no database. For panel tests
    and the conformance suite (:mod:`components.runtime.testing.conformance.panels`).

    ``metrics`` is ``{name: [(step, value, unix time), ...]}``; ``reports`` is ``{plugin: {"nodes": [...],
    "devices": [...], "attempts": [...], "series": [...]}}`` in the shape :meth:`PanelData.reports` returns
    (already scoped: give foreign entries as the viewer would see them)."""

    def __init__(self, job: dict[str, Any] | None = None, metrics: dict[str, list] | None = None,
                 events: list[dict[str, Any]] | None = None, devices: list[dict[str, Any]] | None = None,
                 reports: dict[str, dict[str, Any]] | None = None, children: list[dict[str, Any]] | None = None,
                 participants: list[dict[str, Any]] | None = None):
        self.job = job
        self._children = children or []
        self._participants = participants or []
        self._metrics = metrics or {}
        self._events = events or []
        self._devices = devices or []
        self._reports = reports or {}

    def metrics(self, names=None):
        return {name: list(points) for name, points in self._metrics.items() if names is None or name in names}

    def events(self, kind=None):
        return [event for event in self._events if kind is None or event.get("kind") == kind]

    def devices(self):
        return list(self._devices)

    def children(self):
        return [dict(child) for child in self._children]

    def participants(self):
        return [dict(participant) for participant in self._participants]

    def reports(self, plugin, device_ids=None, since=None, job_id=None):
        found = self._reports.get(plugin, {})
        wanted = None if device_ids is None else set(device_ids)

        def recent(entry: dict[str, Any], key: str = "time") -> bool:
            return since is None or (entry.get(key) or 0) >= since

        def on(entry: dict[str, Any], key: str = "device") -> bool:
            return wanted is None or entry.get(key) in wanted

        def of_job(entry: dict[str, Any]) -> bool:
            return job_id is None or (not entry.get("foreign") and str(entry.get("job_id")) == str(job_id))

        attempts = [entry for entry in found.get("attempts", []) if recent(entry) and on(entry) and of_job(entry)
                    and (job_id is not None or entry.get("current", True))]
        return {"nodes": [entry for entry in found.get("nodes", []) if recent(entry)],
                "devices": [entry for entry in found.get("devices", []) if recent(entry) and on(entry, "id")],
                "attempts": attempts,
                "series": [entry for entry in found.get("series", []) if recent(entry, "end") and on(entry)
                           and of_job(entry)]}
