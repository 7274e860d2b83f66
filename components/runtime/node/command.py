"""Command jobs: run any program as one rank of an attempt (``spec.command``), as Strata's child process sees it.

The attempt's child process (``components.runtime.node.child``) supervises the program:

- **Logs.** Its stdout and stderr become the job's log, line by line (``[rank N]`` in a gang); stderr lines at
  level ``stderr``.
- **Metrics.** Lines ``strata: name=value [name=value ...]`` on stdout (``step=N`` sets the step; Katib's stdout
  collector reads the same shape), or the ``strata_report`` module (:mod:`components.runtime.node.userlib`) over a
  pipe. A line that is not a report is logged as it is.
- **Outcome.** Exit code 0 succeeds; any other code, or a signal, fails with the last lines of stderr. An error
  that retrying cannot fix (the program does not exist, Python cannot import a module or open the script) raises
  :class:`~components.runtime.contract.project.UserError`: the job fails once, not ``max_attempts`` times.
- **Checkpoints.** ``STRATA_CHECKPOINT_DIR`` is stored (a gzip'd tar) when the program exits, when it calls
  ``strata_report.save()`` and when the attempt is stopped (SIGTERM to the program's process group, then
  ``STRATA_COMMAND_GRACE_S``, then SIGKILL); the next attempt starts with it restored in the same place.
  Rank 0's directory is the job's checkpoint; every rank starts from it.
- **Artifacts.** Rank 0's files in ``STRATA_OUTPUT_DIR`` become the job's artifacts when the program exits
  (``a/b.txt`` is stored as ``a__b.txt``).
- **Gangs.** Every rank gets what ``torchrun`` sets: ``MASTER_ADDR``/``MASTER_PORT`` (a free port on rank 0's
  node, published through the control plane's rendezvous), ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK`` (the worker sets the local ones), and ``GLOO_SOCKET_IFNAME``
  / ``NCCL_SOCKET_IFNAME`` naming the interface of the node's registered address, so an unmodified DDP script's
  ``init_process_group("gloo" | "nccl")`` meets its peers across nodes.
- **Fractional GPUs.** On a share of a CUDA device, a ``sitecustomize`` in the program's path caps torch's
  allocator at the share (``torch.cuda.set_per_process_memory_fraction``), as the child does for workloads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from components.runtime.contract.context import Context
from components.runtime.contract.project import UserError, parse_report
from components.runtime.node.project_cache import USERLIB

GRACE_S = float(os.environ.get("STRATA_COMMAND_GRACE_S", "5"))
TAIL_LINES = 30
# The last line of a Python traceback, or the interpreter's own refusal, that retrying cannot fix.
DETERMINISTIC = re.compile(r"^(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|TabError)\b|"
                           r"can't open file .*\[Errno 2\]|^.*: No such file or directory$")
ARTIFACT_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
CHECKPOINT_NAME = "checkpoint.pt"  # the job's checkpoint artifact, whatever its format


class CommandFailed(RuntimeError):
    """The program exited with a non-zero code or was killed by a signal."""


def artifact_name(relative: str) -> str:
    name = ARTIFACT_UNSAFE.sub("_", relative.replace("/", "__")).lstrip("._-") or "output"
    return name[:200]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, 0))
        return probe.getsockname()[1]


def rendezvous_env(ctx: Context) -> dict[str, str]:
    """``MASTER_ADDR``/``MASTER_PORT`` for a gang's ranks: rank 0 picks a free port on its node's address and
    publishes it through the control plane; the other ranks wait for it. One worker: loopback and a free port."""
    if ctx.world_size <= 1:
        return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port("127.0.0.1"))}
    if ctx.rank == 0:
        host = ctx.gang.node_address() or "127.0.0.1"
        try:
            port = _free_port(host)
        except OSError:
            port = _free_port("0.0.0.0")
        address = ctx.gang.publish(port)
    else:
        address = ctx.gang.address()
    host, _, port_text = address.rpartition(":")
    return {"MASTER_ADDR": host.strip("[]"), "MASTER_PORT": port_text.split("/", 1)[0]}


SITECUSTOMIZE = '''\
# Written by Strata: caps torch's CUDA allocator at this job's share of the device.
import os as _os
_share = float(_os.environ.get("STRATA_GPU_SHARE", "1") or 1)
if _share < 1.0 and _os.environ.get("CUDA_VISIBLE_DEVICES"):
    try:
        import torch as _torch
        if _torch.cuda.is_available():
            _torch.cuda.set_per_process_memory_fraction(_share, 0)
    except Exception:
        pass
'''


class CommandRun:
    """One run of ``command`` in the current attempt rank (see the module's docstring)."""

    def __init__(self, ctx: Context, command: list[str], *, grace_s: float = GRACE_S):
        self.ctx = ctx
        self.command = list(command)
        self.grace_s = grace_s
        self.workdir = Path(os.environ.get("STRATA_WORKDIR") or os.getcwd())
        self.output_dir = Path(os.environ.get("STRATA_OUTPUT_DIR") or self.workdir / "output")
        self.checkpoint_dir = Path(os.environ.get("STRATA_CHECKPOINT_DIR") or self.workdir / "checkpoint")
        self.stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.step = 0
        self.step_lock = threading.Lock()
        self.saves = 0
        self.save_lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.stopped = False

    # -- the environment the program sees ----------------------------------------------------------------------
    def environment(self, report_fd: int, ack_fd: int, support: Path) -> dict[str, str]:
        env = dict(os.environ)
        python_bin = str(Path(sys.executable).parent)
        env["PATH"] = python_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        extra = [p for p in (env.pop("STRATA_PYTHON_PATH", "") or "").split(os.pathsep) if p]
        # The program's own directory first, then the job's python_path, then strata_report and the sitecustomize.
        env["PYTHONPATH"] = os.pathsep.join([str(self.workdir), *extra, str(USERLIB), str(support)])
        env.update({"STRATA_REPORT_FD": str(report_fd), "STRATA_ACK_FD": str(ack_fd),
                    "STRATA_WORKDIR": str(self.workdir), "STRATA_OUTPUT_DIR": str(self.output_dir),
                    "STRATA_CHECKPOINT_DIR": str(self.checkpoint_dir), "PYTHONUNBUFFERED": "1",
                    "STRATA_JOB_ID": self.ctx.job_id, "STRATA_ATTEMPT_ID": self.ctx.attempt_id,
                    "RANK": str(self.ctx.rank), "WORLD_SIZE": str(self.ctx.world_size)})
        env.setdefault("LOCAL_RANK", "0")
        env.setdefault("LOCAL_WORLD_SIZE", "1")
        env.setdefault("GROUP_RANK", "0")
        env.setdefault("NODE_RANK", env["GROUP_RANK"])
        if int(env["LOCAL_WORLD_SIZE"]) > 1:  # as torchrun does: one thread per rank unless the job says otherwise
            env.setdefault("OMP_NUM_THREADS", "1")
        env.update(rendezvous_env(self.ctx))
        if self.ctx.world_size > 1:
            # gloo and NCCL listen where the host name resolves (often 127.0.0.1): across nodes, the ranks must
            # listen on the node's registered address, as the built-in gangs do (components.runtime.node.gang).
            from components.runtime.node.gang import interface_of

            interface = interface_of(self.ctx.gang.node_address() or "")
            if interface:
                env.setdefault("GLOO_SOCKET_IFNAME", interface)
                env.setdefault("NCCL_SOCKET_IFNAME", interface)
        devices = self.ctx.devices
        share = devices[0].share if devices else 1.0
        env["STRATA_GPU_SHARE"] = f"{share:g}"
        if devices and devices[0].kind == "cuda" and share < 1.0:
            env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        for name in ("STRATA_NODE_CONFIG",):
            env.pop(name, None)
        return env

    # -- checkpoints and outputs ---------------------------------------------------------------------------------
    def restore(self) -> bool:
        with tempfile.TemporaryDirectory(dir=self.workdir, prefix=".checkpoint-") as spool:
            archive = Path(spool) / "checkpoint.tar.gz"
            if not self.ctx._load_checkpoint_file(archive) or not archive.stat().st_size:
                return False
            return self._unpack_checkpoint(archive)

    def _unpack_checkpoint(self, archive: Path) -> bool:
        with archive.open("rb") as source:
            if source.read(2) != b"\x1f\x8b":
                self.ctx.log("the job's checkpoint is not a command job's directory; starting fresh", level="warning")
                return False
        from components.runtime.shared import bundles

        for child in list(self.checkpoint_dir.iterdir()) if self.checkpoint_dir.exists() else []:
            if child.is_dir():
                import shutil

                shutil.rmtree(child)
            else:
                child.unlink()
        try:
            with archive.open("rb") as source:
                manifest = bundles.unpack(source, self.checkpoint_dir, max_bytes=2**40, max_files=10**6)
        except bundles.BundleError as error:
            self.ctx.log(f"the job's checkpoint could not be restored ({error}); starting fresh", level="warning")
            return False
        self.ctx.log(f"restored the checkpoint: {len(manifest.files)} files, {bundles.human_size(manifest.size)} "
                     f"in {self.checkpoint_dir}")
        return True

    def save(self, why: str) -> bool:
        """Store the checkpoint directory (rank 0 only); False when it is empty or this is not rank 0. The archive
        is packed to a file beside the working directory and streamed from there (direct to the object store
        where the control plane has one), so a large checkpoint is never held in memory."""
        if self.ctx.rank != 0 or not self.checkpoint_dir.is_dir():
            return False
        from components.runtime.shared import bundles

        with self.save_lock:
            try:
                with tempfile.NamedTemporaryFile(dir=self.workdir, prefix=".checkpoint-", suffix=".tar.gz") as archive:
                    # Stored, not compressed (gzip level 0: CRC only): a checkpoint is written often, and at a stop
                    # within a grace period; weights barely compress, and level 1 costs ~40 s per GiB of them.
                    manifest, _digest = bundles.pack(self.checkpoint_dir, archive, max_bytes=2**40, max_files=10**6,
                                                     compresslevel=0)
                    archive.flush()
                    self.ctx._save_checkpoint_file(Path(archive.name))
            except bundles.BundleError as error:
                if "empty" in str(error):
                    return False
                self.ctx.log(f"checkpoint not saved ({why}): {error}", level="warning")
                return False
            self.saves += 1
        self.ctx.log(f"checkpoint saved ({why}): {len(manifest.files)} files, {bundles.human_size(manifest.size)}")
        return True

    def upload_outputs(self) -> int:
        if self.ctx.rank != 0 or not self.output_dir.is_dir():
            return 0
        count = 0
        for path in sorted(self.output_dir.rglob("*")):
            if path.is_file() and not path.is_symlink():
                relative = path.relative_to(self.output_dir).as_posix()
                try:
                    self.ctx.artifact(path, artifact_name(relative))
                    count += 1
                except Exception as error:  # noqa: BLE001 - one file that cannot be stored costs only itself
                    self.ctx.log(f"artifact {relative} not stored: {error}", level="warning")
        return count

    # -- reading the program ----------------------------------------------------------------------------------------
    def _metrics(self, values: dict[str, float], step: int | None) -> None:
        with self.step_lock:
            if step is None:
                self.step += 1
                step = self.step
            else:
                self.step = max(self.step, step)
        if values:
            self.ctx.metrics(values, step)

    def _pump_stdout(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            parsed = parse_report(line)
            if parsed is not None:
                self._metrics(*parsed)
            self.ctx.log(line, level="stdout")
        stream.close()

    def _pump_stderr(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.stderr_tail.append(line)
            self.ctx.log(line, level="stderr")
        stream.close()

    def _pump_reports(self, reports, acks) -> None:
        for line in reports:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if message.get("op") == "metrics" and isinstance(message.get("values"), dict):
                values = {str(k): float(v) for k, v in message["values"].items() if isinstance(v, int | float)}
                step = message.get("step")
                self._metrics(values, int(step) if isinstance(step, int | float) else None)
            elif message.get("op") == "save":
                ok = self.save("requested by the program")
                with contextlib.suppress(OSError, ValueError):
                    acks.write("ok\n" if ok else "no\n")
                    acks.flush()
        reports.close()

    # -- running ---------------------------------------------------------------------------------------------------
    def _signal_group(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def run(self) -> int:
        """Run the program to its end; returns its exit code. Raises UserError for a program that cannot start."""
        for directory in (self.output_dir, self.checkpoint_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.restore()
        report_read, report_write = os.pipe()
        ack_read, ack_write = os.pipe()
        support = Path(tempfile.mkdtemp(prefix="strata-site-"))
        (support / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = self.environment(report_write, ack_read, support)
        from components.runtime.contract.services import set_parent_death_signal

        try:
            self.process = subprocess.Popen(self.command, cwd=str(self.workdir), env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                            pass_fds=(report_write, ack_read), start_new_session=True,
                                            preexec_fn=set_parent_death_signal)
        except FileNotFoundError:
            raise UserError(f"the command {self.command[0]!r} was not found (on PATH or in the code bundle)") from None
        except PermissionError:
            raise UserError(f"the command {self.command[0]!r} is not executable") from None
        except OSError as error:
            raise UserError(f"the command {self.command[0]!r} could not start: {error}") from None
        finally:
            os.close(report_write)
            os.close(ack_read)
        self.ctx.log(f"started {' '.join(self.command)[:300]} (pid {self.process.pid}) in {self.workdir}")
        reports = os.fdopen(report_read, "r")
        acks = os.fdopen(ack_write, "w")
        threads = [threading.Thread(target=self._pump_stdout, args=(self.process.stdout,), daemon=True),
                   threading.Thread(target=self._pump_stderr, args=(self.process.stderr,), daemon=True),
                   threading.Thread(target=self._pump_reports, args=(reports, acks), daemon=True)]
        for thread in threads:
            thread.start()
        stop_sent = None
        while self.process.poll() is None:
            if stop_sent is None and self.ctx.should_stop():
                self.stopped = True
                self.ctx.log(f"stopping the program (SIGTERM; SIGKILL after {self.grace_s:g} s)")
                self._signal_group(signal.SIGTERM)
                stop_sent = time.monotonic()
            elif stop_sent is not None and time.monotonic() - stop_sent > self.grace_s:
                self._signal_group(signal.SIGKILL)
            time.sleep(0.1)
        self._signal_group(signal.SIGKILL)  # what it left behind in its group
        for thread in threads:
            thread.join(timeout=10)
        with contextlib.suppress(OSError):
            acks.close()
        import shutil

        shutil.rmtree(support, ignore_errors=True)
        code = self.process.returncode
        self.save("at a stop" if self.stopped else "at exit")
        uploaded = self.upload_outputs()
        if uploaded:
            self.ctx.log(f"{uploaded} file(s) of STRATA_OUTPUT_DIR stored as artifacts")
        return code

    def failure(self, code: int) -> Exception:
        detail = " | ".join(line for line in list(self.stderr_tail)[-3:] if line.strip())
        last = next((line for line in reversed(self.stderr_tail) if line.strip()), "")
        if code < 0:
            return CommandFailed(f"{self.command[0]} was killed by signal {-code}" + (f": {detail}" if detail else ""))
        message = f"{self.command[0]} exited with code {code}" + (f": {detail}" if detail else "")
        if DETERMINISTIC.search(last.strip()):
            return UserError(message)
        return CommandFailed(message)


def run_command(ctx: Context, command: list[str], **options: Any) -> None:
    """Run ``command`` as this attempt rank; returns when it succeeded or was stopped, raises otherwise."""
    run = CommandRun(ctx, command, **options)
    code = run.run()
    if code == 0 or run.stopped:
        return
    raise run.failure(code)
