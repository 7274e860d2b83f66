"""Code bundles: a project directory as one content-addressed archive, packed by the CLI, checked by the control
plane and unpacked on nodes. Light (the standard library and ``pathspec``): the CLI, the control plane and the
node all import it.

A bundle is a *canonical* gzip'd tar: entries sorted by path, owner 0, mode 0644 (0755 when executable),
mtime 0, no links, devices or special files, and a gzip header without a name or time. The same tree always
gives the same bytes, so the SHA-256 of the archive names the bundle and a team's identical uploads are stored
once. What the control plane receives (a tar, a .tar.gz or a zip from the web form) is checked entry by entry
and re-written in that canonical form before it is stored: :func:`canonicalize`.

Unpacking (:func:`unpack`) never trusts the archive: absolute paths, ``..``, links, devices and FIFOs are refused,
and an archive that expands past its limit (a zip bomb) stops being read at the limit.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

DEFAULT_MAX_BYTES = 100 * 2**20  # the expanded size of a bundle, STRATA_MAX_CODE_BYTES
DEFAULT_MAX_FILES = 20_000
IGNORE_FILES = (".gitignore", ".strataignore")
# Never shipped: version control, caches and virtual environments (a .strataignore line "!name" cannot bring
# them back; they are never what a job needs and can be huge).
ALWAYS_IGNORED = (".git/", ".hg/", ".svn/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".mypy_cache/",
                  ".pytest_cache/", ".ruff_cache/", ".ipynb_checkpoints/", ".DS_Store")
LARGEST_NAMED = 5  # files named in a "too large" error
CHUNK = 1 << 20


class BundleError(ValueError):
    """A bundle that cannot be accepted; the message says why, in one line."""


@dataclass(frozen=True)
class BundleFile:
    path: str  # relative, POSIX separators
    size: int
    executable: bool = False


@dataclass
class Manifest:
    """What a bundle holds: its files (sorted by path) and their expanded size."""

    files: list[BundleFile] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def largest(self, count: int = LARGEST_NAMED) -> list[BundleFile]:
        return sorted(self.files, key=lambda f: (-f.size, f.path))[:count]

    def as_list(self) -> list[dict]:
        return [{"path": f.path, "size": f.size} for f in self.files]


def human_size(size: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} bytes"  # unreachable


def too_large(manifest: Manifest, limit: int) -> BundleError:
    named = ", ".join(f"{f.path} ({human_size(f.size)})" for f in manifest.largest())
    return BundleError(f"the code is {human_size(manifest.size)}, over the {human_size(limit)} limit; the largest "
                       f"files: {named}. Leave data out with a .strataignore (upload it as a dataset)")


# -- packing a directory (the CLI) ---------------------------------------------------------------------------
def _ignore_spec(root: Path, ignore_files: bool = True):
    import pathspec

    lines = list(ALWAYS_IGNORED) if ignore_files else []
    for name in IGNORE_FILES if ignore_files else ():
        path = root / name
        if path.is_file():
            lines.extend(path.read_text(errors="replace").splitlines())
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _nested_specs(root: Path, directory: Path):
    """The .gitignore/.strataignore of a subdirectory, matched relative to it (git's rule), or None."""
    if directory == root or not any((directory / name).is_file() for name in IGNORE_FILES):
        return None
    import pathspec

    lines = []
    for name in IGNORE_FILES:
        path = directory / name
        if path.is_file():
            lines.extend(path.read_text(errors="replace").splitlines())
    return pathspec.GitIgnoreSpec.from_lines(lines)


def collect(directory: str | os.PathLike, *, ignore_files: bool = True) -> tuple[Path, list[tuple[str, Path]]]:
    """The files of ``directory`` a bundle holds: ``(root, [(relative POSIX path, absolute path)])``, sorted.

    Honours ``.gitignore`` and ``.strataignore`` (the root's and those of subdirectories, as git does) and
    :data:`ALWAYS_IGNORED`; with ``ignore_files=False`` (a data set: every file is data) none of them. Symbolic
    links are followed only when they stay inside the directory; one that leaves it is refused, naming it."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise BundleError(f"{directory} is not a directory")
    top = _ignore_spec(root, ignore_files)
    found: list[tuple[str, Path]] = []
    stack: list[tuple[Path, list[tuple[str, object]]]] = [(root, [])]
    visited: set[Path] = set()
    while stack:
        current, specs = stack.pop()
        if current.resolve() in visited:  # a link back to a directory already packed (a loop)
            continue
        visited.add(current.resolve())
        nested = _nested_specs(root, current) if ignore_files else None
        if nested is not None:
            specs = [*specs, (current.relative_to(root).as_posix(), nested)]
        for entry in sorted(os.scandir(current), key=lambda e: e.name):
            path = Path(entry.path)
            relative = path.relative_to(root).as_posix()
            is_dir = entry.is_dir(follow_symlinks=True)
            probe = relative + "/" if is_dir else relative
            if top.match_file(probe) or any(spec.match_file(probe[len(base) + 1:]) for base, spec in specs):
                continue
            if entry.is_symlink():
                target = path.resolve()
                if root not in target.parents and target != root:
                    raise BundleError(f"{relative} is a link that leaves the directory (to {target})")
            if is_dir:
                stack.append((path, specs))
            elif entry.is_file(follow_symlinks=True):
                found.append((relative, path))
            # sockets, FIFOs and devices are not code: left out
    found.sort()
    return root, found


def pack(directory: str | os.PathLike, target: BinaryIO, *, max_bytes: int = DEFAULT_MAX_BYTES,
         max_files: int = DEFAULT_MAX_FILES, ignore_files: bool = True,
         compresslevel: int = 9) -> tuple[Manifest, str]:
    """Write the canonical bundle of ``directory`` to ``target``; returns (manifest, sha256 of what was written).
    Over ``max_bytes`` (expanded) or ``max_files``, raises :class:`BundleError` naming the largest files.
    ``ignore_files=False`` packs every file (a data set); ``compresslevel`` is gzip's (the same tree and level
    always give the same bytes)."""
    _root, files = collect(directory, ignore_files=ignore_files)
    manifest = Manifest([BundleFile(rel, path.stat().st_size, bool(path.stat().st_mode & 0o111))
                         for rel, path in files])
    _check_limits(manifest, max_bytes, max_files)
    return manifest, _write_canonical(((f, path.open("rb")) for f, (_rel, path) in zip(manifest.files, files,
                                                                                      strict=True)), target,
                                      compresslevel)


def _check_limits(manifest: Manifest, max_bytes: int, max_files: int) -> None:
    if manifest.size > max_bytes:
        raise too_large(manifest, max_bytes)
    if len(manifest.files) > max_files:
        raise BundleError(f"the code has {len(manifest.files)} files, over the limit of {max_files}")
    if not manifest.files:
        raise BundleError("the code bundle is empty (every file is ignored, or the directory is empty)")


class _HashingWriter(io.RawIOBase):
    def __init__(self, target: BinaryIO):
        self.target = target
        self.digest = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data)
        self.target.write(data)
        return len(data)


def _write_canonical(entries: Iterable[tuple[BundleFile, BinaryIO]], target: BinaryIO, compresslevel: int = 9) -> str:
    writer = _HashingWriter(target)
    with gzip.GzipFile(fileobj=writer, mode="wb", mtime=0, filename="", compresslevel=compresslevel) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info_file, source in entries:
            with source:
                info = tarfile.TarInfo(info_file.path)
                info.size = info_file.size
                info.mode = 0o755 if info_file.executable else 0o644
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                archive.addfile(info, _Exactly(source, info_file.size))
    return writer.digest.hexdigest()


class _Exactly(io.RawIOBase):
    """Reads exactly ``size`` bytes of ``source`` (a file that changed while being packed is an error)."""

    def __init__(self, source: BinaryIO, size: int):
        self.source, self.left = source, size

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.source.read(size)
        if len(data) < size:
            raise BundleError("a file changed while it was packed; try again")
        self.left -= len(data)
        return data


# -- checking what arrives (the control plane) and unpacking it (nodes) --------------------------------------
def clean_path(name: str) -> str:
    """The member name as a safe relative POSIX path; raises BundleError for absolute paths and ``..``."""
    if "\x00" in name or "\\" in name:
        raise BundleError(f"{name[:200]!r}: not a portable path")
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        raise BundleError(f"{name[:200]}: absolute paths are refused")
    parts = [part for part in path.parts if part not in ("", ".")]
    if ".." in parts:
        raise BundleError(f"{name[:200]}: paths with '..' are refused")
    if not parts:
        raise BundleError(f"{name[:200]!r}: an empty path")
    for part in parts:
        if len(part.encode()) > 255:
            raise BundleError(f"{name[:200]}: a path component longer than 255 bytes")
    return "/".join(parts)


def _entries(source: BinaryIO, max_bytes: int, max_files: int) -> Iterator[tuple[BundleFile, BinaryIO]]:
    """The files of a tar (optionally gzip'd) or zip archive, checked; directories are implied by paths."""
    head = source.read(4)
    source.seek(0)
    if head.startswith(b"PK"):
        yield from _zip_entries(source, max_bytes, max_files)
    else:
        yield from _tar_entries(source, max_bytes, max_files)


class _Budget:
    def __init__(self, max_bytes: int, max_files: int):
        self.max_bytes, self.max_files = max_bytes, max_files
        self.bytes = self.files = 0
        self.seen: set[str] = set()

    def add(self, path: str, size: int) -> None:
        if path in self.seen:
            raise BundleError(f"{path}: appears twice in the archive")
        self.seen.add(path)
        self.files += 1
        self.bytes += size
        if self.files > self.max_files:
            raise BundleError(f"the archive has more than {self.max_files} files")
        if self.bytes > self.max_bytes:
            raise BundleError(f"the archive expands past the {human_size(self.max_bytes)} limit (at {path})")


class _Bounded(io.RawIOBase):
    """Reads at most ``size`` bytes; an entry whose data is longer than it claims is refused (a bomb)."""

    def __init__(self, source: BinaryIO, size: int, path: str):
        self.source, self.left, self.path = source, size, path

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        try:
            data = self.source.read(size)
        except (tarfile.TarError, EOFError, OSError, zlib.error, zipfile.BadZipFile) as error:
            raise BundleError(f"{self.path}: the archive is damaged ({error})") from None
        self.left -= len(data)
        return data


def _tar_entries(source: BinaryIO, max_bytes: int, max_files: int) -> Iterator[tuple[BundleFile, BinaryIO]]:
    budget = _Budget(max_bytes, max_files)
    try:
        archive = tarfile.open(fileobj=source, mode="r:*")
    except (tarfile.TarError, OSError, EOFError) as error:
        raise BundleError(f"not a tar, tar.gz or zip archive ({error})") from None
    with archive:
        try:
            for member in archive:
                name = member.name
                if member.isdir():
                    clean_path(name)
                    continue
                if member.issym() or member.islnk():
                    raise BundleError(f"{clean_path(name)}: links are refused (to {member.linkname[:200]})")
                if not member.isfile():
                    raise BundleError(f"{clean_path(name)}: devices, FIFOs and special files are refused")
                path = clean_path(name)
                budget.add(path, member.size)
                data = archive.extractfile(member)
                yield BundleFile(path, member.size, bool(member.mode & 0o111)), _Bounded(data, member.size, path)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
            raise BundleError(f"the archive is damaged ({error})") from None


def _zip_entries(source: BinaryIO, max_bytes: int, max_files: int) -> Iterator[tuple[BundleFile, BinaryIO]]:
    budget = _Budget(max_bytes, max_files)
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError) as error:
        raise BundleError(f"not a valid zip archive ({error})") from None
    with archive:
        infos = archive.infolist()
        # One directory at the top (what "compress this folder" makes): its contents are the project.
        prefix = _common_top(infos)
        for info in infos:
            name = info.filename[len(prefix):] if prefix else info.filename
            if not name or info.is_dir():
                if name:
                    clean_path(name)
                continue
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise BundleError(f"{clean_path(name)}: links are refused")
            if stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                raise BundleError(f"{clean_path(name)}: devices, FIFOs and special files are refused")
            path = clean_path(name)
            budget.add(path, info.file_size)
            try:
                handle = archive.open(info)
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError) as error:
                raise BundleError(f"{path}: cannot be read ({error})") from None
            # A zip's declared sizes can lie: what is read is bounded by the declared size, and the zip module
            # checks the CRC (a short or altered member raises BadZipFile).
            yield BundleFile(path, info.file_size, bool(mode & 0o111)), _Bounded(handle, info.file_size, path)


def _common_top(infos: list[zipfile.ZipInfo]) -> str:
    tops = {info.filename.split("/", 1)[0] for info in infos}
    if len(tops) == 1 and all("/" in info.filename for info in infos):
        return next(iter(tops)) + "/"
    return ""


def canonicalize(source: BinaryIO, target: BinaryIO, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_files: int = DEFAULT_MAX_FILES) -> tuple[Manifest, str]:
    """Check an uploaded archive (tar, tar.gz or zip; ``source`` must be seekable) and write its canonical form to
    ``target``. Returns (manifest, sha256 of the canonical bytes). Any problem raises :class:`BundleError`."""
    files: list[BundleFile] = []
    spooled: list[tuple[BundleFile, BinaryIO]] = []
    for info, data in _entries(source, max_bytes, max_files):
        buffer = _spool(data, info)
        files.append(info)
        spooled.append((info, buffer))
    manifest = Manifest(sorted(files, key=lambda f: f.path))
    if not manifest.files:
        raise BundleError("the archive holds no files")
    ordered = sorted(spooled, key=lambda pair: pair[0].path)
    return manifest, _write_canonical(ordered, target)


def inspect(source: BinaryIO, *, max_bytes: int = DEFAULT_MAX_BYTES,
            max_files: int = DEFAULT_MAX_FILES) -> Manifest:
    """Check an archive entry by entry as :func:`unpack` would, without writing anything (every entry is read
    through, so a damaged or lying one is found). Returns the manifest; raises :class:`BundleError`."""
    files = []
    for info, data in _entries(source, max_bytes, max_files):
        read = 0
        while chunk := data.read(CHUNK):
            read += len(chunk)
        if read != info.size:
            raise BundleError(f"{info.path}: holds {read} bytes where the archive says {info.size}")
        files.append(info)
    if not files:
        raise BundleError("the archive holds no files")
    return Manifest(sorted(files, key=lambda f: f.path))


def _spool(data: BinaryIO, info: BundleFile) -> BinaryIO:
    import tempfile

    buffer = tempfile.SpooledTemporaryFile(max_size=8 * 2**20)
    copied = 0
    while chunk := data.read(CHUNK):
        copied += len(chunk)
        buffer.write(chunk)
    if copied != info.size:
        raise BundleError(f"{info.path}: holds {copied} bytes where the archive says {info.size}")
    buffer.seek(0)
    return buffer


def unpack(source: BinaryIO, destination: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
           max_files: int = DEFAULT_MAX_FILES) -> Manifest:
    """Unpack a bundle into ``destination`` (which must not exist yet or be empty), re-checking every entry:
    nothing is ever written outside it. Returns the manifest; raises :class:`BundleError`."""
    root = Path(destination)
    root.mkdir(parents=True, exist_ok=True)
    resolved = root.resolve()
    files = []
    for info, data in _entries(source, max_bytes, max_files):
        target = (resolved / info.path)
        if resolved not in target.resolve().parents:
            raise BundleError(f"{info.path}: leaves the destination")
        target.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with open(target, "xb") as out:  # "x": never through an existing file or link
            while chunk := data.read(CHUNK):
                written += len(chunk)
                out.write(chunk)
        if written != info.size:
            raise BundleError(f"{info.path}: holds {written} bytes where the archive says {info.size}")
        os.chmod(target, 0o755 if info.executable else 0o644)
        files.append(info)
    return Manifest(sorted(files, key=lambda f: f.path))


def digest_of(source: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := source.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


DIGEST_LENGTH = 64


def normalize_digest(value: str) -> str:
    """``sha256:<hex>`` or ``<hex>`` as the 64 lower-case hex digits; raises ValueError."""
    text = str(value).strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:"):]
    if len(text) != DIGEST_LENGTH or any(c not in "0123456789abcdef" for c in text):
        raise ValueError("must be a code bundle's SHA-256 digest (64 hex digits, optionally after 'sha256:')")
    return text
