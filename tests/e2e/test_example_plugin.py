"""End-to-end: the outside example plugin (examples/plugins/strata-primes) is installed with pip into a directory
of its own, found through its entry point by a real ``strata up``, and every seam shows up: its job kind runs to
the end on the node, its panels are on the job and cluster pages, its node service's report reaches the
control plane, and its CLI verb and benchmark are offered. Nothing in Strata was edited for it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import login, running_cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "strata-primes"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """``pip install`` the example (a real build of its wheel) into a fresh directory."""
    target = tmp_path_factory.mktemp("plugin-site")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-input", "--target", str(target),
         str(EXAMPLE)], capture_output=True, text=True, timeout=240)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (target / "strata_primes" / "plugin.py").exists()
    assert list(target.glob("strata_primes-*.dist-info/entry_points.txt"))
    return target


@pytest.fixture
def primes_cluster(plugin_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(plugin_path))  # every process of strata up sees the installed plugin
    with running_cluster(tmp_path / "home", virtual_gpus=1) as running:
        yield running




def test_an_installed_outside_plugin_contributes_every_seam(primes_cluster, tmp_path):
    cluster = primes_cluster
    listing = cluster.cli("plugins")
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if line.startswith("primes"))
    for part in ("kinds: primes", "PrimesPanel", "ScratchDiskPanel", "reports: ScratchDiskReport",
                 "hooks: SmallestLimitFirst", "subscribers: on_event", "commands: primes", "node services: ScratchDiskService",
                 "benchmarks: primes"):
        assert part in line, (part, line)
    assert "LEFT OUT" not in listing.stdout, listing.stdout

    # The job kind: submitted from a file with the CLI, run on the node, its artifact stored.
    submitted = cluster.cli("submit", str(EXAMPLE / "primes.yaml"), "--wait", "--timeout", "180")
    assert submitted.returncode == 0, (submitted.stdout, submitted.stderr, cluster.output())
    job_id = re.search(r"submitted job (\S+) ", submitted.stdout).group(1)
    job = cluster.job(job_id)
    assert job["kind"] == "primes" and job["state"] == "SUCCEEDED"
    artifacts = cluster.get(f"jobs/{job_id}/artifacts/")
    result = next(item for item in artifacts if item["name"] == "result.json")
    body = cluster.session.get(f"{cluster.url}/api/v1/jobs/{job_id}/artifacts/{result['id']}/download/", timeout=30)
    assert body.json() == {"limit": 2_000_000, "count": 148_933, "largest": 1_999_993}
    assert any("148,933 primes below 2,000,000" in line for line in cluster.logs(job_id))

    # Its CLI verb.
    verb = cluster.cli("primes", job_id)
    assert verb.returncode == 0, verb.stderr
    assert verb.stdout.strip() == f"job {job_id} SUCCEEDED: primes below 2,000,000 found so far: 148,933"

    # Its job panel, on the job page and in the live refresh.
    browser = login(cluster)
    page = browser.get(f"{cluster.url}/jobs/{job_id}/", timeout=30).text
    assert 'data-panel="primes-progress"' in page
    panels = {panel["slug"]: panel for panel in
              browser.get(f"{cluster.url}/jobs/{job_id}/live/?panels=1", timeout=30).json()["panels"]}
    rows = dict(panels["primes-progress"]["table"]["rows"])
    assert rows["primes found"] == "148,933" and rows["progress"] == "100.0%"

    # Its node service reports through the generic channel, and the cluster page shows it in its panel.
    def scratch_disk():
        html = browser.get(f"{cluster.url}/cluster/", timeout=30).text
        found = re.search(r'data-panel="primes-scratch-disk".*?</section>', html, re.S)
        return found and found.group(0)

    section = wait_for(scratch_disk, 60, message="the scratch-disk panel on the cluster page")
    assert "panel-error" not in section, section
    assert "Scratch disk (primes plugin)" in section and "<td>local</td>" in section and "GiB" in section
