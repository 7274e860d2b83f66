"""Reading the audit log: who may read which entries, the filters, and the CSV export. The API
(``GET /api/v1/audit/``), the dashboard's *Audit log* page and ``strata audit`` all read through here.

A cluster admin reads every entry; a team-admin the entries of the teams where they are team-admin (a token:
its own team only), never the entries without a team (logins); anyone else is refused.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet

from strata.accounts import roles
from strata.audit.models import AuditEntry

FILTERS = {
    "action": "Actions starting with this (\"token\", \"login.failure\").",
    "actor": "The user (name) who acted.",
    "team": "The team (slug).",
    "target": "Targets starting with this (\"job \", \"token ab12cd34\").",
    "since": "Entries at or after: an ISO 8601 time, or a duration before now (15m, 2h, 1d).",
    "until": "Entries at or before (as since).",
}
CSV_COLUMNS = ["time", "actor", "team", "action", "target", "before", "after", "address", "user_agent"]
REFUSED = "the team-admin role in a team, or cluster admin, is needed to read the audit log"


class AuditFilterInvalid(ValueError):
    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{name}: {message}" for name, message in errors.items()))


def readable_team_ids(request) -> list[int] | None:
    """The teams whose entries the caller reads: None for every entry (a cluster admin), else the teams where
    they are team-admin (empty: they read nothing, a 403)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return None
    return roles.team_ids_with(request, roles.TEAM_ADMIN)


def may_read(request) -> bool:
    """Whether the caller reads any entry (a cluster admin, or a team-admin somewhere)."""
    ids = readable_team_ids(request)
    return ids is None or bool(ids)


def entries_readable(request) -> QuerySet[AuditEntry] | None:
    """The entries the caller may read, newest first; None if they may read none."""
    ids = readable_team_ids(request)
    if ids is not None and not ids:
        return None
    entries = AuditEntry.objects.select_related(None).order_by("-time", "-id")
    return entries if ids is None else entries.filter(team_id__in=ids)


def entries_filtered(entries: QuerySet[AuditEntry], params: Mapping[str, Any]) -> QuerySet[AuditEntry]:
    """``entries`` narrowed by the FILTERS found in ``params``; AuditFilterInvalid names every bad one."""
    from strata.jobs.log_search import QueryInvalid, query_from  # the one reader of since/until

    text = {name: str(params.get(name) or "").strip() for name in FILTERS}
    try:
        times = query_from({"since": text["since"], "until": text["until"]})
    except QueryInvalid as error:
        raise AuditFilterInvalid(dict(error.errors)) from None
    if text["action"]:
        entries = entries.filter(action__startswith=text["action"])
    if text["actor"]:
        entries = entries.filter(actor_name=text["actor"])
    if text["team"]:
        entries = entries.filter(team_slug=text["team"])
    if text["target"]:
        entries = entries.filter(target__startswith=text["target"])
    if times.since:
        entries = entries.filter(time__gte=times.since)
    if times.until:
        entries = entries.filter(time__lte=times.until)
    return entries


def entry_data(entry: AuditEntry) -> dict[str, Any]:
    return {"id": entry.pk, "time": entry.time, "actor": entry.actor_name or None, "actor_id": entry.actor_id,
            "team": entry.team_slug or None, "action": entry.action, "target": entry.target,
            "before": entry.before, "after": entry.after, "address": entry.address or None,
            "user_agent": entry.user_agent}


class _Echo:
    def write(self, value: str) -> str:
        return value


def _cell(value: Any) -> str:
    """A CSV cell: JSON for structures; a text a spreadsheet would run as a formula gets a leading quote."""
    if value is None:
        return ""
    text = value.isoformat() if hasattr(value, "isoformat") else (
        value if isinstance(value, str) else json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True))
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def csv_rows(entries: Iterable[AuditEntry]) -> Iterator[str]:
    """The CSV export, one line at a time (a header first), for a streaming response."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in entries:
        data = entry_data(entry)
        yield writer.writerow([_cell(data[column]) for column in CSV_COLUMNS])
