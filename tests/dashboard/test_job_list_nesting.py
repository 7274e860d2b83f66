"""The job list shows child jobs under their parent (collapsed, with a toggle), paginated over the top-level
rows: a sweep's trials never crowd the top of the list."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dashboard.views import jobs as job_views
from strata.jobs.models import Job, JobState


@pytest.fixture
def world(make_team, make_user):
    team = make_team("alpha")
    alice = make_user("alice", team)
    client = Client()
    client.force_login(alice)
    return {"team": team, "alice": alice, "client": client}


def make(world, name, *, parent=None, state=JobState.QUEUED, kind="train", age=0):
    job = Job.objects.create(team=world["team"], owner=world["alice"], kind=kind, name=name, spec={},
                             resources={"gpus": 1}, parent=parent, nested=parent is not None, state=state)
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(seconds=1000 - age))
    return job


def rows(html: str) -> list[tuple[str, str | None, bool]]:
    """(job id, parent id or None, hidden) of every row, in order."""
    found = []
    for match in re.finditer(r'<tr data-job-id="([0-9a-f-]{36})"([^>]*)>', html):
        attrs = match.group(2)
        parent = re.search(r'data-parent-id="([0-9a-f-]{36})"', attrs)
        found.append((match.group(1), parent.group(1) if parent else None, " hidden" in attrs))
    return found


def test_children_come_collapsed_under_their_parent(world):
    sweep = make(world, "sweep", kind="sweep-kind", state=JobState.RUNNING, age=1)
    trials = [make(world, f"trial-{i}", parent=sweep, age=10 + i) for i in range(3)]  # newer than the sweep
    grandchild = make(world, "replica", parent=trials[0], age=20)
    lone = make(world, "lone", age=30)  # the newest top-level job
    html = world["client"].get("/jobs/").content.decode()
    assert rows(html) == [
        (str(lone.pk), None, False), (str(sweep.pk), None, False),
        (str(trials[0].pk), str(sweep.pk), True), (str(grandchild.pk), str(trials[0].pk), True),
        (str(trials[1].pk), str(sweep.pk), True), (str(trials[2].pk), str(sweep.pk), True)]
    assert f'data-toggle="{sweep.pk}" aria-expanded="false"' in html and "▸ 3</button>" in html
    assert f'data-toggle="{trials[0].pk}"' in html and f'data-toggle="{lone.pk}"' not in html
    assert 'data-range="1–2 of 2 jobs"' in html  # counted over the top-level rows
    assert 'style="--depth: 2"' in html  # the grandchild is indented one more level
    # The live rows endpoint answers the same rows.
    assert rows(world["client"].get("/jobs/rows/").content.decode()) == rows(html)


def test_listing_one_jobs_children_shows_them_flat(world):
    sweep = make(world, "sweep", state=JobState.RUNNING)
    trials = [make(world, f"trial-{i}", parent=sweep, age=10 + i) for i in range(2)]
    html = world["client"].get(f"/jobs/?parent={sweep.pk}").content.decode()
    assert rows(html) == [(str(trials[1].pk), None, False), (str(trials[0].pk), None, False)]


def test_a_filtered_child_whose_parent_is_filtered_out_is_a_row_of_its_own(world):
    sweep = make(world, "sweep", state=JobState.SUCCEEDED)
    running = make(world, "trial-running", parent=sweep, state=JobState.RUNNING, age=5)
    make(world, "trial-done", parent=sweep, state=JobState.SUCCEEDED, age=6)
    html = world["client"].get("/jobs/?state=RUNNING").content.decode()
    assert rows(html) == [(str(running.pk), None, False)]
    html = world["client"].get("/jobs/?state=SUCCEEDED").content.decode()
    assert [parent for _, parent, _ in rows(html)] == [None, str(sweep.pk)]


def test_pages_hold_top_level_jobs_with_their_children(world, monkeypatch):
    monkeypatch.setattr(job_views, "PAGE_SIZE", 2)
    monkeypatch.setattr(job_views, "CHILD_ROWS", 3)
    parents = [make(world, f"sweep-{i}", age=i * 10) for i in range(3)]
    for i in range(5):
        make(world, f"trial-{i}", parent=parents[2], age=100 + i)
    first = rows(world["client"].get("/jobs/").content.decode())
    second = rows(world["client"].get("/jobs/?page=2").content.decode())
    assert [job for job, parent, _ in first if parent is None] == [str(parents[2].pk), str(parents[1].pk)]
    assert sum(parent == str(parents[2].pk) for _, parent, _ in first) == 3  # at most CHILD_ROWS listed
    assert [job for job, _, _ in second] == [str(parents[0].pk)]
    html = world["client"].get("/jobs/").content.decode()
    assert f'href="/jobs/?parent={parents[2].pk}">all 5 child jobs</a>' in html and "▸ 5</button>" in html
