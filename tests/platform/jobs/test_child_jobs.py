"""Child jobs: a running job submits, lists and cancels jobs of its own team through fenced node routes, under
the same validation and quota; cancelling or ending the parent takes its children; the API and page show the
tree."""

from __future__ import annotations

import pytest
from django.test import Client

from strata.jobs.models import Attempt, Job, JobState

CHILD = {"kind": "train", "name": "trial-1", "resources": {"gpus": 0.5},
         "spec": {"workload": "mlp-digits", "epochs": 1}}


@pytest.fixture
def running(make_team, make_user, make_token, make_node, node_protocol, api, submit, run_pass):
    team, other = make_team("alpha"), make_team("beta")
    user = make_user("alice", team)
    node = make_node("n1", gpus=2)
    parent = submit(user, team, gpus=1.0, name="sweep")
    run_pass()
    attempt = Attempt.objects.get(job=parent, ended_at__isnull=True)
    return {"team": team, "other": other, "user": user, "parent": parent, "attempt": attempt,
            "node_protocol": node_protocol(attempt, node), "client": api(make_token(user, team)), "node": node}


def post_child(running, body, **extra):
    return running["node_protocol"].post("children", {"job": body, **extra})


def test_a_running_job_submits_lists_and_cancels_children(running):
    answer = post_child(running, CHILD, idempotency_key="trial-1")
    assert answer.status_code == 201, answer.content
    child = Job.objects.get(pk=answer.json()["id"])
    assert child.parent_id == running["parent"].pk and child.team == running["team"]
    assert child.owner == running["user"] and child.state in {JobState.QUEUED, JobState.PENDING}
    again = post_child(running, CHILD, idempotency_key="trial-1")  # a retry is the same child
    assert again.status_code == 200 and again.json()["id"] == str(child.pk)
    listed = running["node_protocol"].get("children")
    assert [item["id"] for item in listed.json()] == [str(child.pk)]
    cancelled = running["node_protocol"].post(f"children/{child.pk}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "CANCELLED"

    # The API shows the tree and filters by parent.
    client = running["client"]
    parent = client.get(f"/api/v1/jobs/{running['parent'].pk}/").json()
    assert parent["children"] == [{"id": str(child.pk), "name": "trial-1", "kind": "train", "state": "CANCELLED"}]
    assert client.get(f"/api/v1/jobs/{child.pk}/").json()["parent"] == str(running["parent"].pk)
    assert [job["id"] for job in client.get(f"/api/v1/jobs/?parent={running['parent'].pk}").json()["results"]] == \
        [str(child.pk)]
    assert client.get("/api/v1/jobs/?parent=nope").status_code == 400


def test_a_bad_child_names_every_field_and_stale_or_foreign_calls_are_refused(running):
    bad = post_child(running, {"kind": "train", "resources": {"gpus": -1}, "spec": {"epochs": 0}})
    assert bad.status_code == 400
    errors = bad.json()["job"]
    assert "resources.gpus" in str(errors) or "resources" in errors
    assert any(key.startswith("spec") for key in errors), errors
    assert post_child(running, {**CHILD, "team": "beta"}).status_code == 400  # a child stays in its parent's team
    wrong = running["node_protocol"].post("children", {"job": CHILD}, token="0" * 32)
    assert wrong.status_code == 409  # fenced like every attempt route
    other_job = Job.objects.create(team=running["other"], owner=running["user"], kind="train", name="x", spec={},
                                   resources={}, state=JobState.QUEUED)
    missing = running["node_protocol"].post(f"children/{other_job.pk}/cancel")
    assert missing.status_code == 404  # not this job's child
    assert Job.objects.get(pk=other_job.pk).state == JobState.QUEUED


def test_cancelling_or_ending_the_parent_takes_its_children(running):
    from strata.jobs.services import job_cancel

    first = Job.objects.get(pk=post_child(running, CHILD).json()["id"])
    grandchild = Job.objects.create(team=running["team"], owner=running["user"], kind="train", name="g", spec={},
                                    resources={}, state=JobState.QUEUED, parent=first)
    job_cancel(running["parent"])
    assert Job.objects.get(pk=first.pk).state == JobState.CANCELLED
    assert Job.objects.get(pk=grandchild.pk).state == JobState.CANCELLED
    assert "parent job" in Job.objects.get(pk=first.pk).reason


def test_a_parent_that_succeeds_ends_its_children_and_the_page_shows_the_tree(running):
    child = Job.objects.get(pk=post_child(running, CHILD).json()["id"])
    finished = running["node_protocol"].finish("succeeded")
    assert finished.status_code == 200
    assert Job.objects.get(pk=child.pk).state == JobState.CANCELLED
    assert post_child(running, CHILD).status_code == 409  # an ended attempt submits nothing

    browser = Client()
    browser.force_login(running["user"])
    page = browser.get(f"/jobs/{running['parent'].pk}/").content.decode()
    assert 'id="job-children"' in page and f'href="/jobs/{child.pk}/"' in page
    page = browser.get(f"/jobs/{child.pk}/").content.decode()
    assert 'id="job-parent"' in page and f'href="/jobs/{running["parent"].pk}/"' in page


def test_children_are_admitted_under_the_teams_quota(running):
    from strata.quotas.models import Quota

    Quota.objects.filter(team=running["team"]).update(max_gpus=1.5)  # the parent holds 1.0
    never = post_child(running, {**CHILD, "resources": {"gpus": 2}})
    assert never.status_code == 400 and "resources" in never.json(), never.content  # can never fit: refused
    first = post_child(running, CHILD)
    assert first.status_code == 201 and first.json()["state"] in {"QUEUED", "SCHEDULED"}
    second = post_child(running, {**CHILD, "name": "trial-2"})
    assert second.status_code == 201 and second.json()["state"] == "PENDING"  # waits for room, like any job
    assert "max_gpus" in second.json()["reason"]
    listed = running["node_protocol"].get("children").json()
    assert [item["name"] for item in listed] == ["trial-1", "trial-2"]
    assert listed[0]["state"] in {"QUEUED", "SCHEDULED"} and listed[1]["state"] == "PENDING"
