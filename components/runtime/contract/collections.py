"""Collections: named, team-owned records a plugin keeps on the control plane (the ``collections`` seam).

Some plugins need users to register things once and name them later: a dataset at a path on the nodes, say,
that every job then reads by name. A plugin declares such a collection in its manifest
(``collections={"datasets": "pkg.module:Datasets"}``) and the control plane serves it under the API root:

- ``GET /api/v1/{collection}/``: the plugin's built-in entries and the records of the viewer's teams, each
  passed through :meth:`Collection.present` (which may add live facts, e.g. what each node's cache holds), and
  the collection's :meth:`Collection.summary`;
- ``POST /api/v1/{collection}/``: register one (``team`` picks the team as for jobs); the body is checked by
  :meth:`Collection.validate`, a 400 naming every bad field at once; a name the team (or a built-in) already
  has is a 409;
- ``GET`` and ``DELETE /api/v1/{collection}/{name}/``: one record; another team's record is a 404, and
  built-ins cannot be deleted.

A record that names something the team must be allowed to use (a path on the nodes, say) is checked after
:meth:`Collection.validate` by :meth:`Collection.access_problems`, with a :class:`RecordContext` the core builds
for the registering team: the collection asks it (``context.path_problem(path)``: may this team read this path
on the nodes?) and answers each refused field with a one-line reason, a 400 like any bad field. The rules behind
the answer are the core's (``strata.quotas.roots``: the data roots a cluster admin granted the team, never the
platform's own state), so every collection that names paths is held to the same ones. Records are checked when
they are registered; a record stored earlier is read as it is.

A record may also name one of the team's uploaded data sets (``strata data upload``, ``/api/v1/data/``):
``context.data_set(name)`` answers it as a job's mount resolves it (``{name, digest, format, size,
expanded_size[, file]}``), or None when the team has none of that name (another team's is None too: a 400 on the
field, never a hint that it exists). After the checks, :meth:`Collection.resolve` may pin what such a name means
now (its digest) into the record that is stored.

A collection may declare :attr:`Collection.schema`, the JSON Schema of the bodies it accepts: the served OpenAPI
schema then types ``POST /api/v1/{collection}/`` with it (one path pair per registered collection), so clients
and the API fuzzer build valid bodies. :meth:`Collection.validate` stays the authority.

A record is plain JSON with a ``name``; jobs refer to records by name and the control plane resolves the name at
submit (see :meth:`components.runtime.contract.data.DataProvider.resolve`), so a node never has to look one up.

Light: imported by the control plane; no torch, no Django.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from components.runtime.contract.panels import PanelData

RECORD_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
"""Record names: lower case letters, digits, dots, dashes and underscores, starting with a letter or digit."""


class RecordContext:
    """What the core answers a collection about the team registering a record (see
    :meth:`Collection.access_problems`). The control plane's is ``strata.quotas.roots.TeamRecordContext``;
    :class:`StaticRecordContext` is a light twin for tests.

    - :attr:`team`: the team's slug;
    - :attr:`data_roots`: the directories on the nodes a cluster admin granted the team (absolute, normalized);
    - :meth:`path_problem`: may the team use this path on the nodes?
    - :meth:`data_set`: the team's uploaded data set of a name, or None.
    """

    team: str = ""
    data_roots: tuple[str, ...] = ()

    def path_problem(self, path: str) -> str | None:
        """Why the team may not use ``path`` (a file or directory on the nodes), in one line, or None when it
        may. The answer already says what the path is refused for (outside the team's data roots, under the
        platform's state, under another team's root); a collection hands it on as its field's message."""
        raise NotImplementedError

    def data_set(self, name: str) -> dict[str, Any] | None:
        """The team's uploaded data set ``name`` as a job's mount resolves it (``{name, digest, format, size,
        expanded_size[, file]}``: ``format`` is ``archive``, a directory, or ``file``), or None when the team has
        none of that name; another team's data set is None as well. None by default."""
        return None


class StaticRecordContext(RecordContext):
    """A :class:`RecordContext` from plain values, for tests and the conformance suite: a path may be used when
    it lies under one of ``data_roots`` and neither under nor above any of ``forbidden``. The control plane's
    rules (other teams' roots, the platform's own directories) are ``strata.quotas.roots``."""

    def __init__(self, team: str = "team", data_roots: Iterable[str] = (), forbidden: Iterable[str] = (),
                 data_sets: dict[str, dict[str, Any]] | None = None):
        self.team = team
        self.data_roots = tuple(normal_path(root) for root in data_roots)
        self.forbidden = tuple(normal_path(path) for path in forbidden)
        self.data_sets = {name: {**value, "name": name} for name, value in (data_sets or {}).items()}
        self.asked: list[str] = []

    def data_set(self, name: str) -> dict[str, Any] | None:
        found = self.data_sets.get(name)
        return dict(found) if found is not None else None

    def path_problem(self, path: str) -> str | None:
        self.asked.append(path)
        try:
            normal = normal_path(path)
        except ValueError as error:
            return str(error)
        for directory in self.forbidden:
            if path_within(normal, directory) or path_within(directory, normal):
                return f"{'lies under' if path_within(normal, directory) else 'contains'} {directory}, " \
                       "which no team may use"
        if not any(path_within(normal, root) for root in self.data_roots):
            return f"lies outside team {self.team}'s data roots ({', '.join(self.data_roots) or 'none granted'})"
        return None


def normal_path(path: Any) -> str:
    """``path`` as one absolute, normalized POSIX path (``//`` and ``.`` folded, no trailing slash), or raise
    ValueError saying why it cannot be one (not a string, relative, a NUL, a ``..`` part)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError("must be an absolute path")
    if "\0" in path:
        raise ValueError("must not contain NUL")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError("must be a plain absolute path (no '..')")
    return "/" + "/".join(parts)


def path_within(path: str, root: str) -> bool:
    """Whether normalized ``path`` is ``root`` or lies under it (whole components: /data2 is not under /data)."""
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


class Collection:
    """One plugin's collection of named records. Instantiated once per process with no arguments.

    Subclasses set :attr:`title` and override :meth:`validate`; :meth:`builtins`, :meth:`present` and
    :meth:`access_problems` (which a collection whose records name paths on the nodes must override) are
    optional. The manifest's key is the collection's name (its URL), set on the instance as :attr:`name`.
    """

    name: str = ""
    title: ClassVar[str] = ""
    description: ClassVar[str] = ""
    schema: ClassVar[dict[str, Any] | None] = None
    """The JSON Schema (2020-12) of a body :meth:`validate` accepts (``team`` aside, which the API takes off
    first), with an ``examples`` list of valid bodies; None (the default): any JSON object. It may accept more
    than :meth:`validate` does (that check stays the authority), never less: every body ``validate`` accepts
    must match it (the conformance suite checks its ``good`` bodies)."""

    def validate(self, body: Any) -> dict[str, Any]:
        """The normalized record (with ``name``), or raise :class:`components.runtime.contract.spec.SpecError` naming
        every bad field at once. Runs on the control plane at registration: pure and cheap."""
        raise NotImplementedError

    def access_problems(self, record: dict[str, Any], context: RecordContext) -> dict[str, str]:
        """Field -> one-line reason for each part of ``record`` (what :meth:`validate` returned) that the
        registering team may not use; empty when it may use all of it (the default: a record that names nothing
        on the nodes). A record naming a path on the nodes asks ``context.path_problem(path)`` for each and
        answers its problem under the path's field (``{"source.path": problem}``): a 400 naming that field.
        Runs on the control plane at registration, after :meth:`validate`: pure and cheap, no I/O of its own."""
        return {}

    def resolve(self, record: dict[str, Any], context: RecordContext) -> dict[str, Any]:
        """The record to store, once :meth:`validate` and :meth:`access_problems` found nothing wrong: names of
        the team's things replaced by (or pinned to) what they name now, e.g. an uploaded data set's digest from
        ``context.data_set(name)``. Raise :class:`components.runtime.contract.spec.SpecError` for a name that names
        nothing (a 400 naming the field). Keeps ``name``. By default: the record unchanged."""
        return record

    def builtins(self) -> list[dict[str, Any]]:
        """Entries every team sees and no one may delete or shadow (none by default)."""
        return []

    def summary(self, data: PanelData) -> dict[str, Any] | None:
        """Facts about the whole collection, answered beside the list as ``summary`` (e.g. each node's cache
        size and hit rate), from the viewer's cluster-wide PanelData; None (the default) answers none."""
        return None

    def present(self, record: dict[str, Any], data: PanelData) -> dict[str, Any]:
        """What the API shows of one record (a built-in or a team's), given the viewer's cluster-wide
        :class:`PanelData` (``reports`` reads what the plugin's node services report). By default the record."""
        return record


def schema_problem(schema: Any) -> str | None:
    """What is wrong with a JSON Schema a plugin declares (a collection's :attr:`Collection.schema`, a job
    route's ``schema``), or None: it must be a JSON object schema (a dict that JSON can encode)."""
    import json

    if schema is None:
        return None
    if not isinstance(schema, dict):
        return f"the schema must be a dict (a JSON Schema), not {type(schema).__name__}"
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as error:
        return f"the schema is not JSON: {error}"
    if schema.get("type", "object") not in ("object", ["object"]):
        return f"the schema must describe a JSON object (type object), not {schema.get('type')!r}"
    return None


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a record, or None."""
    if not isinstance(name, str) or not RECORD_NAME_RE.match(name):
        return f"must match {RECORD_NAME_RE.pattern} (lower case, at most 64 characters)"
    return None


@dataclass(frozen=True)
class Progress:
    """The live table a job route gives ``strata submit --wait`` (a job route's optional ``progress``
    attribute): while a job of one of ``kinds`` runs, the CLI polls the route and prints each row of
    ``rows(answer) -> (header, [(row key, row text)])`` when it changes (a sweep's trials, say). ``rows`` runs in
    the CLI: pure, and light like the route's module."""

    kinds: tuple[str, ...]
    rows: Callable[[Any], tuple[str, list[tuple[str, str]]]]


def check_job_route(function: Any, path: str, name: str | None) -> None:
    """The registry's check of a ``job_routes`` part: the answer's schema and the live table, when it declares
    them."""
    if problem := schema_problem(getattr(function, "schema", None)):
        raise TypeError(f"{path}.schema: {problem}")
    progress = getattr(function, "progress", None)
    if progress is not None:
        if not isinstance(progress, Progress):
            raise TypeError(f"{path}.progress must be a Progress, not {type(progress).__name__}")
        if not progress.kinds or not all(isinstance(kind, str) and kind for kind in progress.kinds):
            raise TypeError(f"{path}.progress.kinds must name at least one kind")
        if not callable(progress.rows):
            raise TypeError(f"{path}.progress.rows must be callable")


def check_collection(collection: Collection, path: str, name: str | None) -> None:
    """The registry's check of a ``collections`` part: it takes its name from the manifest; its schema."""
    collection.name = name or ""
    if problem := schema_problem(collection.schema):
        raise TypeError(f"{path}.schema: {problem}")
