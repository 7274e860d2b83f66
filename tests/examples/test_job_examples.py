"""Every job file under examples/ is accepted, and fits what `make run` starts (one node with two virtual GPUs of
the default size, and this machine's CPUs), or says in its first line what it needs. Projects
(examples/projects/*) are shipped as code bundles, as `strata submit` does with `code: .`."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import yaml

from components.runtime.node.devices import DEFAULT_VIRTUAL_GPU_MEMORY
from components.runtime.shared import bundles

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB_FILES = sorted(p for p in EXAMPLES.rglob("*.yaml") if "plugins" not in p.parts)
# What a file needs beyond `make run`'s defaults, said in its first line.
NEEDS = ("needs",)


@pytest.fixture
def local(make_team, make_user, make_token, make_node, api, settings, tmp_path):
    """`make run`'s cluster: the admin's team without a quota, one node as `strata up` registers it."""
    settings.STRATA_ARTIFACT_ROOT = str(tmp_path / "artifacts")
    team = make_team("demo")
    client = api(make_token(make_user("admin", team, admin=True), team))
    make_node("local", gpus=2, memory=DEFAULT_VIRTUAL_GPU_MEMORY, cpus=float(os.cpu_count() or 2),
              host_memory=8 * 2**30)
    return client


def test_there_are_examples():
    assert len(JOB_FILES) >= 10 and any("projects" in p.parts for p in JOB_FILES)


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_is_accepted_on_make_runs_defaults(local, path):
    body = yaml.safe_load(path.read_text())
    first_line = path.read_text().splitlines()[0].lower()
    if isinstance(body.get("code"), str) and (path.parent / body["code"]).is_dir():
        archive = io.BytesIO()
        bundles.pack(path.parent / body["code"], archive)
        uploaded = local.generic("POST", "/api/v1/code/", data=archive.getvalue(), content_type="application/gzip")
        assert uploaded.status_code == 201, uploaded.content
        body["code"] = uploaded.json()["digest"]
    response = local.post("/api/v1/jobs/", body, format="json")
    if any(word in first_line for word in NEEDS):
        assert response.status_code in (201, 400), response.content
        return
    assert response.status_code == 201, (path.name, response.content)
    job = response.json()
    assert job["state"] != "PENDING" or "never" not in job["reason"], job["reason"]
