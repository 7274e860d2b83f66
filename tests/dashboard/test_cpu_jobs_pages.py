"""The web UI shows CPUs where it shows GPUs: a node's CPUs on the cluster page, a CPU job's CPUs in the lists and
on its page, the max_cpus and max_memory meters and editor fields, and the submit form's CPU fields."""

from __future__ import annotations

import re

from django.test import Client

from strata.quotas.models import Quota

GIB = 2**30


def logged_in(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password="pw-" + user.username)
    return client


def test_cpus_show_where_gpus_do(make_team, make_user, make_node, submit_resources, run_pass):
    team = make_team("alpha", max_cpus=4, max_memory=8 * GIB)
    alice = make_user("alice", team)
    make_node("n1", gpus=1, cpus=4, host_memory=16 * GIB)
    job = submit_resources(alice, team, {"gpus": 0, "cpus": 1.5, "memory": "1GiB"}, name="wordcount")
    run_pass()
    client = logged_in(alice)

    cluster = client.get("/cluster/").content.decode()
    node_row = re.search(r'<tr data-node="n1"[^>]*>(.*?)</tr>', cluster, re.S).group(1)
    assert '<td class="device-count">1</td>' in node_row and "1.5 / 4" in node_row
    assert "16.0 GiB" in node_row

    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<dd>1.5 CPUs, 1GiB memory per worker</dd>" in page and "n1:cpu (1.5 CPU)" in page
    assert "1.5 CPU" in client.get("/jobs/").content.decode()

    usage = client.get("/usage/", {"team": "alpha"}).content.decode()
    assert 'data-meter="max_cpus" data-used="1.5" data-limit="4.0"' in usage
    assert f'data-meter="max_memory" data-used="{GIB}" data-limit="{8 * GIB}"' in usage

    form = client.get("/jobs/new/", {"kind": "train"}).content.decode()
    assert 'name="resources.cpus"' in form and 'name="resources.memory"' in form

    root = logged_in(make_user("root", admin=True))
    editor = root.get("/manage/quotas/").content.decode()
    assert 'name="max_cpus" value="4"' in editor and 'name="max_memory" value="8GiB"' in editor
    assert Quota.objects.get(team=team).max_cpus == 4
