"""Log search: full-text (``q``, ranked words) and grep (``grep``, a substring or regular expression) over jobs'
log lines, with a time range and a rank filter, on PostgreSQL and on SQLite (docs/architecture.md, *Log search*).

Two modes, because they answer different questions:

* ``q`` is **word search**, ranked: the words of a line (``simple`` configuration on PostgreSQL, ``unicode61`` on
  SQLite: lower-cased, no stemming, so identifiers are not mangled), web-search syntax: ``loss nan`` (both),
  ``"out of memory"`` (a phrase), ``nan OR inf``, ``-warmup`` (without). PostgreSQL: ``websearch_to_tsquery``
  against a GIN index over a stored ``to_tsvector('simple', message)`` (the generated column ``PG_VECTOR``),
  ranked by ``ts_rank``. SQLite: an external-content FTS5 table ``jobs_logline_fts`` kept in sync by triggers,
  ranked by ``bm25``. Higher ``score`` is better; the scale is the database's own.
* ``grep`` is **what grep does**: a regular expression (``fixed``: a literal substring; ``icase``: any case),
  matched anywhere in the line. PostgreSQL: ``~`` / ``~*`` / ``LIKE`` (POSIX advanced regular expressions) served
  by a ``pg_trgm`` GIN index where the extension can be created; SQLite: ``REGEXP`` (Python's ``re``) and
  ``LIKE``, scanning the job's (or team's) lines.

Both filter the same lines: ``since``/``until`` (an ISO 8601 time, or a duration before now: ``15m``, ``2h``,
``1d``) and ``rank`` (the worker rank that wrote the line: ``LogLine.rank``, from its ``[rank N]`` prefix).

Lines not kept are recorded on the job (:func:`note_dropped`, :func:`trim_lines`) and shown as a notice
(:func:`trimmed_notice`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Expression, F, Q, QuerySet, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from components.runtime.shared.units import parse_duration
from strata.api.values import text_problem
from strata.jobs.models import TERMINAL_STATES, Job, LogLine

FTS_CONFIG = "simple"
MAX_TEXT = 500  # characters of q or grep
MAX_SPANS = 50
SEARCH_TIMEOUT_MS = 10_000  # PostgreSQL: a search that runs longer is stopped (refusals())
SNIPPET_WIDTH = 200
RANK_PREFIX = re.compile(r"\[rank (\d{1,6})\] ")
WORD = re.compile(r"\w+")
QUERY_TOKEN = re.compile(r'(-?)"([^"]*)"?|(\S+)')

# -- the indexes (migration 0019_log_search; SQLite's triggers are also checked after every migrate) ---------------

PG_FTS_INDEX = "jobs_logline_message_fts"
PG_TRGM_INDEX = "jobs_logline_message_trgm"
PG_VECTOR = "message_tsv"
# The words of each line, stored (a generated column, PostgreSQL 12+): ranking reads them instead of recomputing
# to_tsvector for every match (a word in 500,000 lines: 0.9 s instead of 7 s, measured), and the GIN index is on it.
PG_CREATE = [f"ALTER TABLE jobs_logline ADD COLUMN IF NOT EXISTS {PG_VECTOR} tsvector GENERATED ALWAYS AS "
             f"(to_tsvector('{FTS_CONFIG}'::regconfig, COALESCE(message, ''))) STORED",
             f"CREATE INDEX IF NOT EXISTS {PG_FTS_INDEX} ON jobs_logline USING GIN ({PG_VECTOR})"]
PG_TRGM = ["CREATE EXTENSION IF NOT EXISTS pg_trgm",
           f"CREATE INDEX IF NOT EXISTS {PG_TRGM_INDEX} ON jobs_logline USING GIN (message gin_trgm_ops)"]
PG_DROP = [f"DROP INDEX IF EXISTS {PG_TRGM_INDEX}", f"DROP INDEX IF EXISTS {PG_FTS_INDEX}",
           f"ALTER TABLE jobs_logline DROP COLUMN IF EXISTS {PG_VECTOR}"]

SQLITE_TABLE = "jobs_logline_fts"
SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER IF NOT EXISTS {SQLITE_TABLE}_insert AFTER INSERT ON jobs_logline BEGIN
        INSERT INTO {SQLITE_TABLE}(rowid, message) VALUES (new.id, new.message); END""",
    f"""CREATE TRIGGER IF NOT EXISTS {SQLITE_TABLE}_delete AFTER DELETE ON jobs_logline BEGIN
        INSERT INTO {SQLITE_TABLE}({SQLITE_TABLE}, rowid, message) VALUES ('delete', old.id, old.message); END""",
    f"""CREATE TRIGGER IF NOT EXISTS {SQLITE_TABLE}_update AFTER UPDATE OF message ON jobs_logline BEGIN
        INSERT INTO {SQLITE_TABLE}({SQLITE_TABLE}, rowid, message) VALUES ('delete', old.id, old.message);
        INSERT INTO {SQLITE_TABLE}(rowid, message) VALUES (new.id, new.message); END""",
]
SQLITE_REBUILD = f"INSERT INTO {SQLITE_TABLE}({SQLITE_TABLE}) VALUES ('rebuild')"
SQLITE_CREATE = [
    f"CREATE VIRTUAL TABLE IF NOT EXISTS {SQLITE_TABLE} USING fts5(message, content='jobs_logline', "
    f"content_rowid='id', tokenize='unicode61')",
    *SQLITE_TRIGGERS,
    SQLITE_REBUILD,
]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS {SQLITE_TABLE}_{name}" for name in ("insert", "delete", "update")] + [
    f"DROP TABLE IF EXISTS {SQLITE_TABLE}"]


def create_indexes(schema_editor) -> None:
    """Create the search indexes on the database ``schema_editor`` migrates (its vendor's kind)."""
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        for statement in PG_CREATE:
            schema_editor.execute(statement)
        try:  # pg_trgm is a trusted extension (PostgreSQL 13+); without it grep scans, still correct
            with transaction.atomic(using=connection.alias):
                for statement in PG_TRGM:
                    schema_editor.execute(statement)
        except DatabaseError:
            pass
    elif connection.vendor == "sqlite":
        for statement in SQLITE_CREATE:
            schema_editor.execute(statement)


def drop_indexes(schema_editor) -> None:
    connection = schema_editor.connection
    statements = {"postgresql": PG_DROP, "sqlite": SQLITE_DROP}.get(connection.vendor, [])
    for statement in statements:
        schema_editor.execute(statement)


def ensure_sqlite_triggers(using: str = "default", **_: Any) -> None:
    """On SQLite, put back the triggers a later migration dropped by rebuilding ``jobs_logline`` (SQLite's
    ALTER TABLE copies the table; its triggers go with the old one), then rebuild the index from the lines. A
    ``post_migrate`` receiver (strata.jobs.apps); nothing happens where all are present."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        tables = {row[0] for row in cursor.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger') AND name LIKE 'jobs_logline%'")}
        if SQLITE_TABLE not in tables:
            return  # before migration 0019, or after it was reversed
        if all(f"{SQLITE_TABLE}_{name}" in tables for name in ("insert", "delete", "update")):
            return
        for statement in [*SQLITE_TRIGGERS, SQLITE_REBUILD]:
            cursor.execute(statement)


# -- what is written ----------------------------------------------------------------------------------------------

def rank_of(message: str) -> int | None:
    """The worker rank a line's ``[rank N] `` prefix names (the node's output pump and a gang's ctx.log write
    it), else None."""
    match = RANK_PREFIX.match(message)
    return int(match.group(1)) if match else None


def note_dropped(job_id, items: list[dict], now: datetime) -> None:
    """Record that ``items`` (log lines a job sent past its line cap) were not stored."""
    if not items:
        return
    times = [item.get("time") for item in items]
    first = min((moment for moment in times if isinstance(moment, datetime)), default=now)
    Job.objects.filter(pk=job_id).update(log_lines_dropped=F("log_lines_dropped") + len(items),
                                         log_dropped_after=Coalesce(F("log_dropped_after"), Value(first)))


def trim_lines(job: Job, before: datetime) -> int:
    """Delete ``job``'s log lines older than ``before`` and record it: the count, and that no line before
    ``before`` is left. Returns the number deleted."""
    deleted, _ = LogLine.objects.filter(job_id=job.pk, time__lt=before).delete()
    Job.objects.filter(pk=job.pk).update(
        log_lines_trimmed=F("log_lines_trimmed") + deleted,
        log_trimmed_before=Greatest(Coalesce(F("log_trimmed_before"), Value(before)), Value(before)))
    return deleted


def collect_lines(now: datetime, days: float | None) -> int:
    """The retention collector's part (``STRATA_RETENTION_LOG_DAYS``): of jobs that ended, delete the lines older
    than ``days`` before ``now``. A job is looked at until its cutoff passed its end (then nothing older is left
    to delete, nor ever written). Returns the lines deleted."""
    if days is None:
        return 0
    cutoff = now - timedelta(days=days)
    pending = (Job.objects.filter(state__in=TERMINAL_STATES, created_at__lt=cutoff)
               .filter(Q(log_trimmed_before__isnull=True) | Q(log_trimmed_before__lt=F("finished_at"))
                       | Q(finished_at__isnull=True))
               .only("pk").order_by())
    total = 0
    for job in pending.iterator(chunk_size=500):
        total += trim_lines(job, cutoff)
    return total


def trimmed_notice(job: Job) -> dict | None:
    """What was not kept of ``job``'s logs, as the API and the dashboard show it; None when every line is."""
    if not job.log_lines_dropped and not job.log_lines_trimmed:
        return None
    parts = []
    if job.log_lines_trimmed:
        before = job.log_trimmed_before.isoformat() if job.log_trimmed_before else "?"
        parts.append(f"logs trimmed: {job.log_lines_trimmed} lines before {before} were removed by the retention "
                     "policy")
    if job.log_lines_dropped:
        after = job.log_dropped_after.isoformat() if job.log_dropped_after else "?"
        parts.append(f"logs trimmed: {job.log_lines_dropped} lines from {after} on were not stored (the cap of "
                     "STRATA_MAX_LOG_LINES_PER_JOB lines per job)")
    return {"trimmed": job.log_lines_trimmed, "trimmed_before": job.log_trimmed_before,
            "dropped": job.log_lines_dropped, "dropped_after": job.log_dropped_after, "notice": "; ".join(parts)}


# -- what is asked ------------------------------------------------------------------------------------------------

class QueryInvalid(ValueError):
    """A malformed search; ``errors`` maps each bad parameter to its message."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{name}: {message}" for name, message in errors.items()))
        self.errors = errors


@dataclass(frozen=True)
class Term:
    words: tuple[str, ...]
    negated: bool = False


@dataclass(frozen=True)
class LogQuery:
    q: str = ""
    grep: str = ""
    fixed: bool = False
    icase: bool = False
    since: datetime | None = None
    until: datetime | None = None
    ranks: tuple[int, ...] = ()
    groups: tuple[tuple[Term, ...], ...] = field(default=(), compare=False)  # q: OR of ANDs

    @property
    def searching(self) -> bool:
        return bool(self.q or self.grep)

    @property
    def filtering(self) -> bool:
        return bool(self.searching or self.since or self.until or self.ranks)

    @property
    def words(self) -> list[str]:
        return sorted({word for group in self.groups for term in group if not term.negated for word in term.words})


PARAMETERS = ("q", "grep", "fixed", "icase", "since", "until", "rank")
TRUE, FALSE = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}


def parse_words(text: str) -> tuple[tuple[Term, ...], ...]:
    """``q`` in web-search syntax as OR-groups of terms: words, ``"phrases"``, ``-excluded``, ``OR``."""
    groups: list[list[Term]] = [[]]
    for match in QUERY_TOKEN.finditer(text):
        negated, phrase, bare = match.group(1), match.group(2), match.group(3)
        if bare is not None and bare.lower() == "or":
            groups.append([])
            continue
        if bare is not None:
            negated, phrase = ("-", bare[1:]) if bare.startswith("-") else ("", bare)
        words = tuple(word.lower() for word in WORD.findall(phrase or ""))
        if words:
            groups[-1].append(Term(words, bool(negated)))
    return tuple(tuple(group) for group in groups if group)


def _time(value: str, now: datetime) -> datetime:
    try:
        return now - timedelta(seconds=parse_duration(value))
    except (ValueError, OverflowError):
        pass
    moment = parse_datetime(value)
    if moment is None and (day := parse_date(value)) is not None:
        moment = datetime.combine(day, time())
    if moment is None:
        raise ValueError("must be a time (ISO 8601, e.g. 2026-12-06T10:00:00Z) or a duration before now (90s, "
                         "15m, 2h, 1d)")
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


def query_from(params: Mapping[str, Any], now: datetime | None = None) -> LogQuery:
    """A LogQuery from request parameters (``q grep fixed icase since until rank``); QueryInvalid names every
    bad one."""
    now = now or timezone.now()
    errors: dict[str, str] = {}
    text = {name: str(params.get(name) or "").strip() for name in PARAMETERS}
    for name, value in text.items():
        if problem := text_problem(value):
            errors[name] = problem
            text[name] = ""
    flags = {}
    for name in ("fixed", "icase"):
        value = text[name].lower()
        if value not in TRUE | FALSE:
            errors[name] = "must be true or false"
        flags[name] = value in TRUE
    groups: tuple[tuple[Term, ...], ...] = ()
    if len(text["q"]) > MAX_TEXT or len(text["grep"]) > MAX_TEXT:
        errors.update({name: f"at most {MAX_TEXT} characters" for name in ("q", "grep") if len(text[name]) > MAX_TEXT})
    if text["q"] and "q" not in errors:
        groups = parse_words(text["q"])
        if not groups or any(all(term.negated for term in group) for group in groups):
            errors["q"] = ("needs a word to find (letters or digits) in each alternative; -word only excludes: "
                           "use grep for punctuation")
    if text["grep"] and not flags["fixed"] and "grep" not in errors:
        try:
            re.compile(text["grep"])
        except re.error as error:
            errors["grep"] = f"not a regular expression ({error}); fixed=true finds it as written"
    times: dict[str, datetime | None] = {"since": None, "until": None}
    for name in times:
        if text[name]:
            try:
                times[name] = _time(text[name], now)
            except ValueError as error:
                errors[name] = str(error)
    if times["since"] and times["until"] and times["since"] > times["until"]:
        errors["until"] = "must not be before since"
    ranks: list[int] = []
    if text["rank"]:
        try:
            ranks = sorted({int(item) for item in text["rank"].split(",") if item.strip()})
        except ValueError:
            errors["rank"] = "must be a rank (0, 1, ...) or a comma-separated list of ranks"
        else:
            if not ranks or any(not 0 <= rank < 10**6 for rank in ranks):
                errors["rank"] = "must be a rank (0, 1, ...) or a comma-separated list of ranks"
    if errors:
        raise QueryInvalid(errors)
    return LogQuery(q=text["q"], grep=text["grep"], fixed=flags["fixed"], icase=flags["icase"],
                    since=times["since"], until=times["until"], ranks=tuple(ranks), groups=groups)


# -- finding ------------------------------------------------------------------------------------------------------

def fts5_expression(groups: Iterable[Iterable[Term]]) -> str:
    """``q``'s groups as an FTS5 query: each term a quoted phrase, implicit AND, NOT after the words, OR between
    groups (nothing the user typed is FTS5 syntax)."""
    alternatives = []
    for group in groups:
        terms = list(group)
        positive = [_phrase(term) for term in terms if not term.negated]
        expression = "(" + " AND ".join(positive) + ")"
        for term in terms:
            if term.negated:
                expression = f"({expression} NOT {_phrase(term)})"
        alternatives.append(expression)
    return " OR ".join(alternatives)


def _phrase(term: Term) -> str:
    return '"' + " ".join(word.replace('"', '""') for word in term.words) + '"'


def _grep_filter(query: LogQuery, vendor: str) -> Q:
    pattern = query.grep
    if not query.fixed:
        return Q(message__iregex=pattern) if query.icase else Q(message__regex=pattern)
    escaped = re.escape(pattern)  # literal in Python's re and in PostgreSQL's ARE alike
    if vendor == "postgresql":  # LIKE and ~* both use the trigram index; UPPER(..) LIKE would not
        return Q(message__iregex=escaped) if query.icase else Q(message__contains=pattern)
    # SQLite's LIKE ignores ASCII case: exact case needs the regular expression (after LIKE narrowed the lines)
    return Q(message__icontains=pattern) if query.icase else Q(message__icontains=pattern) & Q(message__regex=escaped)


class StoredVector(Expression):
    """PostgreSQL: the line's stored words (the generated column PG_VECTOR, which the model does not declare: it
    exists on PostgreSQL only), under whatever alias the query gives ``jobs_logline``."""

    def __init__(self):
        from django.contrib.postgres.search import SearchVectorField

        super().__init__(output_field=SearchVectorField())

    def as_sql(self, compiler, connection):
        alias = compiler.query.get_initial_alias()
        return f"{compiler.quote_name_unless_alias(alias)}.{connection.ops.quote_name(PG_VECTOR)}", []


def filtered(lines: QuerySet[LogLine], query: LogQuery) -> QuerySet[LogLine]:
    """``lines`` narrowed by ``query``; with ``q``, annotated with ``score`` (higher: more relevant). The order
    is left to the caller."""
    vendor = connections[lines.db].vendor
    if query.since:
        lines = lines.filter(time__gte=query.since)
    if query.until:
        lines = lines.filter(time__lte=query.until)
    if query.ranks:
        lines = lines.filter(rank__in=query.ranks)
    if query.grep:
        lines = lines.filter(_grep_filter(query, vendor))
    if query.q:
        if vendor == "postgresql":
            from django.contrib.postgres.search import SearchQuery, SearchRank

            words = SearchQuery(query.q, search_type="websearch", config=FTS_CONFIG)
            lines = lines.alias(document=StoredVector()).filter(document=words).annotate(
                score=SearchRank(StoredVector(), words))
        elif vendor == "sqlite":
            lines = lines.extra(  # noqa: S610 -- FTS5's MATCH and bm25() have no ORM form; the query is a parameter
                tables=[SQLITE_TABLE], where=[f"{SQLITE_TABLE}.rowid = jobs_logline.id", f"{SQLITE_TABLE} MATCH %s"],
                params=[fts5_expression(query.groups)], select={"score": f"-bm25({SQLITE_TABLE})"})
        else:  # another database: every word, anywhere (no ranking)
            for word in query.words:
                lines = lines.filter(message__icontains=word)
            lines = lines.annotate(score=Value(0.0))
    return lines


def ranked(scope: QuerySet[LogLine], query: LogQuery) -> QuerySet[LogLine]:
    """The lines of ``scope`` that ``query`` finds, in the search page's order: by relevance with ``q`` (then
    newest first), else newest first."""
    found = filtered(scope, query)
    return found.order_by("-score", "-time", "-id") if query.q else found.order_by("-time", "-id")


@contextmanager
def refusals(using: str, query: LogQuery | None = None) -> Iterator[None]:
    """Evaluate a search inside: in a savepoint, so that a regular expression PostgreSQL refuses (its dialect is
    not Python's) raises QueryInvalid and the request's transaction goes on. On PostgreSQL a search is stopped
    after SEARCH_TIMEOUT_MS (QueryInvalid: ranking recomputes each match's vector, so a word in half a million
    lines takes seconds; measured in docs/architecture.md, Log search)."""
    connection = connections[using]
    postgres = connection.vendor == "postgresql"
    try:
        with transaction.atomic(using=using):
            if postgres:
                with connection.cursor() as cursor:
                    cursor.execute("SHOW statement_timeout")
                    before = cursor.fetchone()[0]
                    cursor.execute("SELECT set_config('statement_timeout', %s, true)", [str(SEARCH_TIMEOUT_MS)])
            yield
            if postgres:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT set_config('statement_timeout', %s, true)", [before])
    except DatabaseError as error:
        text = str(error)
        if "regular expression" in text:
            raise QueryInvalid({"grep": f"the database refused the regular expression: {text.splitlines()[0]}"}
                               ) from None
        if "statement timeout" in text:
            name = "q" if query is not None and query.q else "grep"
            raise QueryInvalid({name: f"matches too many lines to answer within {SEARCH_TIMEOUT_MS // 1000} s: "
                                      "add a rarer word, a time range (since), a rank or one job"}) from None
        raise


def highlights(message: str, query: LogQuery) -> list[tuple[int, int]]:
    """Where ``query`` matches in ``message``: sorted, merged ``(start, end)`` character offsets (``q``'s words
    as whole words, any case; ``grep``'s matches)."""
    spans: list[tuple[int, int]] = []
    patterns = []
    if query.grep:
        patterns.append(re.compile(re.escape(query.grep) if query.fixed else query.grep,
                                   re.IGNORECASE if query.icase else 0))
    if query.words:
        alternatives = "|".join(re.escape(word) for word in sorted(query.words, key=len, reverse=True))
        patterns.append(re.compile(rf"(?<![^\W_])(?:{alternatives})(?![^\W_])", re.IGNORECASE))
    for pattern in patterns:
        for match in pattern.finditer(message):
            if match.end() > match.start():
                spans.append(match.span())
            if len(spans) >= 4 * MAX_SPANS:
                break
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged[:MAX_SPANS]


def snippet(message: str, spans: list[tuple[int, int]], width: int = SNIPPET_WIDTH) -> str:
    """About ``width`` characters of ``message`` around its first match, each match between ``**``; ``…`` where
    it was cut."""
    start = max(0, spans[0][0] - width // 4) if spans else 0
    end = min(len(message), start + width)
    pieces, at = [], start
    for left, right in spans:
        if right <= start or left >= end:
            continue
        left, right = max(left, start), min(right, end)
        pieces += [message[at:left], "**", message[left:right], "**"]
        at = right
    pieces.append(message[at:end])
    return ("…" if start > 0 else "") + "".join(pieces) + ("…" if end < len(message) else "")


def hit(line: LogLine, query: LogQuery) -> dict[str, Any]:
    """One line as the API answers it, with where it matched."""
    spans = highlights(line.message, query) if query.searching else []
    answer = {"id": line.pk, "job": str(line.job_id), "attempt": str(line.attempt_id) if line.attempt_id else None,
              "rank": line.rank, "time": line.time, "level": line.level, "message": line.message,
              "highlights": [list(span) for span in spans], "snippet": snippet(line.message, spans)}
    if query.q:
        answer["score"] = float(getattr(line, "score", 0.0) or 0.0)
    if hasattr(line, "job_name"):
        answer["job_name"] = line.job_name
    return answer
