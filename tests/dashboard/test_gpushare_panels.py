"""GPU-sharing panels on the cluster and job pages (through the component panel registry), and the admins'
device-pool editor."""

from __future__ import annotations

import json
import re
import time

import pytest
from django.test import Client
from node_protocol import NodeProtocol

from components.gpushare.panels import FOREIGN, GpuShareJobPanel, GpuShareTimelinePanel
from components.runtime.contract.panels import PanelData
from strata.cluster.models import DevicePool
from strata.jobs.models import Allocation, Attempt

GIB = 2**30


def logged_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password="pw-" + user.username)
    return client


def panel_section(html: str, slug: str) -> str | None:
    match = re.search(rf'<section class="card panel" data-panel="{slug}"[^>]*>(.*?)</section>', html, re.S)
    return match.group(1) if match else None


def embedded_figure(section: str) -> dict:
    match = re.search(r'<script type="application/json" id="[^"]+">(.*?)</script>', section, re.S)
    assert match, "no embedded figure"
    return json.loads(match.group(1))


@pytest.fixture
def world(make_team, make_user, make_node, node_token, api, submit, run_pass):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    admin = make_user("root", admin=True)
    node = make_node("n1", gpus=1, memory=8 * GIB)
    first = submit(alice, alpha, gpus=0.5, name="resnet-sweep")
    second = submit(alice, alpha, gpus=0.25, name="tiny-probe")
    run_pass()
    attempts = [Attempt.objects.get(job=first), Attempt.objects.get(job=second)]
    assert all(a.node_id == node.pk for a in attempts)
    return {"alice": alice, "bob": bob, "admin": admin, "node": node, "agent": api(node_token),
            "first": first, "second": second, "attempts": attempts}


def beat(world, sharing):
    node = world["node"]
    response = NodeProtocol(world["agent"], node=node).heartbeat(reports={"gpushare": {"devices": sharing}})
    assert response.status_code == 200, response.content
    return response.json()


def report(world) -> dict:
    now = time.time()
    first, second = (str(a.pk) for a in world["attempts"])
    return {
        "index": 0, "policy": "fair", "switches": 41, "switch_latency_ms": {"p50": 0.07, "p99": 0.3},
        "utilization": 0.9, "budget": 6 * GIB,
        "lanes": [{"id": 0, "size": GIB, "attempts": [first]}, {"id": 1, "size": GIB // 2, "attempts": [second]}],
        "jobs": [{"attempt": first, "state": "running", "persistent": 300 * 2**20, "ephemeral": 200 * 2**20,
                  "lane": 0, "steps": 120},
                 {"attempt": second, "state": "running", "persistent": 10 * 2**20, "ephemeral": 5 * 2**20,
                  "lane": 1, "steps": 80}],
        "slices": [{"attempt": first, "start": now - 3.0, "end": now - 2.5},
                   {"attempt": second, "start": now - 2.5, "end": now - 2.2},
                   {"attempt": first, "start": now - 2.2, "end": now - 1.6}],
    }


def test_no_sharing_data_hides_the_timeline(world):
    html = logged_in(world["alice"]).get("/cluster/").content.decode()
    assert panel_section(html, "gpushare-timeline") is None


def test_cluster_page_shows_the_timeline_with_bars(world):
    beat(world, [report(world)])
    html = logged_in(world["alice"]).get("/cluster/").content.decode()
    section = panel_section(html, "gpushare-timeline")
    assert section is not None and "GPU sharing: who ran when" in section
    figure = embedded_figure(section)
    bars = {trace["name"]: trace for trace in figure["data"]}
    assert set(bars) == {"resnet-sweep", "tiny-probe"}
    assert all(trace["type"] == "bar" and trace["orientation"] == "h" for trace in figure["data"])
    assert bars["resnet-sweep"]["y"] == ["n1:gpu0", "n1:gpu0"] and len(bars["tiny-probe"]["x"]) == 1
    assert bars["resnet-sweep"]["x"] == pytest.approx([500.0, 600.0], abs=1.0)  # durations in ms
    assert bars["tiny-probe"]["base"][0] > bars["resnet-sweep"]["base"][0]
    assert figure["layout"]["xaxis"]["type"] == "date"
    # The table: per-device switches, latency, utilization, policy and memory by lane.
    assert "<td>41</td>" in section and "0.07 ms" in section and "0.3 ms" in section and "90%" in section
    assert "<td>fair</td>" in section and "lane 0: 1.00 GiB, 1 job" in section and "lane 1: 512.0 MiB" in section


def test_another_team_sees_anonymous_bars(world):
    beat(world, [report(world)])
    html = logged_in(world["bob"]).get("/cluster/").content.decode()
    section = panel_section(html, "gpushare-timeline")
    figure = embedded_figure(section)
    assert [trace["name"] for trace in figure["data"]] == [FOREIGN]
    assert len(figure["data"][0]["x"]) == 3
    for secret in ("resnet-sweep", "tiny-probe", str(world["first"].pk), str(world["attempts"][0].pk)):
        assert secret not in section
    assert "another team&#x27;s job" in section or "another team's job" in section


def test_sharing_data_is_scoped(world):
    from components.gpushare.report import read, sharing_view
    from dashboard.panels import DatabasePanelData

    beat(world, [report(world)])
    foreign = sharing_view(read(DatabasePanelData([])))
    assert all(piece["foreign"] and piece["job_id"] is None and piece["job_name"] is None
               and piece["attempt"] is None for piece in foreign["slices"]) and len(foreign["slices"]) == 3
    assert [job["foreign"] and job["job_id"] is None for job in foreign["devices"][0]["jobs"]] == [True, True]
    assert {job["persistent"] for job in foreign["devices"][0]["jobs"]} == {300 * 2**20, 10 * 2**20}  # not secret
    own_data = DatabasePanelData([world["first"].team_id])
    own = sharing_view(read(own_data, job_id=str(world["first"].pk)), job_id=str(world["first"].pk))
    assert {piece["job_name"] for piece in own["slices"]} == {"resnet-sweep"} and len(own["slices"]) == 2
    assert [device["policy"] for device in own["devices"]] == ["fair"]
    mine = sharing_view(read(own_data))
    assert {job["job_name"] for job in mine["devices"][0]["jobs"]} == {"resnet-sweep", "tiny-probe"}
    # Another team's job id gives nothing at all.
    assert sharing_view(read(DatabasePanelData([]), job_id=str(world["first"].pk))) == {"devices": [], "slices": []}


def test_job_page_panel(world):
    beat(world, [report(world)])
    job = world["first"]
    allocation = Allocation.objects.get(attempt__job=job)
    html = logged_in(world["alice"]).get(f"/jobs/{job.pk}/").content.decode()
    section = panel_section(html, "gpushare-job")
    assert section is not None
    assert "0.5 GPU" in section and "n1:gpu0" in section and "<td>fair</td>" in section
    assert "300.0 MiB" in section and "200.0 MiB" in section  # measured persistent and ephemeral
    assert allocation.share == 0.5
    figure = embedded_figure(section)
    assert [trace["name"] for trace in figure["data"]] == ["resnet-sweep"]
    assert len(figure["data"][0]["x"]) == 2
    live = logged_in(world["alice"]).get(f"/jobs/{job.pk}/live/?panels=1").json()
    assert "gpushare-job" in [panel["slug"] for panel in live["panels"]]


def test_job_panel_not_shown_for_whole_gpu_jobs(world, submit, make_node, run_pass):
    make_node("n2", gpus=1)
    whole = submit(world["alice"], world["first"].team, gpus=1.0, name="whole")
    run_pass()
    html = logged_in(world["alice"]).get(f"/jobs/{whole.pk}/").content.decode()
    assert panel_section(html, "gpushare-job") is None
    assert not GpuShareJobPanel().applies({"share": None})


class EmptyData(PanelData):
    job = None

    def metrics(self, names=None):
        return {}

    def events(self, kind=None):
        return []

    def devices(self):
        return []


def test_panel_data_default_shares_nothing():
    assert EmptyData().reports("gpushare") == {"nodes": [], "devices": [], "attempts": [], "series": []}
    assert GpuShareTimelinePanel().render(EmptyData()) is None


def test_pool_editor_is_admin_only(world):
    assert logged_in(world["alice"]).get("/manage/pools/").status_code == 403
    assert logged_in(world["alice"]).post("/manage/pools/", {"pool": "default", "sharing_policy": "pack"}).status_code == 403
    assert not DevicePool.objects.exists()
    quotas = logged_in(world["admin"]).get("/manage/quotas/").content.decode()
    assert 'href="/manage/pools/"' in quotas


def test_pool_editor_saves_the_policy_the_next_heartbeat_returns(world):
    admin = logged_in(world["admin"])
    html = admin.get("/manage/pools/").content.decode()
    form = re.search(r'<form[^>]*data-pool="default"[^>]*>(.*?)</form>', html, re.S)
    assert form and 'name="sharing_policy"' in form.group(1) and "<button" in form.group(1)
    assert re.search(r'<option value="fair" selected>', form.group(1))
    assert beat(world, [])["sharing_policy"] == "fair"
    response = admin.post("/manage/pools/", {"pool": "default", "sharing_policy": "srtf"})
    assert response.status_code == 302 and response["Location"].endswith("#pool-default")
    assert beat(world, [])["sharing_policy"] == "srtf"
    bad = admin.post("/manage/pools/", {"pool": "default", "sharing_policy": "fastest"})
    assert bad.status_code == 400 and "sharing_policy" in bad.content.decode()
    assert beat(world, [])["sharing_policy"] == "srtf"
