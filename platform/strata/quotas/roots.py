"""Data roots: the directories on the nodes under which a team may register data by path.

A cluster admin grants roots to a team (``Quota.data_roots``: ``PATCH /api/v1/quotas/{team}/``, ``strata quota
TEAM --set data_roots=...``, the quota editor). The rules a path a team names must pass live here, once
(:func:`path_problem`), and reach the plugins' collections through the collections seam
(:class:`components.runtime.contract.collections.RecordContext`, built per registration by :func:`record_context`):

1. it never lies under, or contains, the platform's own directories: the state directory (``STRATA_HOME``), the
   artifact store's root and the SQLite database's directory, even when a granted root contains them;
2. it lies under one of the roots granted to the team;
3. it neither lies under nor contains a root granted to another team, unless that root is granted to this team
   too: two teams share a root only when an admin grants it to both.

Paths are compared as written (normalized: ``//`` and ``.`` folded, no ``..``) and, for rules 1 and 3, also as
the control plane's file system resolves them (symbolic links followed), which is where a single-machine
deployment's nodes read them. Records registered before a root was granted or revoked are not checked again.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.conf import settings

from components.runtime.contract.collections import RecordContext, normal_path, path_within
from strata.quotas.models import Quota

MAX_ROOTS = 64
MAX_PATH = 4096  # PATH_MAX on Linux


def platform_directories() -> list[tuple[str, str]]:
    """(normalized path, what it is) of each directory of the platform's own that no team may register data
    under: the state directory, the artifact store's root and the SQLite database's directory."""
    found = [(settings.HOME, "the platform's state directory"),
             (getattr(settings, "STRATA_ARTIFACT_ROOT", None), "the platform's artifact store")]
    database = settings.DATABASES.get("default", {})
    name = str(database.get("NAME") or "")
    if "sqlite" in str(database.get("ENGINE", "")) and name.startswith("/"):
        found.append((Path(name).parent, "the platform's database directory"))
    directories = []
    for path, what in found:
        if path is None:
            continue
        for form in _forms(os.path.abspath(str(path))):  # a relative setting is relative to the process's cwd
            directories.append((form, what))
    return directories


def _forms(path: str) -> set[str]:
    """The normalized path as written and as the control plane's file system resolves it."""
    normal = normal_path(path)
    return {normal, normal_path(os.path.realpath(normal))}


def _overlap(path_forms: set[str], directory: str) -> str | None:
    """'lies under' or 'contains' when one of the path's forms and ``directory`` overlap, else None."""
    if any(path_within(form, directory) for form in path_forms):
        return "lies under"
    if any(path_within(directory, form) for form in path_forms):
        return "contains"
    return None


def clean_data_roots(value) -> list[str]:
    """The data roots ``value`` names, normalized and without repeats, or raise ValueError with one message.

    ``value`` is a list of absolute paths (the API, the CLI), or text with one path per line or comma (the quota
    editor's field); None or "" is no roots. A root under the platform's own directories is refused (no path
    under it could be registered); one that contains them may be granted (those stay refused inside it)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [part.strip() for part in re.split(r"[\n,]", value) if part.strip()]
    if not isinstance(value, list | tuple):
        raise ValueError("must be a list of absolute directory paths")
    if len(value) > MAX_ROOTS:
        raise ValueError(f"at most {MAX_ROOTS} roots")
    roots: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise ValueError("must be a list of absolute directory paths")
        if len(item) > MAX_PATH:
            raise ValueError(f"{item[:40]!r}...: at most {MAX_PATH} characters")
        try:
            root = normal_path(item)
        except ValueError as error:
            raise ValueError(f"{item!r} {error}") from None
        for directory, what in platform_directories():
            if path_within(root, directory) or any(path_within(form, directory) for form in _forms(root)):
                raise ValueError(f"{item!r} lies under {what}: no team may register data there")
        if root not in roots:
            roots.append(root)
    return roots


def team_roots(team_id: int) -> list[str]:
    """The data roots granted to the team (none when it has no quota row)."""
    roots = Quota.objects.filter(team_id=team_id).values_list("data_roots", flat=True).first()
    return list(roots or [])


def path_problem(team_id: int, path: str, team_slug: str = "") -> str | None:
    """Why the team may not register data at ``path`` on the nodes (one line), or None when it may."""
    try:
        normal = normal_path(path)
    except ValueError as error:
        return str(error)
    forms = _forms(normal)
    for directory, what in platform_directories():
        if overlap := _overlap(forms, directory):
            return f"{overlap} {what}: no team may register data there"
    roots = team_roots(team_id)
    team = f"team {team_slug}" if team_slug else "the team"
    if not roots:
        return f"{team} has no data roots: a cluster admin grants them (strata quota TEAM --set data_roots=/PATH)"
    if not any(path_within(normal, root) for root in roots):
        return f"lies outside the data roots granted to {team} ({', '.join(roots)})"
    own = set(roots)
    others = Quota.objects.exclude(team_id=team_id).values_list("data_roots", flat=True)
    for root in sorted({root for granted in others for root in (granted or []) if root not in own}):
        for form in _forms(root):
            if form in own:
                continue
            if overlap := _overlap(forms, form):
                return f"{overlap} a data root granted to another team (a root is shared only when granted to both)"
    return None


class TeamRecordContext(RecordContext):
    """The control plane's :class:`RecordContext`: the team's granted roots and :func:`path_problem`'s rules, and
    the team's uploaded data sets (``strata.jobs.data.data_lookup``)."""

    def __init__(self, team):
        self.team = team.slug
        self.team_id = team.pk
        self.data_roots = tuple(team_roots(team.pk))

    def path_problem(self, path: str) -> str | None:
        return path_problem(self.team_id, path, self.team)

    def data_set(self, name: str) -> dict | None:
        from strata.jobs.data import data_lookup

        return data_lookup(self.team_id, name) if isinstance(name, str) else None


def record_context(team) -> TeamRecordContext:
    """The context a collection's ``access_problems`` gets for a record ``team`` registers."""
    return TeamRecordContext(team)
