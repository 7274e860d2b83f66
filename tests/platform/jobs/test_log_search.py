"""Log search (strata.jobs.log_search): ranked word search (q), grep (substring and regular expression), the time
and rank filters, on one job's logs route and across the team (GET /api/v1/logs/search/), never another team's
lines; the notice of lines not kept; the CLI. Runs on the database the suite runs on (PostgreSQL in CI, SQLite by
default); the SQLite FTS5 statements are also checked on sqlite3 directly, whatever the suite's database."""

from __future__ import annotations

import argparse
import sqlite3
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from components.runtime.client.client import ApiError
from strata.cli import client_commands
from strata.jobs import log_search
from strata.jobs.models import Job, LogLine
from strata.jobs.parent_run import record

SEARCH = "/api/v1/logs/search/"


@pytest.fixture
def teams(make_team, make_user, make_token, api, submit):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    viewer = make_user("vera", alpha, role="viewer")
    return {
        "alice": api(make_token(alice, alpha)), "bob": api(make_token(bob, beta)),
        "viewer": api(make_token(viewer, alpha)),
        "a1": submit(alice, alpha, name="first"), "a2": submit(alice, alpha, name="second"),
        "b1": submit(bob, beta, name="theirs"),
    }


def write(job: Job, *messages: str, start=None, step=timedelta(seconds=1)) -> None:
    """Store lines as a job reports them (ranks from their prefixes), one second apart."""
    start = start or timezone.now() - timedelta(hours=1)
    record(job, logs=[{"message": text, "time": start + index * step} for index, text in enumerate(messages)])


def messages(answer) -> list[str]:
    return [item["message"] for item in (answer["results"] if isinstance(answer, dict) else answer)]


def test_rank_recorded_from_the_prefix(teams):
    write(teams["a1"], "[rank 3] hello", "plain line", "[rank 12] x")
    assert list(LogLine.objects.filter(job=teams["a1"]).values_list("rank", flat=True)) == [3, None, 12]
    assert log_search.rank_of("[rank 0] go") == 0 and log_search.rank_of("rank 0 go") is None


def test_word_search_ranks_and_finds_words(teams):
    write(teams["a1"], "epoch 1 loss 0.52", "loss nan at step 5", "nan nan loss nan nan", "warmup loss nan",
          "CUDA out of memory on device 0", "memory out of reach", "lossy codec")
    write(teams["a2"], "loss nan in the second job")
    alice = teams["alice"]
    answer = alice.get(SEARCH, {"q": "nan loss"}).json()
    found = messages(answer)
    assert set(found) == {"loss nan at step 5", "nan nan loss nan nan", "warmup loss nan", "loss nan in the second job"}
    assert answer["count"] == 4
    assert found[0] == "nan nan loss nan nan"  # the most occurrences ranks first
    scores = [item["score"] for item in answer["results"]]
    assert scores == sorted(scores, reverse=True)
    top = answer["results"][0]
    assert top["job"] == str(teams["a1"].pk) and top["job_name"] == "first"
    assert top["highlights"] == [[0, 3], [4, 7], [8, 12], [13, 16], [17, 20]]
    assert top["snippet"] == "**nan** **nan** **loss** **nan** **nan**"
    # Whole words: "loss" is not found in "lossy"; a phrase keeps its order; OR; -without.
    assert "lossy codec" not in messages(alice.get(SEARCH, {"q": "loss"}).json())
    assert messages(alice.get(SEARCH, {"q": '"out of memory"'}).json()) == ["CUDA out of memory on device 0"]
    assert set(messages(alice.get(SEARCH, {"q": "codec OR cuda"}).json())) == {
        "lossy codec", "CUDA out of memory on device 0"}
    assert set(messages(alice.get(SEARCH, {"q": "nan -warmup -second"}).json())) == {
        "loss nan at step 5", "nan nan loss nan nan"}
    # One job: its own lines only, oldest first.
    assert messages(alice.get(SEARCH, {"q": "nan", "job": str(teams["a2"].pk)}).json()) == [
        "loss nan in the second job"]
    route = alice.get(f"/api/v1/jobs/{teams['a1'].pk}/logs/", {"q": "nan"}).json()
    assert messages(route) == ["loss nan at step 5", "nan nan loss nan nan", "warmup loss nan"]
    assert route[0]["highlights"] == [[5, 8]]


def test_search_pages(teams):
    write(teams["a1"], *[f"line {index} needle" for index in range(7)])
    alice = teams["alice"]
    first = alice.get(SEARCH, {"grep": "needle", "page_size": 3}).json()
    assert first["count"] == 7 and len(first["results"]) == 3 and first["next"]
    assert messages(first) == ["line 6 needle", "line 5 needle", "line 4 needle"]  # grep alone: newest first
    last = alice.get(SEARCH, {"grep": "needle", "page_size": 3, "page": 3}).json()
    assert messages(last) == ["line 0 needle"] and last["next"] is None


def test_grep_substring_and_regex(teams):
    write(teams["a1"], "step 10 loss=0.5 lr=0.1", "step 11 loss=0.45", "ERROR disk full", "error: retrying",
          "[rank 1] worker ready", "a+b (c)")
    route = f"/api/v1/jobs/{teams['a1'].pk}/logs/"
    alice = teams["alice"]
    assert messages(alice.get(route, {"grep": "loss=0.4"}).json()) == ["step 11 loss=0.45"]
    assert messages(alice.get(route, {"grep": r"loss=0\.\d+$"}).json()) == ["step 11 loss=0.45"]
    assert messages(alice.get(route, {"grep": r"^step 1[01] "}).json()) == ["step 10 loss=0.5 lr=0.1",
                                                                            "step 11 loss=0.45"]
    # Case: as grep, exact unless icase.
    assert messages(alice.get(route, {"grep": "ERROR"}).json()) == ["ERROR disk full"]
    assert messages(alice.get(route, {"grep": "error", "icase": "true"}).json()) == ["ERROR disk full",
                                                                                     "error: retrying"]
    assert messages(alice.get(route, {"grep": "Error", "fixed": "1"}).json()) == []
    assert messages(alice.get(route, {"grep": "ERROR D", "fixed": "1", "icase": "1"}).json()) == ["ERROR disk full"]
    # Fixed strings: regular expression characters as written.
    answer = alice.get(route, {"grep": "a+b (c)", "fixed": "true"}).json()
    assert messages(answer) == ["a+b (c)"] and answer[0]["highlights"] == [[0, 7]]
    assert messages(alice.get(route, {"grep": "[rank 1]", "fixed": "true"}).json()) == ["[rank 1] worker ready"]
    hit = alice.get(route, {"grep": r"lr=\S+"}).json()[0]
    assert hit["highlights"] == [[17, 23]] and hit["snippet"] == "step 10 loss=0.5 **lr=0.1**"
    # Words and a pattern together: both must match.
    assert messages(alice.get(route, {"q": "step", "grep": "0.5 "}).json()) == ["step 10 loss=0.5 lr=0.1"]


def test_time_range_and_rank_filters(teams):
    start = timezone.now() - timedelta(hours=3)
    write(teams["a1"], "[rank 0] early", "[rank 1] early", "host note", start=start, step=timedelta(hours=1))
    write(teams["a1"], "[rank 0] recent", "[rank 1] recent", step=timedelta(seconds=1),
          start=timezone.now() - timedelta(minutes=5))
    route = f"/api/v1/jobs/{teams['a1'].pk}/logs/"
    alice = teams["alice"]
    assert messages(alice.get(route, {"since": "30m"}).json()) == ["[rank 0] recent", "[rank 1] recent"]
    assert messages(alice.get(route, {"until": "2h"}).json()) == ["[rank 0] early", "[rank 1] early"]
    middle = (start + timedelta(minutes=30)).isoformat()
    assert messages(alice.get(route, {"since": middle, "until": "70m"}).json()) == ["[rank 1] early"]
    assert messages(alice.get(route, {"rank": "1"}).json()) == ["[rank 1] early", "[rank 1] recent"]
    assert messages(alice.get(route, {"rank": "0,1", "since": "1h"}).json()) == ["[rank 0] recent",
                                                                                 "[rank 1] recent"]
    lines = alice.get(route, {"rank": "0"}).json()
    assert [line["rank"] for line in lines] == [0, 0]
    # The stream's cursor still applies: lines after an id.
    assert messages(alice.get(route, {"rank": "0", "after": lines[0]["id"]}).json()) == ["[rank 0] recent"]
    # Unfiltered, the stream is as before, each line with its rank.
    assert [line["rank"] for line in alice.get(route).json()] == [0, 1, None, 0, 1]
    # Across the team, with a date only (midnight UTC) and a time range.
    today = timezone.now().date().isoformat()
    assert len(messages(alice.get(SEARCH, {"grep": "recent", "since": today}).json())) == 2


def test_another_teams_lines_never_appear(teams):
    write(teams["a1"], "shared secret word alpha")
    write(teams["b1"], "shared secret word beta")
    for who, mine in (("alice", "shared secret word alpha"), ("bob", "shared secret word beta")):
        for params in ({"q": "shared secret"}, {"grep": "secret"}, {"q": "word", "team": "alpha"},
                       {"q": "word", "team": "beta"}):
            found = messages(teams[who].get(SEARCH, params).json())
            assert found in ([mine], []), (who, params, found)
    assert messages(teams["alice"].get(SEARCH, {"q": "secret", "job": str(teams["b1"].pk)}).json()) == []
    assert teams["alice"].get(f"/api/v1/jobs/{teams['b1'].pk}/logs/", {"q": "secret"}).status_code == 404
    # A viewer of the team reads its lines.
    assert messages(teams["viewer"].get(SEARCH, {"q": "secret"}).json()) == ["shared secret word alpha"]
    assert teams["viewer"].get(f"/api/v1/jobs/{teams['a1'].pk}/logs/", {"grep": "alpha"}).status_code == 200


def test_bad_parameters_are_400_naming_each(teams):
    answer = teams["alice"].get(SEARCH, {"q": "-only", "grep": "(", "since": "yesterday", "rank": "x",
                                         "icase": "maybe"})
    assert answer.status_code == 400
    body = answer.json()
    text = str(body)
    for name in ("q", "grep", "since", "rank", "icase"):
        assert f"'{name}'" in text, (name, body)
    write(teams["a1"], "[rank 0] anything")
    everything = teams["alice"].get(SEARCH, {"rank": "0"})  # no words, no pattern: every line (newest first)
    assert everything.status_code == 200 and messages(everything.json()) == ["[rank 0] anything"]
    assert teams["alice"].get(SEARCH, {"q": "x", "job": "nope"}).status_code == 400
    late, early = timezone.now().isoformat(), (timezone.now() - timedelta(hours=1)).isoformat()
    assert "until" in teams["alice"].get(SEARCH, {"q": "x", "since": late, "until": early}).json().__str__()
    route = f"/api/v1/jobs/{teams['a1'].pk}/logs/"
    assert teams["alice"].get(route, {"grep": "(", "fixed": "true"}).status_code == 200  # literal: fine
    for name in ("q", "grep", "since", "rank"):  # text that cannot reach the database
        refused = teams["alice"].get(SEARCH, {name: "a\x00b"})
        assert refused.status_code == 400 and f"'{name}'" in str(refused.json()), (name, refused.content)
    # A pattern Python accepts but the database may not: a 400, never a 500.
    write(teams["a1"], "ab")
    for pattern in (r"(?<=a)b", r"(?P<x>a)b"):
        answer = teams["alice"].get(route, {"grep": pattern})
        assert answer.status_code in (200, 400), (pattern, answer.content)
        if answer.status_code == 400:
            assert "grep" in str(answer.json())
        if connection.vendor == "postgresql" and pattern.startswith("(?P"):
            assert answer.status_code == 400  # Python's named groups are no POSIX ARE
    # The request goes on after a refused pattern (its savepoint rolled back).
    answer = teams["alice"].get(SEARCH, {"grep": r"(?P<x>a)b"})
    assert answer.status_code == (400 if connection.vendor == "postgresql" else 200)
    assert teams["alice"].get(SEARCH, {"grep": "ab"}).json()["count"] == 1


def test_trimmed_notice(teams, settings):
    settings.STRATA_MAX_LOG_LINES_PER_JOB = 3
    job = teams["a1"]
    start = timezone.now() - timedelta(hours=2)
    write(job, "one", "two", "three", "four", "five", start=start)
    job.refresh_from_db()
    assert LogLine.objects.filter(job=job).count() == 3
    assert job.log_lines_dropped == 2 and job.log_dropped_after == start + timedelta(seconds=3)
    route = f"/api/v1/jobs/{job.pk}/logs/"
    answer = teams["alice"].get(route)
    notice = answer.headers["Strata-Logs-Trimmed"]
    assert "2 lines from" in notice and "STRATA_MAX_LOG_LINES_PER_JOB" in notice
    detail = teams["alice"].get(f"/api/v1/jobs/{job.pk}/").json()["logs_trimmed"]
    assert detail["dropped"] == 2 and detail["trimmed"] == 0
    # The retention collector's trim: the lines before a time go, and the notice says how many and before when.
    cut = start + timedelta(seconds=2)
    assert log_search.trim_lines(job, cut) == 2
    job.refresh_from_db()
    assert job.log_lines_trimmed == 2 and job.log_trimmed_before == cut
    assert messages(teams["alice"].get(route).json()) == ["three"]
    notice = teams["alice"].get(route, {"grep": "three"}).headers["Strata-Logs-Trimmed"]
    assert f"logs trimmed: 2 lines before {cut.isoformat()} were removed by the retention policy" in notice
    # The trimmed lines are gone from the index too.
    assert messages(teams["alice"].get(SEARCH, {"q": "one"}).json()) == []
    assert teams["alice"].get(f"/api/v1/jobs/{teams['a2'].pk}/logs/").headers.get("Strata-Logs-Trimmed") is None
    assert teams["alice"].get(f"/api/v1/jobs/{teams['a2'].pk}/").json()["logs_trimmed"] is None


def test_index_follows_updates_and_deletes(teams):
    write(teams["a1"], "alpha bravo")
    line = LogLine.objects.get(job=teams["a1"])
    line.message = "charlie delta"
    line.save()
    alice = teams["alice"]
    assert messages(alice.get(SEARCH, {"q": "bravo"}).json()) == []
    assert messages(alice.get(SEARCH, {"q": "charlie"}).json()) == ["charlie delta"]
    teams["a1"].delete()
    assert messages(alice.get(SEARCH, {"q": "charlie"}).json()) == []


class ApiClientAdapter:
    """The CLI's REST client's calls, answered by the Django test client."""

    def __init__(self, api):
        self.api = api

    def get(self, path, params=None, **_kwargs):
        response = self.api.get(f"/api/v1/{path}", params or {})
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.content.decode()[:300])
        return response.json()


def cli_args(**given):
    values = {"job": None, "follow": False, "grep": None, "fixed": False, "icase": False, "search": None,
              "since": None, "until": None, "rank": None, "team": None, "limit": 50}
    return argparse.Namespace(**{**values, **given})


def test_cli_grep_and_search(teams, monkeypatch, capsys):
    write(teams["a1"], "[rank 0] loss 0.5", "[rank 1] loss nan", "[rank 1] done")
    write(teams["a2"], "loss nan again")
    monkeypatch.setattr(client_commands, "connect", lambda args: ApiClientAdapter(teams["alice"]))
    assert client_commands.logs(cli_args(job=str(teams["a1"].pk), grep="nan")) == 0
    assert capsys.readouterr().out == "[rank 1] loss nan\n"
    assert client_commands.logs(cli_args(job=str(teams["a1"].pk), rank="1")) == 0
    assert capsys.readouterr().out == "[rank 1] loss nan\n[rank 1] done\n"
    assert client_commands.logs(cli_args(search="loss nan")) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and {line.split("  ")[0] for line in out} == {str(teams["a1"].pk)[:8], str(teams["a2"].pk)[:8]}
    assert any("rank 1  [rank 1] loss nan" in line for line in out) and any("rank -  loss nan again" in line
                                                                           for line in out)
    assert client_commands.logs(cli_args(search="absent")) == 1
    assert client_commands.logs(cli_args()) == 2
    # The plain stream is as before.
    assert client_commands.logs(cli_args(job=str(teams["a2"].pk))) == 0
    assert capsys.readouterr().out == "loss nan again\n"


def test_cli_highlights_on_a_terminal():
    from strata.cli.log_commands import MARK, UNMARK, marked

    assert marked("loss nan", [[5, 8]], True) == f"loss {MARK}nan{UNMARK}"
    assert marked("loss nan", [[5, 8]], False) == "loss nan"


def test_query_parsing():
    groups = log_search.parse_words('loss "out of memory" -warmup OR cuda')
    assert log_search.fts5_expression(groups) == '(("loss" AND "out of memory") NOT "warmup") OR ("cuda")'
    assert log_search.fts5_expression(log_search.parse_words('say "hi')) == '("say" AND "hi")'
    with pytest.raises(log_search.QueryInvalid) as error:
        log_search.query_from({"q": "a OR -b"})
    assert set(error.value.errors) == {"q"}
    query = log_search.query_from({"grep": "x", "since": "2026-12-06T10:00:00", "until": "2026-12-07"})
    assert query.since.isoformat() == "2026-12-06T10:00:00+00:00" and query.until.isoformat().startswith("2026-12-07T00")


# -- SQLite's FTS5 statements, on sqlite3 itself -----------------------------------------------------------------

def test_sqlite_fts5_statements():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE jobs_logline (id INTEGER PRIMARY KEY, job_id TEXT, message TEXT NOT NULL)")
    db.executemany("INSERT INTO jobs_logline (id, job_id, message) VALUES (?, ?, ?)",
                   [(1, "a", "loss nan at step 5"), (2, "a", "nan nan loss nan nan"), (3, "b", "epoch done")])
    for statement in log_search.SQLITE_CREATE:  # created over existing lines: 'rebuild' indexes them
        db.execute(statement)

    def search(q):
        return [row[0] for row in db.execute(
            f"SELECT jobs_logline.id FROM jobs_logline, {log_search.SQLITE_TABLE} WHERE "
            f"{log_search.SQLITE_TABLE}.rowid = jobs_logline.id AND {log_search.SQLITE_TABLE} MATCH ? "
            f"ORDER BY bm25({log_search.SQLITE_TABLE})", [log_search.fts5_expression(log_search.parse_words(q))])]

    assert search("nan loss") == [2, 1]
    db.execute("INSERT INTO jobs_logline (id, job_id, message) VALUES (4, 'b', 'late nan')")
    db.execute("UPDATE jobs_logline SET message = 'epoch nan' WHERE id = 3")
    db.execute("DELETE FROM jobs_logline WHERE id = 1")
    assert sorted(search("nan")) == [2, 3, 4] and search("done") == []
    assert search('"epoch nan" -late') == [3]
    # A rebuilt table loses its triggers: the post-migrate check puts them back (tested through Django below).
    for statement in log_search.SQLITE_DROP:
        db.execute(statement)
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'jobs_logline_fts%'").fetchone() == (0,)


@pytest.mark.django_db
def test_sqlite_triggers_restored_after_a_table_rebuild():
    if connection.vendor != "sqlite":  # nothing to restore elsewhere (the statements: on sqlite3 above)
        assert log_search.ensure_sqlite_triggers() is None
        return
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER {log_search.SQLITE_TABLE}_insert")
    log_search.ensure_sqlite_triggers()
    with connection.cursor() as cursor:
        names = {row[0] for row in cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert f"{log_search.SQLITE_TABLE}_insert" in names


@pytest.mark.postgres
@pytest.mark.django_db
def test_postgres_uses_the_indexes(teams):
    write(teams["a1"], *[f"line {index} filler text" for index in range(50)], "needle in a haystack")
    lines = LogLine.objects.all()
    with connection.cursor() as cursor:
        # Only a bitmap scan is left to the planner (GIN indexes have no plain index scan), whatever the statistics
        # on a table this small say: a full scan of the primary key with a filter is ruled out too.
        cursor.execute("ANALYZE jobs_logline")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        plan = log_search.filtered(lines, log_search.query_from({"q": "needle"})).explain()
        assert log_search.PG_FTS_INDEX in plan, plan
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        if cursor.fetchone():
            plan = LogLine.objects.filter(log_search._grep_filter(
                log_search.query_from({"grep": "eedle i"}), "postgresql")).explain()
            assert log_search.PG_TRGM_INDEX in plan, plan


# -- the dashboard ------------------------------------------------------------------------------------------------

@pytest.fixture
def browser(teams, client):
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="vera"))  # a viewer reads the team's logs
    return client


def test_dashboard_search_page(teams, browser):
    write(teams["a1"], "[rank 2] loss nan <b>bold</b>", "epoch done")
    write(teams["b1"], "loss nan elsewhere")
    page = browser.get("/logs/", {"q": "loss nan"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "<mark>loss</mark> <mark>nan</mark> &lt;b&gt;bold&lt;/b&gt;" in html  # marked, and escaped
    assert "elsewhere" not in html and "1 line" in html
    html = browser.get("/logs/", {"grep": "(", "since": "soon"}).content.decode()
    assert 'data-error="grep"' in html and 'data-error="since"' in html
    # The job page's logs panel: a search box scoped to the job; a trimmed notice when lines were not kept.
    job = teams["a1"]
    detail = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="log-search"' in detail and f'name="job" value="{job.pk}"' in detail and "logs-trimmed" not in detail
    log_search.trim_lines(job, timezone.now())
    detail = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "logs trimmed: 2 lines before" in detail
    scoped = browser.get("/logs/", {"job": str(job.pk), "grep": "done"}).content.decode()
    assert "logs trimmed: 2 lines before" in scoped and "No lines found." in scoped
    # Another team's job named: nothing of it.
    other = browser.get("/logs/", {"job": str(teams["b1"].pk), "grep": "loss"}).content.decode()
    assert "elsewhere" not in other


def test_retention_collector_trims_old_lines_of_ended_jobs(teams, settings):
    from strata.jobs.models import JobState
    from strata.quotas.retention import retention_collect

    now = timezone.now()
    ended, running = teams["a1"], teams["a2"]
    Job.objects.filter(pk__in=[ended.pk, running.pk]).update(created_at=now - timedelta(days=10))
    Job.objects.filter(pk=ended.pk).update(state=JobState.SUCCEEDED, finished_at=now - timedelta(days=1))
    Job.objects.filter(pk=running.pk).update(state=JobState.RUNNING)
    for job in (ended, running):
        write(job, "old one", "old two", start=now - timedelta(days=9))
        write(job, "fresh", start=now - timedelta(days=1, hours=1))
    settings.STRATA_RETENTION_LOG_DAYS = None
    assert retention_collect(now).log_lines == 0
    settings.STRATA_RETENTION_LOG_DAYS = 7
    assert retention_collect(now).log_lines == 2
    assert list(LogLine.objects.filter(job=ended).values_list("message", flat=True)) == ["fresh"]
    assert LogLine.objects.filter(job=running).count() == 3  # a job that has not ended keeps its lines
    ended.refresh_from_db()
    assert ended.log_lines_trimmed == 2 and ended.log_trimmed_before == now - timedelta(days=7)
    assert "2 lines before" in teams["alice"].get(f"/api/v1/jobs/{ended.pk}/logs/").headers["Strata-Logs-Trimmed"]
    assert retention_collect(now).log_lines == 0  # again: nothing more
    # Once the cutoff passed the job's end, the job is not looked at again.
    later = now + timedelta(days=7)
    assert retention_collect(later).log_lines == 1
    assert log_search.collect_lines(later + timedelta(days=1), 7) == 0
    ended.refresh_from_db()
    assert ended.log_lines_trimmed == 3


def test_migration_fills_the_ranks_of_existing_lines(teams):
    import importlib
    from types import SimpleNamespace

    from django.apps import apps

    migration = importlib.import_module("strata.jobs.migrations.0019_log_search")
    write(teams["a1"], "[rank 4] old line", "no rank", "[rank x] not a rank")
    LogLine.objects.update(rank=None)  # as lines stored before the migration
    migration.ranks_forward(apps, SimpleNamespace(connection=connection))
    assert list(LogLine.objects.order_by("id").values_list("rank", flat=True)) == [4, None, None]
