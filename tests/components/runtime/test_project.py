"""A team's project on a node: bundle and environment caches (built once, concurrent waiters, LRU eviction that
skips entries in use), environments layered on the node's Python, failed builds as user errors."""

from __future__ import annotations

import io
import sys
import threading
import time

import pytest
from support import index_environment, package_index

from components.runtime.contract.project import UserError, uses_project
from components.runtime.node.project_cache import (
    DiskCache,
    ProjectCache,
    build_environment,
    environment_digest,
    prepare_rank,
    remove_workdir,
)
from components.runtime.shared import bundles

HELLO = {"strata-hello": {"strata_hello/__init__.py": "GREETING = 'hello from the index'\n"}}


@pytest.fixture
def index(tmp_path, monkeypatch):
    with package_index(tmp_path / "index", HELLO) as url:
        for name, value in index_environment(url).items():
            monkeypatch.setenv(name, value)
        yield url


def test_concurrent_gets_build_once(tmp_path):
    cache = DiskCache(tmp_path / "cache", budget=10**9)
    builds = []

    def build(target):
        builds.append(1)
        time.sleep(0.5)
        target.mkdir()
        (target / "f").write_text("x")

    leases = []
    threads = [threading.Thread(target=lambda: leases.append(cache.get("k", build))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(builds) == 1 and len(leases) == 4
    assert all((lease.path / "f").read_text() == "x" for lease in leases)
    for lease in leases:
        lease.release()


def test_a_failed_build_leaves_nothing_and_the_next_one_retries(tmp_path):
    cache = DiskCache(tmp_path / "cache", budget=10**9)

    def broken(target):
        target.mkdir()
        raise UserError("no")

    with pytest.raises(UserError):
        cache.get("k", broken)
    assert not (tmp_path / "cache" / "k").exists() and not cache.ready("k")
    lease = cache.get("k", lambda target: target.mkdir())
    assert lease.path.is_dir()
    lease.release()


def test_eviction_is_lru_and_skips_entries_in_use(tmp_path):
    cache = DiskCache(tmp_path / "cache", budget=2500)

    def build_of(size):
        def build(target):
            target.mkdir()
            (target / "data").write_bytes(b"x" * size)
        return build

    in_use = cache.get("a", build_of(1000))  # held: never evicted
    cache.get("b", build_of(1000)).release()
    time.sleep(0.02)
    cache.get("c", build_of(1000)).release()  # 3000 > 2500: the oldest entry not in use (b) goes
    assert cache.ready("a") and not cache.ready("b") and cache.ready("c")
    assert not (tmp_path / "cache" / "b").exists()
    in_use.release()


def test_the_environment_installs_from_the_index_and_sees_the_node_packages(tmp_path, index):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("strata-hello\ntorch\n")  # torch: already on the node, never installed again
    notes = []
    build_environment(tmp_path / "env", requirements, [], notes.append)
    import subprocess

    out = subprocess.run([str(tmp_path / "env" / "bin" / "python"), "-c",
                          "import strata_hello, torch, components.runtime.shared.bundles; print(strata_hello.GREETING)"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hello from the index"
    assert not list((tmp_path / "env").rglob("torch/__init__.py"))  # not a second copy of torch
    assert any("Successfully installed strata-hello" in note for note in notes)


def test_a_broken_requirement_fails_with_pips_message(tmp_path, index):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("no-such-package-strata==9.9\n")
    with pytest.raises(UserError, match="could not be built.*no-such-package-strata"):
        build_environment(tmp_path / "env", requirements, [], lambda _m: None)


def test_two_ranks_of_one_environment_build_it_once(tmp_path, index):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import strata_hello\n")
    (project / "requirements.txt").write_text("strata-hello\n")
    archive = io.BytesIO()
    _, digest = bundles.pack(project, archive)
    downloads = []

    def download(target):
        downloads.append(1)
        target.write_bytes(archive.getvalue())

    claim = {"attempt": "att", "code": {"digest": digest, "expanded_size": 1000},
             "spec": {"command": ["python", "train.py"], "environment": {"requirements": "requirements.txt"}}}
    cache = ProjectCache(tmp_path / "state")
    notes = []
    first = prepare_rank(cache, claim, 0, download=download, note=notes.append)
    second = prepare_rank(cache, claim, 1, download=download, note=notes.append)
    assert len(downloads) == 1
    assert sum("built in" in note for note in notes) == 1 and any("(cached)" in note for note in notes)
    assert first.python == second.python != sys.executable
    assert (first.workdir / "train.py").read_text() == "import strata_hello\n"
    (first.workdir / "new.txt").write_text("writable")  # the working copy is the attempt's own
    cached = cache.code.entry(digest) / "train.py"
    with pytest.raises(PermissionError):
        if __import__("os").geteuid() == 0:  # root ignores file modes: the modes themselves are checked
            assert not cached.stat().st_mode & 0o222
            raise PermissionError
        cached.write_text("changed")
    assert first.env["STRATA_CHECKPOINT_DIR"].endswith("checkpoint")
    first.release()
    second.release()


def test_a_bundle_whose_bytes_do_not_match_its_digest_is_refused(tmp_path):
    claim = {"attempt": "att", "code": {"digest": "0" * 64}, "spec": {"command": ["true"]}}
    with pytest.raises(UserError, match="do not match its digest"):
        prepare_rank(ProjectCache(tmp_path / "state"), claim, 0,
                     download=lambda target: target.write_bytes(b"junk"), note=lambda _m: None)
    assert not (tmp_path / "state" / "code" / ("0" * 64)).exists()


def test_requirements_without_a_bundle_are_a_user_error(tmp_path):
    claim = {"attempt": "att", "spec": {"command": ["true"], "environment": {"requirements": "requirements.txt"}}}
    with pytest.raises(UserError, match="needs a code bundle"):
        prepare_rank(ProjectCache(tmp_path / "state"), claim, 0, download=None, note=lambda _m: None)


def test_the_digest_depends_on_what_is_installed_only():
    base = {"pip": ["a"], "env": {"X": "1"}}
    assert environment_digest(base, "r") == environment_digest({"pip": ["a"], "env": {"X": "2"}}, "r")
    assert environment_digest(base, "r") != environment_digest(base, "r2")


# -- data sets mounted into the rank (spec.data.mount, resolved) -------------------------------------------------
def _data_set(tmp_path, files: dict[str, bytes]) -> tuple[bytes, dict]:
    root = tmp_path / "upload"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    archive = io.BytesIO()
    manifest, digest = bundles.pack(root, archive, ignore_files=False, compresslevel=1)
    return archive.getvalue(), {"name": "pets", "digest": digest, "format": "archive", "size": len(archive.getvalue()),
                                "expanded_size": manifest.size}


def _root_or_refused(path):
    with pytest.raises(PermissionError):
        if __import__("os").geteuid() == 0:  # root ignores file modes: the modes themselves are checked
            assert not path.stat().st_mode & 0o222
            raise PermissionError
        path.write_text("changed")


def test_mounts_are_fetched_once_per_digest_read_only_under_strata_data_dir(tmp_path):
    data, mount = _data_set(tmp_path, {"images/a.txt": b"alpha", ".gitignore": b"*\n"})
    single = b"x,y\n1,2\n"
    import hashlib

    table = {"name": "table", "digest": hashlib.sha256(single).hexdigest(), "format": "file", "file": "t.csv",
             "size": len(single), "expanded_size": len(single)}
    fetched = []

    def download_data(digest, target):
        fetched.append(digest)
        target.write_bytes(data if digest == mount["digest"] else single)

    claim = {"attempt": "att", "spec": {"workload": "mlp-digits",
                                        "data": {"mount": {"images": mount, "again": mount, "table": table}}}}
    assert uses_project(claim) and not uses_project({"attempt": "x", "spec": {"workload": "mlp-digits"}})
    cache = ProjectCache(tmp_path / "state")
    notes = []
    ranks = [prepare_rank(cache, claim, rank, download=None, note=notes.append, download_data=download_data)
             for rank in (0, 1)]
    assert sorted(fetched) == sorted([mount["digest"], table["digest"]])  # once per digest, for both ranks
    for project in ranks:
        data_dir = __import__("pathlib").Path(project.env["STRATA_DATA_DIR"])
        assert (data_dir / "images" / "images" / "a.txt").read_bytes() == b"alpha"
        assert (data_dir / "again" / ".gitignore").read_bytes() == b"*\n"
        assert (data_dir / "table" / "t.csv").read_bytes() == single
        _root_or_refused(data_dir / "images" / "images" / "a.txt")
        assert (data_dir / "images").resolve() == cache.data.entry(mount["digest"]).resolve()
    # The cache entry is leased while a rank uses it: eviction skips it.
    cache.data.budget = 0
    assert cache.data.evict() == []
    for rank, project in enumerate(ranks):
        project.release()
        remove_workdir(cache.state_dir, "att", rank)
    assert cache.data.entry(mount["digest"]).is_dir()  # removing a workdir leaves the cached data set
    assert sorted(cache.data.evict()) == sorted([mount["digest"], table["digest"]])


def test_a_data_set_whose_bytes_do_not_match_is_a_user_error(tmp_path):
    _, mount = _data_set(tmp_path, {"a.txt": b"a"})
    claim = {"attempt": "att", "spec": {"command": ["true"], "data": {"mount": {"d": mount}}}}
    with pytest.raises(UserError, match="data set pets .*do not match its digest"):
        prepare_rank(ProjectCache(tmp_path / "state"), claim, 0, download=None, note=lambda _m: None,
                     download_data=lambda _digest, target: target.write_bytes(b"junk"))
    assert not (tmp_path / "state" / "data" / mount["digest"]).exists()


def test_what_runs_as_a_teams_code():
    """A bundle, an environment, a command, an entry point, or reading what a team's code wrote (the claim's
    ``reads_user_output``): such an attempt runs in its own sandboxed processes, never in a shared node service."""
    from components.runtime.contract.project import runs_user_code

    builtin = {"spec": {"workload": "mlp-digits"}, "code": None}
    assert not runs_user_code(builtin) and not runs_user_code({**builtin, "reads_user_output": False})
    assert runs_user_code({**builtin, "code": {"digest": "a" * 64}})
    assert runs_user_code({"spec": {"command": ["python", "train.py"]}})
    assert runs_user_code({"spec": {"entrypoint": "mywork:DigitsWorkload"}})
    assert runs_user_code({"spec": {"model": {"job": "j"}}, "reads_user_output": True})  # a team's exported model
