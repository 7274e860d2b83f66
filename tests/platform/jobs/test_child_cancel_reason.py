"""A parent that stops a child says why: the reason it passes to ``ctx.children.cancel`` is what the child's job
shows (API, job list, job page), also after the child's attempt has ended; without one the job says which parent
cancelled it."""

from __future__ import annotations

import html

from django.test import Client

from strata.jobs.models import Attempt, Job, JobState

CHILD = {"kind": "train", "name": "trial-3", "resources": {"gpus": 0.5},
         "spec": {"workload": "mlp-digits", "epochs": 1}}
WHY = "stopped early by the sweep's scheduler at iteration 1: 0.2786 under the cutoff 0.35"


def test_a_placed_child_cancelled_with_a_reason_shows_it(make_team, make_user, make_token, make_node,
                                                          node_protocol, api, submit, run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=2)
    parent = submit(user, team, gpus=1.0, name="sweep")
    run_pass()
    attempt = Attempt.objects.get(job=parent, ended_at__isnull=True)
    protocol = node_protocol(attempt, node)
    answer = protocol.post("children", {"job": CHILD, "nested": True, "idempotency_key": "t3"})
    assert answer.status_code == 201, answer.content
    child = Job.objects.get(pk=answer.json()["id"])
    run_pass()
    child_attempt = Attempt.objects.get(job=child, ended_at__isnull=True)
    child_protocol = node_protocol(child_attempt, node)  # the child runs on its node
    assert child_protocol.report(state="RUNNING").status_code in {200, 204}
    child.refresh_from_db()
    assert child.state == JobState.RUNNING

    cancelled = protocol.post(f"children/{child.pk}/cancel", {"reason": WHY})
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["state"] == "CANCELLED" and cancelled.json()["reason"] == WHY
    # The node confirms the child process is gone: the reason stays the parent's.
    assert child_protocol.finish("failed", reason="stopped at the control plane's request").status_code == 200
    child.refresh_from_db()
    assert child.state == JobState.CANCELLED and child.reason == WHY

    client = api(make_token(user, team))
    assert client.get(f"/api/v1/jobs/{child.pk}/").json()["reason"] == WHY
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/jobs/{child.pk}/")
    assert page.status_code == 200 and html.escape(WHY) in page.content.decode()
    assert "cancelled by its parent" not in page.content.decode()


def test_without_a_reason_the_child_names_its_parent(make_team, make_user, make_node, node_protocol, submit,
                                                     run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    node = make_node("n1", gpus=2)
    parent = submit(user, team, gpus=1.0, name="sweep")
    run_pass()
    protocol = node_protocol(Attempt.objects.get(job=parent, ended_at__isnull=True), node)
    child_id = protocol.post("children", {"job": CHILD}).json()["id"]
    answer = protocol.post(f"children/{child_id}/cancel")
    assert answer.status_code == 200 and answer.json()["reason"] == f"cancelled by its parent {parent.pk}"
    too_long = protocol.post(f"children/{child_id}/cancel", {"reason": "x" * 301})
    assert too_long.status_code == 400 and "reason" in too_long.json()
