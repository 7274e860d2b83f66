"""The job tree in the web UI: a parent's page lists its child jobs (name, state, link) and links to the jobs list
filtered to them; a child's page links to its parent; the list (and its live rows) filters by parent."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from strata.jobs.models import Job


@pytest.fixture
def tree(make_team, make_user, submit):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    parent = submit(alice, alpha, name="sweep")
    children = [submit(alice, alpha, name=f"trial-{number}") for number in range(3)]
    Job.objects.filter(pk__in=[child.pk for child in children]).update(parent=parent)
    other = submit(alice, alpha, name="unrelated")
    foreign = submit(bob, beta, name="beta-sweep")
    foreign_child = submit(bob, beta, name="beta-trial")
    Job.objects.filter(pk=foreign_child.pk).update(parent=foreign)
    client = Client()
    client.force_login(alice)
    return {"parent": parent, "children": children, "other": other, "foreign": foreign, "client": client}


def row_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-job-id="([0-9a-f-]{36})"', html)


def test_the_parent_page_lists_its_children_and_the_child_page_links_its_parent(tree):
    client, parent, children = tree["client"], tree["parent"], tree["children"]
    page = client.get(f"/jobs/{parent.pk}/").content.decode()
    listed = re.search(r'<dd id="job-children">(.*?)</dd>', page, re.S).group(1)
    assert re.findall(r'href="/jobs/([0-9a-f-]{36})/"', listed) == [str(child.pk) for child in children]
    assert "trial-0" in listed and 'data-state="QUEUED"' in listed
    assert f'href="/jobs/?parent={parent.pk}"' in listed
    assert 'id="job-parent"' not in page

    page = client.get(f"/jobs/{children[0].pk}/").content.decode()
    assert re.search(rf'<dd id="job-parent"><a href="/jobs/{parent.pk}/">sweep</a></dd>', page)
    assert 'id="job-children"' not in page
    live = client.get(f"/jobs/{children[0].pk}/live/").json()
    assert f'href="/jobs/{parent.pk}/"' in live["facts_html"]


def test_the_jobs_list_filters_by_parent(tree):
    client, parent, children = tree["client"], tree["parent"], tree["children"]
    page = client.get(f"/jobs/?parent={parent.pk}").content.decode()
    assert sorted(row_ids(page)) == sorted(str(child.pk) for child in children)
    assert re.search(rf'id="filter-parent">Children of <a href="/jobs/{parent.pk}/">sweep</a>', page)
    assert f'name="parent" value="{parent.pk}"' in page and 'id="filter-clear"' in page
    rows = client.get(reverse("dashboard:job-rows") + f"?parent={parent.pk}&state=QUEUED").content.decode()
    assert sorted(row_ids(rows)) == sorted(str(child.pk) for child in children)

    # Another team's tree and a malformed id show nothing.
    page = client.get(f"/jobs/?parent={tree['foreign'].pk}").content.decode()
    assert row_ids(page) == [] and "an unknown job" in page and "beta-sweep" not in page
    assert row_ids(client.get("/jobs/?parent=nope").content.decode()) == []
    assert str(tree["other"].pk) in row_ids(client.get("/jobs/").content.decode())
