"""The cluster page: nodes and devices, who shares what (anonymized across teams), charts and panels."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone
from node_protocol import NodeProtocol

from strata.cluster.models import Device
from strata.telemetry.models import DeviceSample

GIB = 2**30


def logged_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password="pw-" + user.username)
    return client


def embedded(html: str, script_id: str) -> dict:
    match = re.search(rf'<script type="application/json" id="{script_id}">(.*?)</script>', html, re.S)
    assert match, f"no embedded JSON {script_id}"
    return json.loads(match.group(1))


def row(html: str, attribute: str, value: str) -> str:
    match = re.search(rf'<tr {attribute}="{re.escape(value)}"[^>]*>(.*?)</tr>', html, re.S)
    assert match, f"no row {attribute}={value}"
    return match.group(1)


def section(html: str, element_id: str) -> str:
    match = re.search(rf'<section[^>]*id="{element_id}"[^>]*>(.*?)</section>', html, re.S)
    assert match, f"no section #{element_id}"
    return match.group(1)


@pytest.fixture
def world(make_team, make_user, make_node, node_token, api, submit, run_pass):
    alpha, beta = make_team("alpha"), make_team("beta")
    alice, bob = make_user("alice", alpha), make_user("bob", beta)
    node = make_node("n1", gpus=2, memory=8 * GIB, labels={"zone": "a"})
    agent = api(node_token)
    job = submit(alice, alpha, gpus=0.5, name="resnet-sweep")
    other = submit(alice, alpha, gpus=0.25, name="tiny-probe")
    run_pass()
    return {"alpha": alpha, "beta": beta, "alice": alice, "bob": bob, "node": node, "agent": agent,
            "job": job, "other": other}


def heartbeat(world, samples):
    node = world["node"]
    response = NodeProtocol(world["agent"], node=node).heartbeat(samples=samples, attempts=[])
    assert response.status_code == 200, response.content


def test_login_required(client):
    response = client.get("/cluster/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    # The endpoints the page polls answer 401, so the page reloads to the login form instead of swapping the
    # login form's HTML into its tables.
    for url in ("/cluster/charts/", "/cluster/tables/", "/cluster/panels/"):
        assert client.get(url).status_code == 401


def test_nodes_and_devices_tables(world):
    heartbeat(world, [{"index": 0, "utilization": 37.5, "memory_used": 2 * GIB},
                      {"index": 1, "utilization": 5.0, "memory_used": 0}])
    html = logged_in(world["alice"]).get("/cluster/").content.decode()
    node = row(html, "data-node", "n1")
    assert 'data-state="UP"' in node and 'data-valid="true"' in node
    assert "zone=a" in node and '<td class="device-count">2</td>' in node
    assert re.search(r'data-seconds="\d+"', node)
    device = row(html, "data-device", "n1:0")
    assert '<span class="badge virtual">virtual</span>' in device
    assert "2.0 / 8.0 GiB" in device and "37.5 %" in device
    # Both of alice's jobs share device 0 (best fit packs fractional jobs onto the fullest device).
    assert "resnet-sweep" in device and "tiny-probe" in device
    assert f'href="/jobs/{world["job"].pk}/"' in device
    assert "idle" in row(html, "data-device", "n1:1")


def test_sharing_is_anonymized_for_other_teams(world):
    owner_html = logged_in(world["alice"]).get("/cluster/").content.decode()
    sharing = section(owner_html, "sharing")
    assert "resnet-sweep" in sharing and "(0.5)" in sharing and "(0.25)" in sharing
    assert "0.75 of 1 GPU" in sharing

    stranger = logged_in(world["bob"]).get("/cluster/").content.decode()
    sharing = section(stranger, "sharing")
    assert unescape(sharing).count("another team's job") == 2
    assert "resnet-sweep" not in stranger and "tiny-probe" not in stranger
    assert str(world["job"].pk) not in stranger and "alpha" not in sharing


def test_utilization_figure_holds_heartbeat_samples(world):
    heartbeat(world, [{"index": 0, "utilization": 37.5, "memory_used": 2 * GIB},
                      {"index": 1, "utilization": 80.0, "memory_used": 4 * GIB}])
    # An earlier heartbeat, moved back in time so it lands in another bucket.
    heartbeat(world, [{"index": 0, "utilization": 10.0, "memory_used": GIB}])
    latest = DeviceSample.objects.filter(utilization=10.0).get()
    DeviceSample.objects.filter(pk=latest.pk).update(time=timezone.now() - timedelta(minutes=30))

    html = logged_in(world["alice"]).get("/cluster/").content.decode()
    assert '<div id="chart-utilization" class="chart" data-figure="fig-utilization">' in html
    utilization = embedded(html, "fig-utilization")
    traces = {trace["name"]: trace for trace in utilization["data"]}
    assert set(traces) == {"n1:gpu0", "n1:gpu1"}
    gpu0 = traces["n1:gpu0"]
    assert "x" not in gpu0 and gpu0["x0"] and gpu0["dx"] > 0  # a regular grid, no timestamps per point
    assert [v for v in gpu0["y"] if v is not None] == [10.0, 37.5]
    assert [v for v in traces["n1:gpu1"]["y"] if v is not None] == [80.0]
    assert len(gpu0["y"]) <= 240

    memory = {trace["name"]: trace for trace in embedded(html, "fig-memory")["data"]}
    assert [v for v in memory["n1:gpu1"]["y"] if v is not None] == [4.0]

    heatmap = embedded(html, "fig-heatmap")["data"][0]
    assert heatmap["type"] == "heatmap" and heatmap["y"] == ["n1:gpu0", "n1:gpu1"]
    assert len(heatmap["z"]) == Device.objects.count() == 2
    assert all(len(z_row) == len(gpu0["y"]) for z_row in heatmap["z"])
    assert 80.0 in heatmap["z"][1]


def test_range_tabs_and_bad_range(world):
    client = logged_in(world["alice"])
    html = client.get("/cluster/").content.decode()
    for key in ("1h", "24h", "7d", "30d"):
        assert f'data-range="{key}"' in html
    assert re.search(r'<a data-range="1h" href="\?range=1h" class="active"', html)
    week = client.get("/cluster/", {"range": "7d"})
    assert week.status_code == 200
    assert re.search(r'<a data-range="7d" href="\?range=7d" class="active"', week.content.decode())
    assert 'data-source="hour"' in week.content.decode()
    assert client.get("/cluster/", {"range": "2y"}).status_code == 400
    assert client.get("/cluster/charts/", {"range": "bogus"}).status_code == 400


def test_charts_endpoint(world):
    heartbeat(world, [{"index": 0, "utilization": 55.5, "memory_used": GIB}])
    client = logged_in(world["bob"])
    response = client.get("/cluster/charts/", {"range": "24h"})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    data = response.json()
    assert set(data["figures"]) == {"utilization", "memory", "heatmap"}
    assert data["grid"]["source"] == "minute" and data["grid"]["buckets"] <= 240
    values = [v for v in data["figures"]["utilization"]["data"][0]["y"] if v is not None]
    assert values == [55.5]  # minute rollups do not exist yet: the tail comes from raw samples


def test_payload_stays_small_for_many_devices(make_user, make_node):
    admin = make_user("root", admin=True)
    for n in range(5):
        make_node(f"node-{n}", gpus=4)
    devices = list(Device.objects.all())
    now = timezone.now()
    DeviceSample.objects.bulk_create([
        DeviceSample(device=device, time=now - timedelta(seconds=15 * i), utilization=(i * 7 + device.pk) % 100,
                     memory_used=(i % 8) * GIB)
        for device in devices for i in range(240)])
    response = logged_in(admin).get("/cluster/charts/", {"range": "1h"})
    figures = response.json()["figures"]
    assert len(figures["heatmap"]["data"][0]["z"]) == 20
    # 20 devices x <= 240 buckets x 3 charts: well under 100 KB, about 5 bytes per value.
    assert len(response.content) < 100_000
    values = sum(len(trace["y"]) for trace in figures["utilization"]["data"])
    assert len(response.content) / (3 * values) < 8
    # Rounded to one decimal.
    for trace in figures["utilization"]["data"]:
        assert all(v is None or round(v, 1) == v for v in trace["y"])


def test_tables_fragment_refreshes(world):
    client = logged_in(world["alice"])
    response = client.get("/cluster/tables/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html and 'id="nodes"' in html and 'id="devices"' in html and 'id="sharing"' in html
    assert 'id="cluster-summary"' in html and "resnet-sweep" in html


def test_cluster_panels_render(world, monkeypatch):
    from components.runtime.contract import registry
    from components.runtime.contract.panels import Panel

    class FleetPanel(Panel):
        slug = "fleet"
        title = "Fleet summary"
        placement = "cluster"

        def render(self, data):
            devices = data.devices()
            return {"table": {"columns": ["device", "jobs"],
                              "rows": [[f"{d['node']}:{d['index']}", len(d["allocations"])] for d in devices]}}

    class ChartPanel(Panel):
        slug = "chart"
        title = "A chart"
        placement = "cluster"

        def render(self, data):
            return {"figure": {"data": [{"type": "bar", "x": ["a"], "y": [1]}], "layout": {}}}

    class BrokenPanel(Panel):
        slug = "broken"
        title = "Broken"
        placement = "cluster"

        def render(self, data):
            raise RuntimeError("boom")

    monkeypatch.setattr(registry, "panels", lambda placement: [
        ("demo", "p:Fleet", FleetPanel, None), ("demo", "p:Chart", ChartPanel, None),
        ("demo", "p:Broken", BrokenPanel, None)] if placement == "cluster" else [])
    html = logged_in(world["bob"]).get("/cluster/").content.decode()
    fleet = re.search(r'<section class="card panel" data-panel="fleet"[^>]*>(.*?)</section>', html, re.S).group(1)
    assert "Fleet summary" in fleet and "<td>n1:0</td><td>2</td>" in fleet
    assert 'data-panel="chart"' in html and embedded(html, "panel-fig-demo-chart")["data"][0]["type"] == "bar"
    assert 'data-panel="broken"' in html and "RuntimeError: boom" in html

    # The same panels, re-rendered alone for the page's live refresh.
    fragment = logged_in(world["bob"]).get("/cluster/panels/").content.decode()
    assert "<html" not in fragment and "Fleet summary" in fragment and "<td>n1:0</td><td>2</td>" in fragment
    assert embedded(fragment, "panel-fig-demo-chart")["data"][0]["type"] == "bar"
