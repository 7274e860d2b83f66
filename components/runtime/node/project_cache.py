"""A team's own project on a node: its code bundle, its environment and the attempt's working directory (the
spec's side is :mod:`components.runtime.contract.project`).

On the node, everything lives under the node's state directory:

- ``code/<digest>/``: a bundle, fetched once per digest and unpacked read-only (:class:`DiskCache`);
- ``envs/<digest>/``: a virtual environment per environment digest, layered on the node's own Python (a ``.pth``
  file adds the node's site-packages, so torch and Strata are never installed again), built once with pip (or
  uv, see :func:`installer`);
- ``data/<digest>/``: a data set the job reads (mounted by ``spec.data.mount``, or named by a data provider's
  options: ``components.runtime.contract.data.data_sets_of``), fetched once per digest, read-only;
- ``work/<attempt>-<rank>/``: the attempt's working directory: a writable copy of the bundle (``code/``),
  ``output/``, ``checkpoint/``, ``tmp/`` and ``data/`` (``STRATA_DATA_DIR``: a link per mount alias to its
  cached data set); removed when the attempt ends.

The caches are LRU under a byte budget (``STRATA_CODE_CACHE_BYTES``, ``STRATA_ENV_CACHE_BYTES``,
``STRATA_DATA_CACHE_BYTES``). Every entry
has a lock file: a build holds it exclusively (concurrent attempts wait for the one build), a running attempt
holds it shared (eviction skips entries in use).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.runtime.contract.project import UserError, needs_build, project_of

# What runs the installer in the node's sandbox: (command, target, readable directory or None) -> (the command to
# run, the function the child runs before it, what to do once it ended). None: the installer runs as the worker.
BuildWrap = Callable[[list[str], Path, Path | None], tuple[list[str], Callable[[], None] | None, Callable[[], None]]]
DEFAULT_CODE_CACHE_BYTES = 2 * 2**30
DEFAULT_ENV_CACHE_BYTES = 10 * 2**30
DEFAULT_DATA_CACHE_BYTES = 20 * 2**30
MAX_DATA_FILES = 1_000_000
ENV_BUILD_TIMEOUT_S = float(os.environ.get("STRATA_ENV_BUILD_TIMEOUT_S", "1800"))
USERLIB = Path(__file__).with_name("userlib")  # strata_report: importable in every command job


# -- caches on disk ---------------------------------------------------------------------------------------------
def _tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _remove_tree(path: Path) -> None:
    def writable(function, name, _info):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), 0o755)
            os.chmod(name, 0o755)
        function(name)

    if path.exists():
        shutil.rmtree(path, onerror=writable)


def make_read_only(path: Path) -> None:
    for root, dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            mode = os.lstat(full).st_mode
            os.chmod(full, 0o555 if mode & 0o111 else 0o444)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(path, 0o555)


@dataclass
class Lease:
    """A shared hold on a cache entry while an attempt uses it (eviction skips it)."""

    path: Path
    handle: Any = None

    def release(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.close()
            self.handle = None


@dataclass
class DiskCache:
    """Directories built once per key under ``root``, evicted least recently used past ``budget`` bytes."""

    root: Path
    budget: int
    label: str = "cache"

    def __post_init__(self):
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _lock(self, key: str) -> Path:
        return self.root / f"{key}.lock"

    def entry(self, key: str) -> Path:
        return self.root / key

    def ready(self, key: str) -> bool:
        return (self.root / f"{key}.ready").exists()

    def get(self, key: str, build: Callable[[Path], None], *, note: Callable[[str], None] = lambda _m: None) -> Lease:
        """The entry ``key``, built by ``build(directory)`` if absent; returns a shared :class:`Lease` on it.
        Concurrent callers wait for one build (an exclusive lock per key). A build that raises leaves nothing."""
        handle = open(self._lock(key), "a+")  # noqa: SIM115 -- held for the lease's lifetime
        try:
            while True:
                if self.ready(key):
                    fcntl.flock(handle, fcntl.LOCK_SH)  # waits only for an evictor holding it exclusively
                    if self.ready(key):
                        break
                    continue
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another attempt builds it (or an evictor removes it): wait for it
                    note(f"waiting for another attempt's build of {self.label} {key[:12]}")
                    fcntl.flock(handle, fcntl.LOCK_SH)
                    if self.ready(key):
                        break
                    fcntl.flock(handle, fcntl.LOCK_UN)  # its build failed: try building it ourselves
                    time.sleep(0.05)
                    continue
                if not self.ready(key):
                    self._build(key, build)
                fcntl.flock(handle, fcntl.LOCK_SH)  # the exclusive lock is converted
                break
            os.utime(self._lock(key))  # last used: the lock file's mtime
        except BaseException:
            handle.close()
            raise
        self.evict(keep=key)
        return Lease(self.entry(key), handle)

    def _build(self, key: str, build: Callable[[Path], None]) -> None:
        target = self.entry(key)
        _remove_tree(target)  # a build that died half-way
        started = time.monotonic()
        try:
            build(target)
        except BaseException:
            _remove_tree(target)
            raise
        (self.root / f"{key}.size").write_text(str(_tree_size(target)))
        (self.root / f"{key}.ready").write_text(f"{time.time():.3f} {time.monotonic() - started:.3f}\n")

    def entries(self) -> list[tuple[float, int, str]]:
        """(last used, size, key) of every ready entry."""
        found = []
        for marker in self.root.glob("*.ready"):
            key = marker.name[: -len(".ready")]
            try:
                size = int((self.root / f"{key}.size").read_text() or 0)
                used = os.stat(self._lock(key)).st_mtime
            except (OSError, ValueError):
                continue
            found.append((used, size, key))
        return sorted(found)

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used entries not in use until the cache fits its budget; returns their keys."""
        entries = self.entries()
        total = sum(size for _used, size, _key in entries)
        removed = []
        for _used, size, key in entries:
            if total <= self.budget:
                break
            if key == keep:
                continue
            with open(self._lock(key), "a+") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # in use by a running attempt
                (self.root / f"{key}.ready").unlink(missing_ok=True)
                _remove_tree(self.entry(key))
                (self.root / f"{key}.size").unlink(missing_ok=True)
            total -= size
            removed.append(key)
        return removed


# -- environments -----------------------------------------------------------------------------------------------
# A requirements line that names a path (of the bundle, or of the node): ./pkg, ../x, /abs, file:..., -e ...
LOCAL_REQUIREMENT = re.compile(r"^\s*(\.|/|file:|-e\b|--editable\b)", re.MULTILINE)


def environment_digest(environment: dict[str, Any], requirements: str | None) -> str:
    """What decides an environment's contents: the node's Python, the requirements file's text and the pip
    specifications (not ``env`` or ``python_path``, which are set when the job runs)."""
    basis = {"python": sys.version, "base": sys.prefix, "requirements": requirements or "",
             "pip": sorted(environment.get("pip") or []),
             "index": os.environ.get("PIP_INDEX_URL", "") + " " + os.environ.get("UV_INDEX_URL", "")}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()


def installer() -> list[str] | None:
    """``uv`` when ``STRATA_ENV_INSTALLER=uv`` and it is installed (beside this Python, or on PATH), else None: pip.

    pip is the default because it sees the node's packages through the environment's ``.pth`` layer (a
    requirement on torch is "already satisfied"); uv (0.x) reads only the environment's own site-packages, so it
    would resolve and download torch again (tried: "torch was not found in the package registry" against a
    local index). uv suits projects whose requirements stay clear of the node's packages."""
    if os.environ.get("STRATA_ENV_INSTALLER", "pip").strip() != "uv":
        return None
    beside = Path(sys.executable).with_name("uv")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("uv")
    return [found] if found else None


def build_environment(target: Path, requirements: Path | None, pip: list[str], note: Callable[[str], None],
                      wrap: BuildWrap | None = None) -> None:
    """A virtual environment at ``target`` that sees the node's packages (a ``.pth`` file adds this Python's
    site-packages) with the job's requirements installed on top. Raises :class:`UserError` with the installer's
    error when the install fails. ``wrap``: the installer (which may run a requirement's build code) runs in the
    node's sandbox, writing only ``target``; it never gets the node's credentials either way."""
    import site
    import venv

    from components.runtime.node.sandbox import user_environment

    venv.EnvBuilder(with_pip=False, symlinks=True).create(target)
    python = target / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    layers = [path for path in site.getsitepackages() if Path(path).is_dir()]
    # A line starting with "import" is executed: addsitedir also reads the node's own .pth files (editable
    # installs of Strata, say), which a plain path line would not.
    Path(purelib, "_strata_node.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in layers))
    args = (["-r", str(requirements)] if requirements else []) + list(pip)
    if not args:
        return
    uv = installer()
    if uv:
        command = [*uv, "pip", "install", "--python", str(python), *args]
        tool = "uv"
    else:
        command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input",
                   "--disable-pip-version-check", *args]
        tool = "pip"
    note(f"building the environment with {tool}: {' '.join(args)}")
    env = {**user_environment(dict(os.environ)), "PYTHONNOUSERSITE": "1", "VIRTUAL_ENV": str(target)}
    env.pop("PYTHONPATH", None)
    preexec, after = None, (lambda: None)
    if wrap is not None:
        env["HOME"] = "/tmp"  # the sandbox's private /tmp: pip's cache and config go there
        command, preexec, after = wrap(command, target, requirements.parent if requirements else None)
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   cwd=str(requirements.parent) if requirements else None, preexec_fn=preexec)
    except BaseException:
        after()
        raise
    tail: list[str] = []
    deadline = time.monotonic() + ENV_BUILD_TIMEOUT_S
    for line in process.stdout or ():
        line = line.rstrip()
        if line:
            note(f"[env] {line}")
            tail = (tail + [line])[-12:]
        if time.monotonic() > deadline:
            process.kill()
    code = process.wait()
    after()
    if code != 0:
        errors = [line for line in tail if "error" in line.lower()] or tail
        raise UserError(f"the environment could not be built ({tool} exit code {code}): " + " | ".join(errors[-4:]))


# -- one attempt's project on the node --------------------------------------------------------------------------
@dataclass
class Project:
    """What the worker prepared for one rank of an attempt that runs a team's project."""

    workdir: Path  # the rank's working directory (the writable copy of the bundle, or empty)
    output_dir: Path
    checkpoint_dir: Path
    tmp_dir: Path
    python: str  # the interpreter: the environment's, or the node's
    env: dict[str, str] = field(default_factory=dict)  # variables the rank's process gets
    leases: list[Lease] = field(default_factory=list)

    def release(self) -> None:
        for lease in self.leases:
            lease.release()


def fetch_data_sets(cache: ProjectCache, claim: dict[str, Any], download_data: Callable[[str, Path], None] | None,
                    note: Callable[[str], None]) -> dict[str, Lease]:
    """Every data set the attempt reads (:func:`components.runtime.contract.data.data_sets_of`), fetched once per node
    into the read-only data cache: ``{digest: lease}``. ``download_data(digest, path)`` writes its bytes."""
    from components.runtime.contract.data import data_sets_of

    leases: dict[str, Lease] = {}
    try:
        for digest, mount in sorted(data_sets_of(claim.get("spec")).items()):
            if download_data is None:
                raise RuntimeError("the job reads data sets, and this node cannot fetch them")
            leases[digest] = cache.data_set(mount, functools.partial(download_data, digest), note)
    except BaseException:
        for lease in leases.values():
            lease.release()
        raise
    return leases


@dataclass
class ProjectCache:
    """The node's bundle and environment caches (under its state directory)."""

    state_dir: Path
    code_budget: int = int(os.environ.get("STRATA_CODE_CACHE_BYTES", DEFAULT_CODE_CACHE_BYTES))
    env_budget: int = int(os.environ.get("STRATA_ENV_CACHE_BYTES", DEFAULT_ENV_CACHE_BYTES))
    data_budget: int = int(os.environ.get("STRATA_DATA_CACHE_BYTES", DEFAULT_DATA_CACHE_BYTES))

    def __post_init__(self):
        self.state_dir = Path(self.state_dir)
        self.code = DiskCache(self.state_dir / "code", self.code_budget, "code bundle")
        self.envs = DiskCache(self.state_dir / "envs", self.env_budget, "environment")
        self.data = DiskCache(self.state_dir / "data", self.data_budget, "data set")

    @staticmethod
    def _fetched(cache: DiskCache, digest: str, label: str, download: Callable[[Path], None],
                 note: Callable[[str], None], place: Callable[[Any, Path, Path], Any]) -> Lease:
        """The read-only entry ``digest`` of ``cache``: ``download(path)`` writes its bytes to ``path``, which are
        checked against the digest, then ``place(open file, its path, target)`` lays them out (a manifest)."""
        from components.runtime.shared import bundles

        def build(target: Path) -> None:
            fetched = cache.root / f"{digest}.download"
            try:
                started = time.monotonic()
                download(fetched)
                with fetched.open("rb") as source:
                    if bundles.digest_of(source) != digest:
                        raise UserError(f"{label} {digest[:12]}: the bytes received do not match its digest")
                    source.seek(0)
                    manifest = place(source, fetched, target)
                note(f"{label} {digest[:12]}: {len(manifest.files)} files, "
                     f"{bundles.human_size(manifest.size)}, fetched in {time.monotonic() - started:.1f} s")
            except bundles.BundleError as error:
                raise UserError(f"{label} {digest[:12]}: {error}") from None
            finally:
                fetched.unlink(missing_ok=True)
            make_read_only(target)

        return cache.get(digest, build, note=note)

    def bundle(self, digest: str, download: Callable[[Path], None], note: Callable[[str], None], *,
               expanded: int | None = None) -> Lease:
        """The unpacked, read-only bundle ``digest``; ``download(path)`` writes its archive to ``path``.
        ``expanded``: its size unpacked, as the control plane measured it (nothing past it is written)."""
        from components.runtime.shared import bundles

        def place(source, _path: Path, target: Path):
            return bundles.unpack(source, target, max_bytes=expanded or bundles.DEFAULT_MAX_BYTES)

        return self._fetched(self.code, digest, "code bundle", download, note, place)

    def data_set(self, mount: dict[str, Any], download: Callable[[Path], None], note: Callable[[str], None]) -> Lease:
        """The read-only data set of a resolved mount (``{name, digest, format, expanded_size[, file]}``): a
        directory (an archive unpacked, or the one file under its name); ``download(path)`` writes its bytes."""
        from components.runtime.shared import bundles

        def place(source, path: Path, target: Path):
            if mount.get("format") == "file":
                name = bundles.clean_path(str(mount.get("file") or "data"))
                if "/" in name:
                    raise bundles.BundleError(f"{name}: a file's name has no directories")
                target.mkdir(parents=True)
                source.close()
                shutil.move(str(path), str(target / name))
                return bundles.Manifest([bundles.BundleFile(name, (target / name).stat().st_size)])
            return bundles.unpack(source, target, max_bytes=int(mount.get("expanded_size") or 0) or 1,
                                  max_files=MAX_DATA_FILES)

        return self._fetched(self.data, str(mount["digest"]), f"data set {mount.get('name')}", download, note, place)

    def environment(self, environment: dict[str, Any], bundle_dir: Path | None,
                    note: Callable[[str], None], wrap: BuildWrap | None = None) -> Lease | None:
        """The built environment of ``environment`` (None when it installs nothing); ``wrap``: its installer runs
        in the node's sandbox (:func:`build_environment`)."""
        if not needs_build(environment):
            return None
        requirements_file = None
        text = None
        if environment.get("requirements"):
            requirements_file = (bundle_dir / environment["requirements"]) if bundle_dir else None
            if requirements_file is None or not requirements_file.is_file():
                raise UserError(f"spec.environment.requirements: {environment['requirements']} is not a file of "
                                "the code bundle" if bundle_dir else
                                "spec.environment.requirements needs a code bundle (submit with --code DIR)")
            text = requirements_file.read_text(errors="replace")
        if text is not None and bundle_dir is not None and LOCAL_REQUIREMENT.search(text):
            # A requirement on a path of the bundle (./mylib, -e .): the environment is that bundle's alone.
            text += f"\n# bundle {bundle_dir.name}"
        digest = environment_digest(environment, text)
        started = time.monotonic()
        built = {"now": False}

        def build(target: Path) -> None:
            built["now"] = True
            build_environment(target, requirements_file, list(environment.get("pip") or []), note, wrap=wrap)

        lease = self.envs.get(digest, build, note=note)
        if built["now"]:
            note(f"environment {digest[:12]} built in {time.monotonic() - started:.1f} s")
        else:
            note(f"environment {digest[:12]} ready (cached)")
        return lease


def prepare_rank(cache: ProjectCache, claim: dict[str, Any], rank: int, *, download: Callable[[Path], None],
                 note: Callable[[str], None],
                 download_data: Callable[[str, Path], None] | None = None,
                 wrap_build: BuildWrap | None = None) -> Project:
    """Fetch the bundle and the data sets the job reads and build the environment (each once per node), then make
    this rank's working directory, with a read-only link per mount in its ``data/`` (``STRATA_DATA_DIR``).
    ``download_data(digest, path)`` writes a data set's bytes. Raises :class:`UserError` for what retrying
    cannot fix."""
    from components.runtime.contract.data import mounts_of

    code, environment = project_of(claim)
    leases: list[Lease] = []
    try:
        bundle_dir = None
        if code:
            lease = cache.bundle(str(code["digest"]), download, note, expanded=code.get("expanded_size"))
            leases.append(lease)
            bundle_dir = lease.path
        python = sys.executable
        if environment:
            env_lease = cache.environment(environment, bundle_dir, note, wrap=wrap_build)
            if env_lease is not None:
                leases.append(env_lease)
                python = str(env_lease.path / "bin" / "python")
        work = cache.state_dir / "work" / f"{claim['attempt']}-{rank}"
        _remove_tree(work)
        workdir = work / "code"
        if bundle_dir is not None:
            shutil.copytree(bundle_dir, workdir, symlinks=False, copy_function=shutil.copy)
            for root, dirs, files in os.walk(workdir):  # writable by the attempt (the cache stays read-only)
                for name in dirs:
                    os.chmod(os.path.join(root, name), 0o755)
                for name in files:
                    full = os.path.join(root, name)
                    os.chmod(full, os.stat(full).st_mode | 0o200)
            os.chmod(workdir, 0o755)
        else:
            workdir.mkdir(parents=True)
        project = Project(workdir=workdir, output_dir=work / "output", checkpoint_dir=work / "checkpoint",
                          tmp_dir=work / "tmp", python=python, leases=leases)
        for directory in (project.output_dir, project.checkpoint_dir, project.tmp_dir, work / "data"):
            directory.mkdir(parents=True, exist_ok=True)
        # Every data set the job reads (its mounts and its data providers'), leased: readable in its sandbox.
        fetched = fetch_data_sets(cache, claim, download_data, note)
        leases.extend(fetched.values())
        for alias, mount in sorted(mounts_of(claim.get("spec")).items()):
            (work / "data" / alias).symlink_to(fetched[str(mount["digest"])].path, target_is_directory=True)
        extra = [str(workdir / p) for p in (environment or {}).get("python_path") or []]
        project.env = {**(environment or {}).get("env", {}),
                       "STRATA_WORKDIR": str(workdir), "STRATA_OUTPUT_DIR": str(project.output_dir),
                       "STRATA_CHECKPOINT_DIR": str(project.checkpoint_dir), "TMPDIR": str(project.tmp_dir),
                       "STRATA_DATA_DIR": str(work / "data"), "STRATA_PYTHON_PATH": os.pathsep.join(extra)}
        if python != sys.executable:
            project.env["VIRTUAL_ENV"] = str(Path(python).parent.parent)
        return project
    except BaseException:
        for lease in leases:
            lease.release()
        raise


def remove_workdir(state_dir: Path, attempt: str, rank: int) -> None:
    _remove_tree(Path(state_dir) / "work" / f"{attempt}-{rank}")
