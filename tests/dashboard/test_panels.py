"""Component panels on the job detail page, and the train kind's run summary panel."""

from __future__ import annotations

import re
from typing import ClassVar

import pytest
from django.test import Client

from components.runtime.contract import registry
from components.runtime.contract.panels import Panel, PanelData
from components.runtime.contract.plugins import Plugin
from components.train.panels import TrainSummaryPanel
from strata.jobs.models import MetricPoint


class FakeData(PanelData):
    def __init__(self, metrics, job=None, events=()):
        self._metrics, self.job, self._events = metrics, job, list(events)

    def metrics(self, names=None):
        return {name: [(step, value, 0.0) for step, value in points] for name, points in self._metrics.items()}

    def events(self, kind=None):
        return [event for event in self._events if kind is None or event["kind"] == kind]

    def devices(self):
        return []


def rows_of(rendered) -> dict[str, str]:
    return {label: value for label, value in rendered["table"]["rows"]}


def test_train_summary_is_a_table_derived_from_metrics():
    data = FakeData(
        {"loss": [(10, 2.0), (20, 1.5), (30, 1.7)], "accuracy": [(10, 0.2), (20, 0.5), (30, 0.4)],
         "samples_per_s": [(10, 900.0), (20, 1234.4), (30, float("nan"))],
         "test_loss": [(20, 1.6)], "test_accuracy": [(20, 0.61)]},
        job={"state": "RUNNING", "spec": {"workload": "mlp-digits", "epochs": 3, "checkpoint_every": 15},
             "attempts": [{}, {}]},
    )
    rendered = TrainSummaryPanel().render(data)
    rows = rows_of(rendered)
    assert rows["Workload"] == "mlp-digits"
    assert rows["Steps done"] == "30"
    assert rows["Epochs"] == "1 of 3 evaluated"
    assert rows["Training loss (last)"] == "1.7 at step 30"
    assert rows["Training loss (best)"] == "1.5 at step 20"
    assert rows["Best test_loss"] == "1.6 at step 20"
    assert rows["Best test_accuracy"] == "61.00% at step 20"
    assert rows["Best accuracy"] == "50.00% at step 20"
    labels = [label for label, _ in rendered["table"]["rows"]]
    assert labels.index("Best test_accuracy") < labels.index("Best accuracy")  # held-out first
    assert rows["Throughput (last)"] == "1,234 samples/s"  # the NaN point is skipped
    assert rows["Checkpoints"] == "2 (every 15 steps)"
    assert rows["Attempts"] == "2 (resumed from checkpoints)"


def test_train_summary_before_any_metric():
    rows = rows_of(TrainSummaryPanel().render(FakeData({}, job={"spec": {"entrypoint": "pkg.mod:fn"}})))
    assert rows == {"Entrypoint": "pkg.mod:fn", "Steps done": "none reported yet"}


def test_the_train_panel_is_registered():
    assert ("train", "components.train.panels:TrainSummaryPanel", TrainSummaryPanel, None) in registry.panels("job")


@pytest.fixture
def viewer(make_team, make_user, submit):
    team = make_team("alpha")
    alice = make_user("alice", team)
    client = Client()
    client.force_login(alice)
    job = submit(alice, team, name="panelled")
    return client, job


def panel_section(html: str, slug: str) -> str | None:
    match = re.search(rf'<section class="card panel" data-panel="{re.escape(slug)}".*?</section>', html, re.S)
    return match.group(0) if match else None


def test_the_train_panel_shows_on_the_detail_page(viewer):
    client, job = viewer
    MetricPoint.objects.create(job=job, name="loss", step=10, value=0.75)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    section = panel_section(html, "train-summary")
    assert section and "Run summary" in section and "<table" in section
    assert "0.75 at step 10" in section
    live = client.get(f"/jobs/{job.pk}/live/?panels=1").json()
    assert live["panels"][0]["slug"] == "train-summary"
    assert ["Training loss (best)", "0.75 at step 10"] in live["panels"][0]["table"]["rows"]


class BrokenPanel(Panel):
    slug: ClassVar[str] = "broken"
    title: ClassVar[str] = "Broken <panel>"

    def render(self, data):
        raise RuntimeError("kaboom <script>")


class FigurePanel(Panel):
    slug: ClassVar[str] = "figure"
    title: ClassVar[str] = "A figure"

    def render(self, data):
        return {"figure": {"data": [{"type": "scatter", "x": [1, 2], "y": [float("nan"), 1.0]}], "layout": {}}}


class TextPanel(Panel):
    slug: ClassVar[str] = "words"
    title: ClassVar[str] = "Words"

    def render(self, data):
        return {"text": "<i>plain</i> text"}


class HiddenPanel(Panel):
    slug: ClassVar[str] = "hidden"
    title: ClassVar[str] = "Hidden"

    def render(self, data):
        return None


class ClusterPanel(Panel):
    slug: ClassVar[str] = "cluster-only"
    title: ClassVar[str] = "Cluster only"
    placement: ClassVar[str] = "cluster"

    def render(self, data):
        return {"text": "cluster"}


def test_a_failing_panel_is_an_error_box_and_the_page_still_renders(viewer, monkeypatch):
    client, job = viewer
    panels = [("train", "p:Broken", BrokenPanel, None), ("train", "p:Figure", FigurePanel, None),
              ("train", "p:Text", TextPanel, None), ("train", "p:Hidden", HiddenPanel, None),
              ("serve", "p:Text", TextPanel, None)]
    monkeypatch.setattr(registry, "panels", lambda placement: panels if placement == "job" else [])
    response = client.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    broken = panel_section(html, "broken")
    assert 'class="panel-error"' in broken and "RuntimeError: kaboom &lt;script&gt;" in broken
    assert "Broken &lt;panel&gt;" in broken
    figure = panel_section(html, "figure")
    assert 'data-figure="panel-1-figure"' in figure and '"y":[null,1.0]' in figure  # NaN scrubbed
    assert "&lt;i&gt;plain&lt;/i&gt; text" in panel_section(html, "words")
    assert panel_section(html, "hidden") is None
    assert html.count('data-panel="words"') == 1  # the serve kind's panel is not on a train job
    assert 'id="job-state"' in html  # the rest of the page is there
    live = client.get(f"/jobs/{job.pk}/live/?panels=1")
    assert live.status_code == 200
    assert [panel["slug"] for panel in live.json()["panels"]] == ["broken", "figure", "words"]


PANELS_PLUGIN = Plugin(name="fake-panels", panels=(f"{__name__}:ClusterPanel", f"{__name__}:TextPanel"))
BROKEN_PLUGIN = Plugin(name="fake-broken", panels=("missing.module:Gone", f"{__name__}:HiddenPanel"))
NOT_A_PANEL_PLUGIN = Plugin(name="fake-not-a-panel", panels=(f"{__name__}:FakeData",))


def test_a_cluster_panel_is_not_shown_on_job_pages(viewer, install_plugins):
    client, job = viewer
    install_plugins(f"{__name__}:PANELS_PLUGIN")
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert panel_section(html, "words") is not None  # a plugin's job panel is offered to every kind
    assert "cluster-only" not in html and "Cluster only" not in html
    assert (None, f"{__name__}:ClusterPanel", ClusterPanel, None) in registry.panels("cluster")
    assert (None, f"{__name__}:TextPanel", TextPanel, None) not in registry.panels("cluster")


def test_a_plugin_whose_panel_cannot_be_imported_is_left_out_and_the_page_renders(viewer, install_plugins):
    client, job = viewer
    install_plugins(f"{__name__}:BROKEN_PLUGIN", f"{__name__}:NOT_A_PANEL_PLUGIN", f"{__name__}:PANELS_PLUGIN")
    problems = registry.problems()
    assert "No module named 'missing'" in problems["fake-broken"]
    assert "is not a Panel subclass" in problems["fake-not-a-panel"]
    assert "fake-broken" not in registry.plugins() and "fake-panels" in registry.plugins()
    response = client.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert panel_section(html, "words") is not None  # the healthy plugin's panel is still there
    assert panel_section(html, "train-summary") is not None


def test_non_finite_numbers_from_a_panel_become_null():
    from dashboard.panels import finite

    assert finite({"figure": {"data": [{"y": [1.0, float("nan"), float("inf")]}]}, "n": 2}) == {
        "figure": {"data": [{"y": [1.0, None, None]}]}, "n": 2}


def test_live_sends_panels_when_the_page_shows_an_old_state(viewer):
    client, job = viewer
    assert "panels" not in client.get(f"/jobs/{job.pk}/live/?state={job.state}").json()
    assert client.get(f"/jobs/{job.pk}/live/?state=RUNNING").json()["panels"][0]["slug"] == "train-summary"
