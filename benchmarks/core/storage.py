"""``strata bench storage``: what direct transfers (issue 33) buy, against a real S3-compatible store on loopback
(SeaweedFS, :mod:`benchmarks.core.seaweedfs`) and a real control plane.

The control plane is ``strata up --virtual-gpus 0`` (the server and the scheduler, embedded SQLite and broker, no
local node), a subprocess in its own process group, its artifact storage ``S3ArtifactStorage`` on the store. This
process plays a node through the real HTTP protocol: it registers a node with the stack's node token (one virtual
device), submits a job with the stack's user token, takes the attempt the scheduler placed on that node and its
fencing token (what the broker's dispatch carries; read here from the stack's database, as no worker consumes the
node's queue), claims it (``node/attempts/ID/claim/``), and keeps its lease with full heartbeats that list the
attempt. Every transfer is then :func:`components.runtime.client.transfers.upload` / ``download`` with that attempt's
``node=&token=`` fencing, as the node's worker calls them.

1. **Checkpoint write** of 1 GiB (quick: 256 MiB) of incompressible bytes from a local file, MiB/s:
   ``transfers.upload`` (start, 64 MiB parts 4 in parallel through presigned URLs signed with each part's
   Content-MD5, complete: the SHA-256 of the file and the MD5 of each part included) against boto3's
   ``upload_file`` with the default ``TransferConfig`` (the ``aws s3 cp`` equivalent) of the same file to the same
   bucket. Ratio ours / baseline; target >= 0.9.
2. **Control-plane CPU per GiB moved**: the CPU seconds (user + system, psutil) of every process of the ``strata
   up`` group, as a delta around an upload and a download of the same file through ``transfers`` (``upload`` then
   ``download`` of the attempt's checkpoint), per GiB moved (2 x the size). Ours: the stack above (presigned URLs);
   baseline: a second stack with ``STRATA_DIRECT_TRANSFERS=false`` and ``STRATA_MAX_UPLOAD_BYTES`` raised over the
   size, where the same calls send the bytes through the control plane (``PUT .../artifacts/NAME/?kind=checkpoint``
   and the streamed ``GET .../checkpoint/``). Ratio baseline / ours; target >= 100 (ours <= 0.01x). The group's
   CPU while idle for as long (the scheduler's periodic passes, the lease bookkeeping) is measured beside it and
   reported, not subtracted.

Each figure is the median of 3 runs with their range (never the best run); a run of figure 1 is an upload through
the protocol and a boto3 upload, back to back. This module imports neither torch nor Django.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from benchmarks import benchkit

MIB = 1 << 20
GIB = 1 << 30
FULL = {"bytes": GIB, "runs": 3}
QUICK = {"bytes": 256 * MIB, "runs": 3}
WRITE_TARGET = 0.9  # ours / boto3's upload_file, throughput
IDLE_WINDOW_S = 30.0  # at most, the group's idle CPU is measured over this long
CPU_TARGET = 100.0  # through the control plane / direct, CPU seconds per GiB (ours <= 0.01x)


def _say(message: str) -> None:
    print(message, flush=True)


# --- the control plane's CPU: every process of the ``strata up`` group ------------------------------------------

def group_cpu(pgid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each live process of process group ``pgid``, by pid (per process, so one
    that comes or goes between two snapshots never makes a negative sum)."""
    import psutil

    times = {}
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid:
                cpu = process.cpu_times()
                times[process.pid] = cpu.user + cpu.system
        except (ProcessLookupError, psutil.Error):
            continue
    return times


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(max(0.0, seconds - before.get(pid, 0.0)) for pid, seconds in after.items())


def group_roles(pgid: int) -> dict[int, str]:
    """What each process of the group is: ``up``, ``server``, ``scheduler`` (the word after ``strata.cli.main``),
    or its name."""
    import psutil

    roles = {}
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if os.getpgid(process.pid) != pgid:
                continue
        except ProcessLookupError:
            continue
        words = process.info["cmdline"] or []
        after = words.index("strata.cli.main") + 1 if "strata.cli.main" in words else None
        roles[process.pid] = words[after] if after is not None and after < len(words) else process.info["name"]
    return roles


def by_role(before: dict[int, float], after: dict[int, float], roles: dict[int, str]) -> dict[str, float]:
    """:func:`cpu_delta` per role of :func:`group_roles`."""
    used: dict[str, float] = {}
    for pid, seconds in after.items():
        role = roles.get(pid, "other")
        used[role] = used.get(role, 0.0) + max(0.0, seconds - before.get(pid, 0.0))
    return used


# --- a node of our own, holding one real attempt --------------------------------------------------------------

class Node:
    """A node registered through the node API with the stack's node token, one virtual device, running one real
    attempt of a job submitted through the user API: its route prefix (``base``) and fencing (``auth``) are what
    ``transfers.upload`` and ``download`` take. A thread keeps its lease (a full heartbeat listing the attempt every
    heartbeat interval)."""

    def __init__(self, stack, credentials: dict):
        from benchmarks.core.cp_shared import bench_job
        from components.runtime.client.client import ControlPlaneClient

        self.client = ControlPlaneClient(stack.url, credentials["node_token"], retries=3, timeout=600)
        name = f"bench-storage-{uuid.uuid4().hex[:6]}"
        self.registration = self.client.post("node/register/", {
            "name": name, "hostname": name, "labels": {"bench": "storage"},
            "devices": [{"index": 0, "kind": "virtual", "name": "virtual-0", "memory_total": 16 * GIB}],
            "info": {"python": sys.version.split()[0], "pid": os.getpid()}})
        self.node = self.registration["node"]
        self.attempts: list[str] = []
        self._stop = threading.Event()
        self._beats = threading.Thread(target=self._keep_lease, daemon=True, name="bench-storage-lease")
        self._beats.start()
        user = ControlPlaneClient(stack.url, credentials["token"], retries=3, timeout=60)
        kind, spec = bench_job()
        job = user.post("jobs/", {"name": "bench-storage", "kind": kind, "max_attempts": 1, "time_limit": 86400,
                                  "resources": {"gpus": 1.0}, "spec": spec})
        attempt, token = _dispatched(stack.home / "strata.sqlite3", job["id"])
        self.auth = {"node": self.node, "token": token}
        self.client.post(f"node/attempts/{attempt}/claim/", self.auth)
        self.attempts.append(attempt)
        self.attempt = attempt
        self.base = f"node/attempts/{attempt}/"
        self.job = job["id"]

    def _keep_lease(self) -> None:
        interval = float(self.registration.get("heartbeat_seconds", 3.0))
        while not self._stop.wait(interval):
            try:
                self.client.post("node/heartbeat/", {"node": self.node, "session": self.registration["session"],
                                                     "samples": [], "attempts": list(self.attempts)})
            except Exception as error:  # noqa: BLE001 - a late beat shows as a refused transfer, said there
                _say(f"    heartbeat failed: {error}")

    def close(self) -> None:
        self._stop.set()
        self._beats.join(10)


def _dispatched(database: Path, job_id: str, timeout: float = 60.0) -> tuple[str, str]:
    """The attempt the scheduler placed for ``job_id`` and its fencing token (the dispatch's arguments), from the
    stack's SQLite database (read-only)."""
    deadline = time.monotonic() + timeout
    key = uuid.UUID(str(job_id)).hex
    while time.monotonic() < deadline:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10) as connection:
            row = connection.execute("SELECT id, fencing_token FROM jobs_attempt WHERE job_id IN (?, ?) AND "
                                     "ended_at IS NULL ORDER BY number DESC", (key, str(job_id))).fetchone()
        if row:
            return str(uuid.UUID(str(row[0]))), row[1]
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} was not placed on the bench's node within {timeout:g} s")


# --- one stack on the store --------------------------------------------------------------------------------------

class StorageStack:
    """``strata up --virtual-gpus 0`` with its artifacts on ``store`` under ``prefix`` (``direct``: presigned
    transfers, or the bytes through the control plane), and a :class:`Node` holding an attempt on it."""

    def __init__(self, store, prefix: str, direct: bool, size: int):
        from benchmarks.stack import Stack, free_port

        self.home = Path(tempfile.mkdtemp(prefix=f"strata-bench-storage-{'direct' if direct else 'through'}-"))
        env = {**store.settings(prefix), "STRATA_DIRECT_TRANSFERS": "true" if direct else "false",
               "STRATA_MAX_UPLOAD_BYTES": str(max(512 * MIB, 2 * size))}
        self.stack = Stack(self.home, free_port(), 0, env)
        self.node: Node | None = None
        try:
            credentials = self.stack.wait_ready()
            self.node = Node(self.stack, credentials)
        except BaseException:
            self.close(keep=True)
            raise

    @property
    def pgid(self) -> int:
        return self.stack.process.pid

    def upload(self, path: Path, name: str = "bench.ckpt") -> dict:
        from components.runtime.client import transfers

        return transfers.upload(self.node.client, self.node.base, self.node.auth, path, name, "checkpoint")

    def download(self, target: Path) -> None:
        from components.runtime.client import transfers

        if not transfers.download(self.node.client, f"{self.node.base}checkpoint/", self.node.auth, target):
            raise RuntimeError("the attempt's checkpoint was not found")

    def close(self, keep: bool = False) -> None:
        if self.node is not None:
            self.node.close()
        self.stack.stop()
        if keep:
            _say(f"  the stack's logs are kept in {self.home}")
        else:
            shutil.rmtree(self.home, ignore_errors=True)


def _random_file(path: Path, size: int) -> Path:
    """``size`` incompressible bytes (a checkpoint's floats compress little)."""
    with path.open("wb") as out:
        left = size
        while left > 0:
            block = os.urandom(min(64 * MIB, left))
            out.write(block)
            left -= len(block)
    return path


def _same(a: Path, b: Path) -> bool:
    from components.runtime.client.transfers import file_digest

    return a.stat().st_size == b.stat().st_size and file_digest(a) == file_digest(b)


# --- the measurements -------------------------------------------------------------------------------------------

def transfer_run(stack: StorageStack, source: Path, size: int, scratch: Path) -> dict:
    """One upload and one download of ``source`` through ``transfers`` on ``stack``: their seconds, the group's CPU
    seconds around both (in all and by role), and whether the bytes came back the same."""
    before = group_cpu(stack.pgid)
    began = time.perf_counter()
    record = stack.upload(source)
    upload_s = time.perf_counter() - began
    target = scratch / "downloaded.bin"
    target.unlink(missing_ok=True)
    stack.download(target)
    transfer_s = time.perf_counter() - began
    after = group_cpu(stack.pgid)
    try:
        checked = record.get("size") == size and _same(source, target)
    finally:
        target.unlink(missing_ok=True)
    return {"upload_s": upload_s, "transfer_s": transfer_s, "cpu_s": cpu_delta(before, after),
            "cpu_s_by_role": by_role(before, after, group_roles(stack.pgid)), "checked": checked}


def measure_stack(store, source: Path, size: int, runs: int, scratch: Path, direct: bool) -> dict:
    """On one stack (``direct``: presigned URLs; else ``STRATA_DIRECT_TRANSFERS=false``), ``runs`` times: a
    :func:`transfer_run`, and where direct, boto3's ``upload_file`` of the same file right after it (timed); then
    the group's CPU over an idle window as long as a run's transfers. Lists, one item per run."""
    client = store.client() if direct else None
    made: dict = {key: [] for key in ("upload_s", "transfer_s", "cpu_s", "cpu_s_by_role", "checked",
                                                 "ours_mib_s", "boto3_mib_s")}
    stack = StorageStack(store, f"bench-storage-{uuid.uuid4().hex[:8]}/", direct, size)
    ok = False
    try:
        def one() -> float:
            for key, value in transfer_run(stack, source, size, scratch).items():
                made[key].append(value)
            made["ours_mib_s"].append(size / MIB / made["upload_s"][-1])
            note = ""
            if client is not None:
                began = time.perf_counter()
                client.upload_file(str(source), store.bucket, f"bench-storage-boto3/{uuid.uuid4().hex}.bin")
                made["boto3_mib_s"].append(size / MIB / (time.perf_counter() - began))
                note = f", boto3 upload_file {made['boto3_mib_s'][-1]:.0f} MiB/s"
            _say(f"    run {len(made['cpu_s'])}/{runs}: transfers.upload {made['ours_mib_s'][-1]:.0f} MiB/s{note}; "
                 f"control plane CPU {made['cpu_s'][-1]:.2f} s for the upload + download "
                 f"({made['transfer_s'][-1]:.1f} s){'' if made['checked'][-1] else ' -- THE BYTES DIFFER'}")
            return made["cpu_s"][-1]

        made["cpu_repeat"] = benchkit.repeat(one, runs)  # the runs' CPU seconds: median and range
        made["idle_window_s"] = min(IDLE_WINDOW_S, statistics.median(made["transfer_s"]))
        made["idle_cpu_s"] = _idle_cpu(stack.pgid, made["idle_window_s"])
        ok = True
    finally:
        stack.close(keep=not ok)
    return made


def _idle_cpu(pgid: int, seconds: float) -> float:
    before = group_cpu(pgid)
    time.sleep(seconds)
    return cpu_delta(before, group_cpu(pgid))


# --- the figures --------------------------------------------------------------------------------------------------

def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _range(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def _without_idle(part: dict, gib_moved: float) -> list[float]:
    """CPU s/GiB of each run less the group's idle rate over the run's duration (for the record, not the figure)."""
    rate = part["idle_cpu_s"] / part["idle_window_s"] if part["idle_window_s"] else 0.0
    return [max(0.0, cpu - rate * seconds) / gib_moved for cpu, seconds in zip(part["cpu_s"], part["transfer_s"],
                                                                                strict=True)]


def figures(result: dict) -> list[benchkit.Figure]:
    """``checkpoint_write_mib_s`` (throughput, higher is better: ours / boto3) and ``control_plane_cpu_s_per_gib``
    (lower is better: through the control plane / direct), each the median of the runs with their range."""
    size, direct, through = result["bytes"], result["direct"], result["through"]
    gib_moved = 2 * size / GIB
    ours, boto = direct["ours_mib_s"], direct["boto3_mib_s"]
    per_gib = [value / gib_moved for value in direct["cpu_s"]]
    through_per_gib = [value / gib_moved for value in through["cpu_s"]]
    label = f"{size / GIB:g} GiB" if size >= GIB else f"{size // MIB} MiB"
    runs = len(ours)
    return [
        benchkit.Figure(
            "checkpoint_write_mib_s", f"checkpoint write of {label} through presigned multipart to SeaweedFS "
            f"(median of {runs} runs), against boto3 upload_file (the aws s3 cp equivalent)", _median(ours),
            _median(boto), "MiB/s", lower_is_better=False, target=WRITE_TARGET,
            mechanism_text=f"{_median(ours):.0f} MiB/s [{min(ours):.0f}-{max(ours):.0f}]",
            baseline_text=f"{_median(boto):.0f} MiB/s [{min(boto):.0f}-{max(boto):.0f}]",
            extra={"runs": ours, "range": _range(ours), "baseline_runs": boto, "baseline_range": _range(boto),
                   "run_ratios": [a / b for a, b in zip(ours, boto, strict=True)],
                   "bytes_checked": all(direct["checked"])}),
        benchkit.Figure(
            "control_plane_cpu_s_per_gib", f"control-plane CPU per GiB moved ({label} up and down through "
            f"transfers: presigned URLs, against the bytes through the control plane; median of {runs} runs)",
            _median(per_gib), _median(through_per_gib), "CPU s/GiB", target=CPU_TARGET,
            mechanism_text=f"{_median(per_gib):.3f} CPU s/GiB [{min(per_gib):.3f}-{max(per_gib):.3f}]",
            baseline_text=f"{_median(through_per_gib):.2f} CPU s/GiB "
                          f"[{min(through_per_gib):.2f}-{max(through_per_gib):.2f}]",
            extra={"runs": per_gib, "range": _range(per_gib), "baseline_runs": through_per_gib,
                   "baseline_range": _range(through_per_gib),
                   "idle_cpu_s_per_window": {"direct": direct["idle_cpu_s"], "through": through["idle_cpu_s"]},
                   "without_idle": {"direct": _median(_without_idle(direct, gib_moved)),
                                    "through": _median(_without_idle(through, gib_moved))},
                   "idle_window_s": {"direct": direct["idle_window_s"], "through": through["idle_window_s"]},
                   "bytes_checked": all(direct["checked"]) and all(through["checked"])}),
    ]


def measure(quick: bool = False, sizes: dict | None = None) -> dict:
    """Start the store, write the file, measure both stacks; return everything measured."""
    from benchmarks.core import seaweedfs

    sizes = sizes or (QUICK if quick else FULL)
    size, runs = int(sizes["bytes"]), int(sizes["runs"])
    scratch = Path(tempfile.mkdtemp(prefix="strata-bench-storage-"))
    try:
        with seaweedfs.started() as store:
            _say(f"  SeaweedFS at {store.endpoint}; writing {size / MIB:.0f} MiB of random bytes")
            source = _random_file(scratch / "checkpoint.bin", size)
            _say("  [1] direct transfers (presigned URLs): upload, download, boto3's upload_file")
            direct = measure_stack(store, source, size, runs, scratch, direct=True)
            _say("  [2] the bytes through the control plane (STRATA_DIRECT_TRANSFERS=false)")
            through = measure_stack(store, source, size, runs, scratch, direct=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"bytes": size, "runs": runs, "direct": direct, "through": through, "part_bytes": 64 * MIB,
            "parallel": 4, "cpus": os.cpu_count()}


def main(quick: bool = False, output: str | None = None) -> int:
    sizes = QUICK if quick else FULL
    _say(f"strata bench storage{' --quick' if quick else ''}: {sizes['bytes'] / MIB:.0f} MiB, {sizes['runs']} runs "
         f"per figure, {os.cpu_count()} CPUs")
    result = measure(quick)
    made = figures(result)
    doc = benchkit.document("storage", quick, made, details=result)
    _say("\n" + benchkit.figures_table(doc))
    if output:
        benchkit.write(doc, output)
        _say(f"results written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:], output=next(
        (arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--output=")), None)))
