"""Code bundles: packing honours ignore files and is canonical; hostile archives are refused, nothing escapes."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zipfile

import pytest

from components.runtime.shared import bundles
from components.runtime.shared.bundles import BundleError


def make_project(root):
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("WIDTH = 3\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 1000)
    (root / "notes.log").write_text("log\n")
    (root / ".gitignore").write_text("data/\n")
    (root / ".strataignore").write_text("*.log\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    return root


def test_pack_honours_gitignore_strataignore_and_caches(tmp_path):
    project = make_project(tmp_path / "project")
    manifest, digest = bundles.pack(project, io.BytesIO())
    assert [f.path for f in manifest.files] == [".gitignore", ".strataignore", "pkg/__init__.py", "pkg/model.py",
                                                "run.sh", "train.py"]
    assert len(digest) == 64


def test_nested_ignore_file_applies_below_its_directory(tmp_path):
    project = make_project(tmp_path / "project")
    (project / "pkg" / ".strataignore").write_text("model.py\n")
    manifest, _ = bundles.pack(project, io.BytesIO())
    assert "pkg/model.py" not in [f.path for f in manifest.files]
    assert "train.py" in [f.path for f in manifest.files]


def test_the_same_tree_gives_the_same_bytes(tmp_path):
    first, second = io.BytesIO(), io.BytesIO()
    project = make_project(tmp_path / "a")
    _, digest_a = bundles.pack(project, first)
    os.utime(project / "train.py", (1, 1))  # a new mtime changes nothing
    _, digest_b = bundles.pack(project, second)
    assert digest_a == digest_b and first.getvalue() == second.getvalue()
    # The control plane's canonical form of the CLI's archive is the archive itself.
    first.seek(0)
    manifest, digest_c = bundles.canonicalize(first, io.BytesIO())
    assert digest_c == digest_a and manifest.size > 0


def test_round_trip_keeps_contents_and_the_executable_bit(tmp_path):
    archive = io.BytesIO()
    bundles.pack(make_project(tmp_path / "project"), archive)
    archive.seek(0)
    manifest = bundles.unpack(archive, tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "model.py").read_text() == "WIDTH = 3\n"
    assert os.stat(tmp_path / "out" / "run.sh").st_mode & 0o111
    assert not os.stat(tmp_path / "out" / "train.py").st_mode & 0o111
    assert manifest.size == sum(f.size for f in manifest.files)


def test_over_the_limit_names_the_largest_files(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "weights.pt").write_bytes(b"w" * 5000)
    (project / "train.py").write_text("x\n")
    with pytest.raises(BundleError) as error:
        bundles.pack(project, io.BytesIO(), max_bytes=4096)
    assert "weights.pt" in str(error.value) and "limit" in str(error.value)


def test_a_link_that_leaves_the_directory_is_refused(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("x\n")
    (project / "secret").symlink_to("/etc/hostname")
    with pytest.raises(BundleError, match="secret.*leaves the directory"):
        bundles.pack(project, io.BytesIO())


def test_a_link_loop_inside_the_directory_is_packed_once(tmp_path):
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "m.py").write_text("x\n")
    (project / "pkg" / "again").symlink_to("..")  # a loop back to the project
    manifest, _ = bundles.pack(project, io.BytesIO())
    assert [f.path for f in manifest.files] == ["pkg/m.py"]


def _tar(members) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return buffer


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name, kind, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


@pytest.mark.parametrize("members, problem", [
    ([_file("../escape.py")], "'..'"),
    ([_file("/etc/evil")], "absolute"),
    ([_file("ok.py"), _special("link", tarfile.SYMTYPE, "/etc/passwd")], "links are refused"),
    ([_special("hard", tarfile.LNKTYPE, "../../x")], "links are refused"),
    ([_special("dev", tarfile.CHRTYPE)], "devices"),
    ([_special("fifo", tarfile.FIFOTYPE)], "devices"),
    ([_file("a.py"), _file("a.py")], "twice"),
])
def test_hostile_tar_members_are_refused_and_nothing_is_written_outside(tmp_path, members, problem):
    archive = _tar(members)
    destination = tmp_path / "cache" / "bundle"
    with pytest.raises(BundleError, match=problem):
        bundles.unpack(archive, destination)
    archive.seek(0)
    with pytest.raises(BundleError, match=problem):
        bundles.canonicalize(archive, io.BytesIO())
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "cache" / "escape.py").exists()
    outside = [p for p in tmp_path.rglob("*") if destination not in p.parents and p != destination]
    assert all(p.is_dir() for p in outside)


def test_a_tar_bomb_stops_at_the_limit(tmp_path):
    # 64 MiB of zeros compresses to about 64 KiB: refused from its declared size, before it is written.
    info = tarfile.TarInfo("zeros.bin")
    info.size = 64 * 2**20

    class Zeros(io.RawIOBase):
        left = info.size

        def readable(self):
            return True

        def readinto(self, buffer):
            count = min(len(buffer), self.left)
            buffer[:count] = bytes(count)
            self.left -= count
            return count

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as archive:
        archive.addfile(info, io.BufferedReader(Zeros()))
    assert raw.tell() < 2**20
    raw.seek(0)
    with pytest.raises(BundleError, match="expands past"):
        bundles.unpack(raw, tmp_path / "out", max_bytes=8 * 2**20)
    assert not (tmp_path / "out" / "zeros.bin").exists()


def test_a_zip_bomb_is_refused(tmp_path):
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        for index in range(4):
            archive.writestr(f"part{index}.bin", bytes(4 * 2**20))
    raw.seek(0)
    with pytest.raises(BundleError, match="expands past"):
        bundles.canonicalize(raw, io.BytesIO(), max_bytes=10 * 2**20)


def test_a_zip_of_a_folder_becomes_the_folder_contents(tmp_path):
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        archive.writestr("project/train.py", "print(1)\n")
        archive.writestr("project/pkg/m.py", "A = 1\n")
    raw.seek(0)
    manifest, digest = bundles.canonicalize(raw, io.BytesIO())
    assert [f.path for f in manifest.files] == ["pkg/m.py", "train.py"] and len(digest) == 64


def test_zip_traversal_and_links_are_refused(tmp_path):
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        archive.writestr("../../evil.py", "x")
    raw.seek(0)
    with pytest.raises(BundleError, match="'..'"):
        bundles.canonicalize(raw, io.BytesIO())
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as archive:
        link = zipfile.ZipInfo("link")
        link.external_attr = (0o120777 << 16)
        archive.writestr(link, "/etc/passwd")
    raw.seek(0)
    with pytest.raises(BundleError, match="links are refused"):
        bundles.canonicalize(raw, io.BytesIO())


def test_a_damaged_archive_is_named(tmp_path):
    with pytest.raises(BundleError, match="not a tar"):
        bundles.canonicalize(io.BytesIO(b"this is not an archive at all" * 10), io.BytesIO())
    data = _tar([_file("a.py", b"y" * 10000)]).getvalue()
    with pytest.raises(BundleError):
        bundles.canonicalize(io.BytesIO(gzip.compress(gzip.decompress(data)[:3000])), io.BytesIO())


def test_digest_normalization():
    digest = "a" * 64
    assert bundles.normalize_digest("sha256:" + digest.upper()) == digest
    with pytest.raises(ValueError):
        bundles.normalize_digest("xyz")
