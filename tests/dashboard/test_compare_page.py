"""The compare page (``/compare/?jobs=a,b``): a chart per metric with a trace per job, the runs table (state,
attempts, duration, GPUs, GPU- and CPU-time, final metrics) and the spec diff; the job list's checkboxes and
Compare button, and the redirects to the shareable address; errors as pages (400, 404 naming the job)."""

from __future__ import annotations

import html as html_module
import json
import re
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from strata.cluster.models import Device
from strata.jobs.models import Allocation, Attempt, Job, JobState, MetricPoint

T0 = timezone.now().replace(microsecond=0) - timedelta(hours=3)


def embedded(html: str, script_id: str):
    match = re.search(rf'<script type="application/json" id="{re.escape(script_id)}">(.*?)</script>', html, re.S)
    assert match, f"no <script id={script_id}>"
    return json.loads(match.group(1))


def cells(html: str, row_attribute: str) -> list[str]:
    match = re.search(rf"<tr {row_attribute}>(.*?)</tr>", html, re.S)
    assert match, row_attribute
    texts = [re.sub(r"<[^>]+>", " ", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", match.group(1), re.S)]
    return [html_module.unescape(" ".join(text.split())) for text in texts]


@pytest.fixture
def world(make_team, make_user, make_node):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, vera, bob = make_user("alice", alpha), make_user("vera", alpha, role="viewer"), make_user("bob", beta)
    cpu = Device.objects.get(node=make_node("node-1", gpus=1, cpus=4, host_memory=8 * 2**30), kind=Device.Kind.CPU)

    def job(team, owner, name, spec, resources, **fields):
        return Job.objects.create(team=team, owner=owner, kind="train", name=name, spec=spec, resources=resources,
                                  **fields)

    parent = job(alpha, alice, "sweep", {"workload": "mlp-digits"}, {"gpus": 1.0, "workers": 1})
    fast = job(alpha, alice, "fast", {"workload": "mlp-digits", "lr": 0.1}, {"gpus": 1.0, "workers": 1},
               state=JobState.SUCCEEDED, started_at=T0, finished_at=T0 + timedelta(seconds=90), parent=parent)
    slow = job(alpha, alice, "slow", {"workload": "mlp-digits", "lr": 0.001}, {"gpus": 1.0, "workers": 1, "cpus": 2.0},
               state=JobState.RUNNING, started_at=T0, parent=parent)
    first = Attempt.objects.create(job=fast, number=1, fencing_token="a", gpu_share=1.0, dispatched_at=T0,
                                   ended_at=T0 + timedelta(seconds=7200), outcome=Attempt.Outcome.SUCCEEDED)
    second = Attempt.objects.create(job=slow, number=1, fencing_token="b", gpu_share=0.0, dispatched_at=T0,
                                    ended_at=T0 + timedelta(seconds=30))
    Allocation.objects.create(attempt=second, device=cpu, share=2.0, memory=0)
    assert first.pk
    MetricPoint.objects.bulk_create([
        MetricPoint(job=fast, name="loss", step=0, value=1.0), MetricPoint(job=fast, name="loss", step=1, value=0.2),
        MetricPoint(job=slow, name="loss", step=0, value=1.5), MetricPoint(job=slow, name="loss", step=1, value=0.9),
        MetricPoint(job=slow, name="accuracy", step=1, value=0.7),
    ])
    foreign = job(beta, bob, "beta-secret", {"workload": "mlp-digits"}, {"gpus": 1.0, "workers": 1})
    client = Client()
    client.force_login(alice)
    viewer = Client()
    viewer.force_login(vera)
    return {"parent": parent, "fast": fast, "slow": slow, "foreign": foreign, "client": client, "viewer": viewer}


def url(*jobs) -> str:
    return "/compare/?jobs=" + ",".join(str(job.pk) for job in jobs)


def test_the_page_overlays_the_metrics_and_tables_the_runs_and_the_diff(world):
    fast, slow = world["fast"], world["slow"]
    response = world["client"].get(url(fast, slow))
    assert response.status_code == 200
    html = response.content.decode()
    # One chart per metric, losses first, one trace per job named with its short id, in the job's colour.
    assert re.findall(r'data-metric="([^"]+)"', html) == ["loss", "accuracy"]
    loss = embedded(html, "fig-compare-0")
    assert [trace["name"] for trace in loss["data"]] == [f"fast ({str(fast.pk)[:8]})", f"slow ({str(slow.pk)[:8]})"]
    assert [trace["y"] for trace in loss["data"]] == [[1.0, 0.2], [1.5, 0.9]]
    assert loss["data"][0]["line"]["color"] != loss["data"][1]["line"]["color"]
    accuracy = embedded(html, "fig-compare-1")
    assert [trace["name"] for trace in accuracy["data"]] == [f"slow ({str(slow.pk)[:8]})"]
    assert loss["data"][0]["mode"] == "lines" and accuracy["data"][0]["mode"] == "lines+markers"  # one point: a marker
    assert accuracy["data"][0]["line"]["color"] == loss["data"][1]["line"]["color"]  # a job keeps its colour
    assert 'id="chart-compare-0" class="chart" data-figure="fig-compare-0"' in html
    assert "/assets/plotly.min.js" in html
    # The runs table: job, state, kind, team, attempts, duration, GPUs, GPU time, CPU time, final accuracy, loss.
    assert cells(html, f'data-compare-job="{fast.pk}"') == [
        f"fast {str(fast.pk)[:8]}", "SUCCEEDED", "train", "alpha", "1", "1m 30s", "1", "2.00 GPU-h", "0 CPU-s",
        "—", "0.2"]
    slow_cells = cells(html, f'data-compare-job="{slow.pk}"')
    assert slow_cells[1:5] == ["RUNNING", "train", "alpha", "1"]
    assert slow_cells[7:] == ["0 GPU-s", "60 CPU-s", "0.7", "0.9"]
    # The diff: the paths that differ, with each job's value ("—" where a job has none).
    assert cells(html, 'data-path="spec.lr"') == ["spec.lr", "0.1", "0.001"]
    assert cells(html, 'data-path="resources.cpus"') == ["resources.cpus", "—", "2.0"]
    assert 'data-path="spec.workload"' not in html
    assert f"strata compare {fast.pk} {slow.pk}" in html
    assert f'href="/api/v1/compare/?jobs={fast.pk}%2C{slow.pk}"' in html


def test_a_viewer_may_compare_and_alike_jobs_show_no_diff(world):
    parent = world["parent"]
    twin = Job.objects.create(team=parent.team, owner=parent.owner, kind=parent.kind, name="twin", spec=parent.spec,
                              resources=parent.resources)
    response = world["viewer"].get(url(parent, twin))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="compare-same"' in html and 'id="compare-diff"' not in html
    assert 'id="charts-empty"' in html and "plotly.min.js" not in html  # no metrics: no charts
    assert world["viewer"].get(url(parent, world["foreign"])).status_code == 404


def test_errors_are_pages_naming_the_problem(world):
    fast = world["fast"]
    one = world["client"].get(url(fast))
    assert one.status_code == 400 and "at least 2" in one.content.decode()
    bad = world["client"].get(f"/compare/?jobs={fast.pk},nope")
    assert bad.status_code == 400 and "not job ids" in html_module.unescape(bad.content.decode())
    foreign = world["client"].get(url(fast, world["foreign"]))
    assert foreign.status_code == 404 and str(world["foreign"].pk) in foreign.content.decode()
    assert "beta-secret" not in foreign.content.decode()
    missing = uuid.uuid4()
    assert str(missing) in world["client"].get(f"/compare/?jobs={fast.pk},{missing}").content.decode()
    assert Client().get(url(fast, world["slow"])).status_code == 302  # to the login page


def test_the_lists_form_and_a_parent_redirect_to_the_shareable_address(world):
    fast, slow = world["fast"], world["slow"]
    response = world["client"].get(f"/compare/?jobs={fast.pk}&jobs={slow.pk}")
    assert response.status_code == 302 and response["Location"] == f"/compare/?jobs={fast.pk}%2C{slow.pk}"
    children = world["client"].get(f"/compare/?parent={world['parent'].pk}")
    assert children.status_code == 302 and children["Location"] == f"/compare/?jobs={fast.pk}%2C{slow.pk}"
    assert world["client"].get(children["Location"]).status_code == 200
    other = world["client"].get(f"/compare/?parent={world['foreign'].pk}")  # another team's job
    assert other.status_code == 404 and str(world["foreign"].pk) in other.content.decode()
    lonely = world["client"].get(f"/compare/?parent={fast.pk}")
    assert lonely.status_code == 400 and "has 0 child jobs" in lonely.content.decode()


def test_the_job_list_has_checkboxes_and_a_compare_button(world):
    html = world["client"].get("/jobs/").content.decode()
    assert '<form id="compare-form"' in html and 'action="/compare/"' in html and 'id="compare-jobs"' in html
    boxes = re.findall(r'<input type="checkbox" class="pick-job" name="jobs" value="([0-9a-f-]{36})" form="compare-form"',
                       html)
    assert set(boxes) == {str(world[name].pk) for name in ("parent", "fast", "slow")}
    assert "dashboard/compare.js" in html
    rows = world["client"].get("/jobs/rows/").content.decode()  # the live rows keep them
    assert rows.count('class="pick-job"') == 3
    detail = world["client"].get(f"/jobs/{world['parent'].pk}/").content.decode()
    assert f'href="/compare/?parent={world["parent"].pk}" id="job-children-compare"' in detail
