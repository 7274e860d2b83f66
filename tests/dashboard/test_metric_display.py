"""How the job page shows numbers: one rule for significant digits (metrics, panel tables, chart hovers), a metric
with fewer than two steps as a value rather than an empty chart, and no chart at all for a parent job that has
no points of its own."""

from __future__ import annotations

import json
import re
from typing import ClassVar

import pytest
from django.test import Client

from components.runtime.contract import registry
from components.runtime.contract.panels import Panel
from dashboard.figures import HOVER_FORMAT, number_text
from dashboard.job_figures import split_series
from strata.jobs.models import Job, JobState, MetricPoint


@pytest.fixture
def viewer(make_team, make_user, submit):
    team = make_team("alpha")
    alice = make_user("alice", team)
    client = Client()
    client.force_login(alice)
    return client, submit(alice, team, name="measured"), alice, team


def embedded(html: str, script_id: str):
    match = re.search(rf'<script type="application/json" id="{re.escape(script_id)}">(.*?)</script>', html, re.S)
    return json.loads(match.group(1)) if match else None


def values_card(html: str) -> str:
    return re.search(r'<section class="card" id="metric-values".*?</section>', html, re.S).group(0)


@pytest.mark.parametrize(("value", "text"), [
    (0.2785515320334262, "0.2786"), (1.23456e-05, "1.235e-05"), (8.0, "8"), (7, "7"), (12345.6, "12346"),
    (123.456, "123.5"), (-0.5, "-0.5"), (float("nan"), "—"), (float("inf"), "—"), (None, "—"), (True, "—"),
])
def test_one_rule_for_significant_digits(value, text):
    assert number_text(value) == text
    assert HOVER_FORMAT == ".4~g"  # plotly's hover labels follow the same number of digits


def test_split_series_keeps_lines_of_two_steps_or_more():
    lines, values = split_series({"loss": ([1, 2], [0.5, 0.25]), "once": ([3], [0.2785515320334262]),
                                  "same_step": ([4, 4], [1.0, 2.0]), "gaps": ([1, 2], [None, 0.5]),
                                  "nothing": ([1], [None])})
    assert list(lines) == ["loss"]
    assert [(v["name"], v["step"], v["text"]) for v in values] == [
        ("once", 3, "0.2786"), ("same_step", 4, "2"), ("gaps", 2, "0.5"), ("nothing", 1, "—")]


def test_a_metric_reported_once_is_a_value_not_an_empty_chart(viewer):
    client, job, *_ = viewer
    MetricPoint.objects.create(job=job, name="grad_norm", step=7, value=0.2785515320334262)
    for step in (1, 2, 3):
        MetricPoint.objects.create(job=job, name="loss", step=step, value=1 / step)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert embedded(html, "fig-other") is None and 'id="chart-other"' not in html  # no empty chart
    assert [trace["name"] for trace in embedded(html, "fig-loss")["data"]] == ["loss"]
    card = values_card(html)
    assert "hidden" not in card.split(">", 1)[0]
    assert 'data-metric="grad_norm"' in card and "<dd class=\"num\">0.2786 <span" in card and "at step 7" in card
    assert "0.2785515" not in card
    points = json.loads(re.search(r'data-points="([^"]*)"', card).group(1).replace("&quot;", '"'))
    assert points == {"x": [7], "y": [0.278552]}  # what the page script needs to draw it once a second step comes
    assert embedded(html, "fig-loss")["layout"]["yaxis"]["hoverformat"] == HOVER_FORMAT
    # The live endpoint sends the newest value as shown, for the page to update the value.
    cursor = embedded(html, "job-live-config")["cursors"]["metrics"]
    MetricPoint.objects.create(job=job, name="grad_norm", step=7, value=0.31234567)
    live = client.get(f"/jobs/{job.pk}/live/?metrics_after={cursor}").json()
    assert live["metrics"]["grad_norm"]["text"] == "0.3123"
    # With a second step it is a line.
    MetricPoint.objects.create(job=job, name="grad_norm", step=8, value=0.25)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert [trace["name"] for trace in embedded(html, "fig-other")["data"]] == ["grad_norm"]
    assert 'id="metric-values" hidden' in html


def test_a_parent_without_points_of_its_own_shows_no_chart(viewer):
    client, job, alice, team = viewer
    Job.objects.create(team=team, owner=alice, kind="train", name="trial-0", spec={}, resources={},
                       parent=job, nested=True, state=JobState.RUNNING)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'class="chart"' not in html.split('id="panels"')[0]
    assert "No metrics of its own yet" in html
    assert 'id="metric-values" hidden' in html


class RungTable(Panel):
    slug: ClassVar[str] = "rung-table"
    title: ClassVar[str] = "Rungs"

    def render(self, data):
        return {"table": {"columns": ["iteration", "trials", "best there", "note"],
                          "rows": [[1, 9, 0.2785515320334262, "kept"], [3, 3, float("nan"), None]]}}


def test_panel_tables_show_numbers_by_the_same_rule(viewer, monkeypatch):
    client, job, *_ = viewer
    monkeypatch.setattr(registry, "panels",
                        lambda placement: [(None, "p:Rungs", RungTable, None)] if placement == "job" else [])
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    section = re.search(r'<section class="card panel" data-panel="rung-table".*?</section>', html, re.S).group(0)
    assert "<td>0.2786</td>" in section and "0.2785515" not in section
    assert "<td>1</td><td>9</td>" in section and "<td>kept</td>" in section and "<td>—</td>" in section
    live = client.get(f"/jobs/{job.pk}/live/?panels=1").json()
    assert live["panels"][0]["table"]["rows"] == [[1, 9, "0.2786", "kept"], [3, 3, None, None]]
