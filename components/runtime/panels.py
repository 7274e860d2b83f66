"""Dashboard panels that components contribute to the job detail and cluster pages.

A component lists its panels on its light :class:`~components.runtime.spec.KindSpec` as ``panels``, a tuple of
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
from typing import Any, ClassVar, Literal

Placement = Literal["job", "cluster"]


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

    def sharing(self, device_ids: list[int] | None = None, since: float | None = None,
                job_id: str | None = None) -> dict[str, Any]:
        """GPU sharing: what each device's sharing service last reported, and who ran when.

        Returns ``{"devices": [...], "slices": [...]}``. A device (only those running a sharing service; only
        ``device_ids`` when given) is ``id``, ``node``, ``index``, ``kind``, ``policy``, ``switches``,
        ``switch_latency_ms`` (``{"p50", "p99"}``), ``utilization`` (0..1), ``budget`` (bytes), ``lanes``
        (``{"id", "size", "jobs"}``: how many jobs share the lane) and ``jobs`` (``state``, ``persistent``,
        ``ephemeral``, ``lane``, ``steps``, ``foreign``, and for jobs the viewer may see ``attempt``,
        ``job_id`` and ``job_name``). A slice is ``device``, ``start`` and ``end`` (unix seconds),
        ``foreign`` and, for jobs the viewer may see, ``attempt``, ``job_id`` and ``job_name`` (None for
        another team's job). ``since`` (unix seconds) keeps the slices that end after it; ``job_id`` keeps
        that job's slices and the devices it ran on. The default implementation shares nothing."""
        return {"devices": [], "slices": []}


class Panel(abc.ABC):
    """One panel on the job detail page (``placement = "job"``) or the cluster page (``"cluster"``).

    Lifecycle: the dashboard instantiates the class once per page render, calls :meth:`applies` (job panels
    only) and then :meth:`render`. Pages refresh panels by rendering them again, so ``render`` must be cheap
    and side-effect free.
    """

    slug: ClassVar[str]
    title: ClassVar[str]
    placement: ClassVar[Placement] = "job"

    def applies(self, job: dict[str, Any]) -> bool:
        """Whether this job panel has anything to say about ``job`` (a job of the panel's own kind)."""
        return True

    @abc.abstractmethod
    def render(self, data: PanelData) -> dict[str, Any] | None:
        """The panel's content (see the module docstring), or None to hide it."""
