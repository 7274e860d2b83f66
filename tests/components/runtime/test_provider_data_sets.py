"""Uploaded data sets a data provider's options read (``DataProvider.data_sets``, the core's ``data_sets_of``):
named beside the mounts, fetched by the node before the attempt starts (leased, read-only, no alias link), found
by the job's processes with ``data_set_path``, readable in the sandbox of an attempt that runs the team's code,
and never a reason to treat a built-in workload as the team's code."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, ClassVar

import pytest

from components.runtime.contract import data
from components.runtime.contract.data import DATA_SETS_ENV, DataProvider, data_set_path, data_sets_of
from components.runtime.contract.project import reads_data_sets, runs_user_code, uses_project
from components.runtime.node import worker
from components.runtime.node.project_cache import ProjectCache, fetch_data_sets, prepare_rank
from components.runtime.shared import bundles


class Reads(DataProvider):
    """A provider whose ``reads`` option names one resolved data set (as a registered dataset would)."""

    options: ClassVar[frozenset[str]] = frozenset({"reads"})

    def data_sets(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        return [options["reads"]]


class Broken(DataProvider):
    options: ClassVar[frozenset[str]] = frozenset({"broken"})

    def data_sets(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        raise RuntimeError("boom")


@pytest.fixture
def providers(monkeypatch):
    installed = [Reads(), Broken()]
    monkeypatch.setattr(data, "_providers", lambda: installed)
    return installed


def _data_set(tmp_path, files: dict[str, bytes], name: str = "pets") -> tuple[bytes, dict]:
    root = tmp_path / f"upload-{name}"
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    archive = io.BytesIO()
    manifest, digest = bundles.pack(root, archive, ignore_files=False, compresslevel=1)
    return archive.getvalue(), {"name": name, "digest": digest, "format": "archive", "size": len(archive.getvalue()),
                                "expanded_size": manifest.size}


def test_data_sets_of_joins_mounts_and_providers_by_digest(providers):
    mount = {"name": "pets", "digest": "a" * 64, "format": "archive", "size": 1, "expanded_size": 1}
    other = {"name": "cars", "digest": "b" * 64, "format": "file", "file": "x.npz", "size": 2, "expanded_size": 2,
             "extra": "dropped"}
    spec = {"data": {"mount": {"images": mount}, "reads": other, "broken": True}}
    found = data_sets_of(spec)
    assert set(found) == {"a" * 64, "b" * 64}
    assert found["b" * 64] == {key: value for key, value in other.items() if key != "extra"}
    # The same data set mounted and read by a provider is one entry; a malformed answer adds nothing.
    assert list(data_sets_of({"data": {"mount": {"images": mount}, "reads": dict(mount)}})) == ["a" * 64]
    for bad in ({"name": "pets", "digest": "short"}, {"name": "Bad Name", "digest": "c" * 64}, "pets", None):
        assert data_sets_of({"data": {"reads": bad}}) == {}
    assert data_sets_of({"workload": "mlp-digits"}) == {} and data_sets_of(None) == {}


def test_data_set_path_finds_only_what_the_node_fetched(tmp_path, monkeypatch):
    digest = "d" * 64
    monkeypatch.delenv(DATA_SETS_ENV, raising=False)
    with pytest.raises(LookupError, match="not on this machine"):
        data_set_path(digest)
    monkeypatch.setenv(DATA_SETS_ENV, str(tmp_path))
    with pytest.raises(LookupError, match="not on this node"):
        data_set_path(digest)
    with pytest.raises(LookupError, match="no data set digest"):
        data_set_path("../etc")
    (tmp_path / digest).mkdir()
    assert data_set_path(digest) == tmp_path / digest


def test_a_providers_data_set_is_fetched_leased_and_not_linked_under_an_alias(tmp_path, providers):
    archive, mount = _data_set(tmp_path, {"cats/a.png": b"cat"})
    fetched = []

    def download_data(digest, target):
        fetched.append(digest)
        target.write_bytes(archive)

    claim = {"attempt": "att", "spec": {"command": ["true"], "data": {"reads": mount}}}
    cache = ProjectCache(tmp_path / "state")
    project = prepare_rank(cache, claim, 0, download=None, note=lambda _m: None, download_data=download_data)
    assert fetched == [mount["digest"]]
    entry = cache.data.entry(mount["digest"])
    assert (entry / "cats" / "a.png").read_bytes() == b"cat"
    assert entry in [lease.path for lease in project.leases]  # readable in the rank's sandbox
    assert list(Path(project.env["STRATA_DATA_DIR"]).iterdir()) == []  # no alias: the provider finds it by digest
    cache.data.budget = 0
    assert cache.data.evict() == []  # leased while the rank runs
    project.release()
    assert cache.data.evict() == [mount["digest"]]


def test_a_builtin_workload_over_a_providers_data_set_is_no_user_code(tmp_path, providers):
    _, mount = _data_set(tmp_path, {"a.txt": b"a"})
    claim = {"attempt": "att", "spec": {"workload": "cnn-x", "data": {"reads": mount}}}
    assert reads_data_sets(claim) and not uses_project(claim) and not runs_user_code(claim)
    mounted = {"attempt": "att", "spec": {"workload": "cnn-x", "data": {"mount": {"m": mount}}}}
    assert reads_data_sets(mounted) and uses_project(mounted)
    assert not reads_data_sets({"attempt": "att", "spec": {"workload": "cnn-x"}})
    with pytest.raises(RuntimeError, match="cannot fetch"):
        fetch_data_sets(ProjectCache(tmp_path / "state"), claim, None, lambda _m: None)


def test_the_worker_leases_them_for_an_attempt_without_a_project_and_a_sandbox_can_read_them(tmp_path, monkeypatch,
                                                                                               providers):
    archive, mount = _data_set(tmp_path, {"a.txt": b"a"})
    config = {"server": "http://127.0.0.1:9", "node_token": "t", "node": "n1", "state_dir": str(tmp_path / "state")}
    runner = worker.AttemptRunner(config, "a" * 32, "token")
    monkeypatch.setattr(runner, "_poll", lambda: False)
    monkeypatch.setattr(runner, "_download_data", lambda digest, target: target.write_bytes(archive))
    claim = {"attempt": "a" * 32, "team": 3, "kind": "train", "allocations": [],
             "spec": {"entrypoint": "pkg.mod:main", "data": {"reads": mount}}}
    runner.prepare(claim)
    assert not runner.projects and [lease.path.name for lease in runner.data_leases] == [mount["digest"]]
    assert any("data sets ready" in line["message"] for line in runner.pending_logs)
    # An entry point runs the team's code in the sandbox: the data set it reads is among what it may read.
    runner.sandbox_mode = "bwrap"
    monkeypatch.setattr(worker.sandbox.Sandbox, "prepare", lambda self: None)
    box = runner._sandbox(claim, 0, None, [])
    assert box is not None and (tmp_path / "state" / "data" / mount["digest"]).resolve() in box.readable
    runner.cleanup()
    assert runner.data_leases == []
    cache = ProjectCache(tmp_path / "state")
    cache.data.budget = 0
    assert cache.data.evict() == [mount["digest"]]  # released
