"""End-to-end: a dataset registered with `strata datasets`, read by train jobs on `strata up` through the node's
cache (two jobs started together compute each preprocessed epoch once), a PerFect job switching phases, and
the cache's report on the API and the pages."""

from __future__ import annotations

import tempfile
import time

import pytest
from e2e_support import login
from PIL import Image

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def make_images(root):
    for label, colour in enumerate(((210, 40, 40), (40, 200, 60), (40, 60, 220))):
        folder = root / f"class-{label}"
        folder.mkdir(parents=True)
        for n in range(24):
            image = Image.new("RGB", (32, 32), (n * 3, n * 2, n))
            image.paste(colour, (8 + n % 5, 8, 22 + n % 5, 22))
            image.save(folder / f"{n}.jpg", quality=90)


def job(name: str, **data) -> dict:
    return {"name": name, "kind": "train", "resources": {"gpus": 0.25}, "max_attempts": 1,
            "spec": {"workload": "cnn-dataset", "epochs": 4, "batch_size": 16, "hidden": 4,
                     "data": {"dataset": "e2e-shapes", "workers": 1, **data}}}


def series(cluster, job_id: str, name: str) -> list[float]:
    return [point["value"] for point in cluster.metrics(job_id) if point["name"] == name]


def test_jobs_share_the_node_cache_and_perfect_switches_phases(cluster, tmp_path):
    make_images(tmp_path / "images")
    registered = cluster.cli("datasets", "register", "e2e-shapes", "--path", str(tmp_path / "images"),
                             "--format", "image-folder", "--size", "16")
    assert registered.returncode == 0, (registered.stdout, registered.stderr)
    assert "registered dataset e2e-shapes" in registered.stdout
    listed = cluster.cli("datasets")
    assert listed.returncode == 0 and "e2e-shapes" in listed.stdout and "shapes-jpeg" in listed.stdout

    # A bad spec is a 400 naming every bad field; an unknown dataset is named on its field.
    bad = cluster.cli("datasets", "register", "Bad Name", "--path", "relative", "--format", "npz")
    assert bad.returncode != 0 and "name" in bad.stderr and "source.path" in bad.stderr and "Traceback" not in bad.stderr
    # strata up granted its team the temporary directory (which holds tmp_path and the cluster's home), but a path
    # under the platform's own state directory is never a team's (docs/security.md, Data roots).
    assert tempfile.gettempdir() in cluster.get("quotas/demo/")["data_roots"]
    state = cluster.cli("datasets", "register", "state", "--path", str(cluster.home / "artifacts"), "--format", "npz")
    assert state.returncode != 0 and "source.path" in state.stderr and "state directory" in state.stderr, state.stderr

    first = cluster.submit(job("reader-1", cache=True))
    second = cluster.submit(job("reader-2", cache=True))
    for submitted in (first, second):
        done = cluster.wait_state(submitted["id"], {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
        assert done["state"] == "SUCCEEDED", (done, cluster.output())
    # Both read 4 epochs; between them each preprocessed epoch (and the test set) was computed once.
    hits = series(cluster, first["id"], "data_cache_hit") + series(cluster, second["id"], "data_cache_hit")
    assert len(hits) == 8 and sum(hits) >= 4, hits
    entry = cluster.get("datasets/e2e-shapes/")
    cached = entry["pipelines"][0]["cached_on"]

    def node_report():
        cached_now = cluster.get("datasets/e2e-shapes/")["pipelines"][0]["cached_on"]
        return cached_now if cached_now and cached_now[0]["entries"] >= 5 else None

    deadline = time.monotonic() + 60
    while not (cached := node_report()) and time.monotonic() < deadline:
        time.sleep(1)
    assert cached and cached[0]["entries"] == 5, cached  # the test set and variants 0-3, once each
    caches = cluster.get("datasets/")["summary"]["caches"]
    assert len(caches) == 1 and caches[0]["misses"] == 5 and caches[0]["hits"] >= 4 and caches[0]["bytes"] > 0
    listed = cluster.cli("datasets")
    assert "cache on local" in listed.stdout and "5 misses" in listed.stdout, listed.stdout

    perfect = cluster.submit(job("perfect", cache=True, perfect={"reuse": 2, "switch": 0.5}))
    done = cluster.wait_state(perfect["id"], {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    assert done["state"] == "SUCCEEDED", (done, cluster.output())
    assert series(cluster, perfect["id"], "data_phase") == [1, 1, 2, 2]
    assert series(cluster, perfect["id"], "data_variant") == [0, 0, 2, 3]

    browser = login(cluster)
    panels = {panel["slug"] for panel in
              browser.get(f"{cluster.url}/jobs/{perfect['id']}/live/?panels=1", timeout=30).json()["panels"]}
    assert {"datacache-phases", "datacache-throughput"} <= panels, panels
    page = browser.get(f"{cluster.url}/cluster/panels/", timeout=30).text
    assert "Data cache hit rate" in page and "e2e-shapes" in page
