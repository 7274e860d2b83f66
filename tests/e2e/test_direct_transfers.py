"""Direct transfers on a real cluster whose storage is a real S3 server (SeaweedFS): a command job's 1 GiB
checkpoint, over the control plane's own upload limit (64 MiB here), goes to the bucket through presigned
multipart uploads while the control plane's memory stays flat; the job's node is killed, and the next attempt
restores the checkpoint through presigned ranged reads, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading

import psutil
import pytest
from e2e_support import TERMINAL, group_processes, running_cluster, wait_for

GIB = 1 << 30

JOB = textwrap.dedent('''
    import hashlib, random, sys, time
    import strata_report
    state = strata_report.checkpoint_dir() / "state.bin"
    if state.exists():
        digest = hashlib.sha256()
        with state.open("rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
        print(f"resumed size={state.stat().st_size} sha256={digest.hexdigest()}", flush=True)
        (strata_report.output_dir() / "report.bin").write_bytes(random.Random(8).randbytes(3 << 20))
        sys.exit(0)
    rng, digest = random.Random(7), hashlib.sha256()
    with state.open("wb") as f:
        for _ in range(16):  # 1 GiB that does not compress
            block = rng.randbytes(64 << 20)
            f.write(block)
            digest.update(block)
    print(f"written sha256={digest.hexdigest()}", flush=True)
    print(f"saved={strata_report.save(timeout=1200)}", flush=True)
    while True:
        time.sleep(1)
''')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, seaweedfs):
    env = {**seaweedfs.settings("e2e-direct/"), "STRATA_MAX_UPLOAD_BYTES": str(64 << 20)}
    with running_cluster(tmp_path_factory.mktemp("direct-home"), virtual_gpus=0, env=env) as running:
        running.node = running.start_node("d1", virtual_gpus=1)
        wait_for(lambda: running.get("nodes/")["count"] >= 1, 90, message="the node to register")
        yield running


class PeakMemory:
    """The largest resident memory of the control plane's processes (``strata up``'s group), sampled."""

    def __init__(self, pgid: int):
        self.pgid, self.peak, self._stop = pgid, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        total = 0
        for process in group_processes(self.pgid):
            try:
                total += process.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.now())

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join(5)


@pytest.mark.timeout(1800)
def test_a_1_gib_checkpoint_goes_to_the_bucket_directly_and_is_resumed_after_the_node_is_killed(
        cluster, tmp_path, seaweedfs):
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps({"name": "big-checkpoint", "kind": "train", "resources": {"gpus": 0.5},
                                    "spec": {"command": ["python", "-c", JOB]}}))
    before = PeakMemory(cluster.process.pid).now()
    with PeakMemory(cluster.process.pid) as memory:
        result = cluster.cli("submit", str(job_path), timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        job_id = result.stdout.split("submitted job ")[1].split()[0]

        def log_text():
            return "\n".join(cluster.logs(job_id))

        wait_for(lambda: "saved=" in log_text() or cluster.job(job_id)["state"] in TERMINAL, 1200, interval=2,
                 message="the checkpoint to be saved")
    text = log_text()
    assert "saved=True" in text, f"{text[-3000:]}\n{cluster.output()}"
    assert "stored directly in" in text, text[-3000:]  # the node's note: presigned parts, not the control plane
    written = text.split("written sha256=")[1].split()[0]
    listing = seaweedfs.client().list_objects_v2(Bucket=seaweedfs.bucket, Prefix=f"e2e-direct/{job_id}/checkpoint/")
    sizes = [item["Size"] for item in listing.get("Contents", [])]
    assert len(sizes) == 1 and sizes[0] > GIB, sizes  # one object, over the 64 MiB the control plane takes
    grown = memory.peak - before
    assert grown < 256 << 20, f"the control plane grew by {grown >> 20} MiB while 1 GiB moved"

    os.killpg(cluster.node.pid, signal.SIGKILL)
    cluster.node.wait(timeout=10)
    wait_for(lambda: not group_processes(cluster.node.pid), 10, message="the node's processes to die")
    wait_for(lambda: cluster.job(job_id)["state"] != "RUNNING", 60, message="the job to leave RUNNING")
    cluster.node = cluster.start_node("d1", virtual_gpus=1)
    job = cluster.wait_state(job_id, TERMINAL, 900)
    text = "\n".join(cluster.logs(job_id))
    assert job["state"] == "SUCCEEDED", f"{job}\n{text[-3000:]}\n{cluster.output()}"
    assert f"resumed size={GIB} sha256={written}" in text, text[-3000:]
    assert [a["outcome"] for a in job["attempts"]] == ["node_lost", "succeeded"]

    # The job's output, downloaded by the CLI: the API redirects it to a presigned URL of the bucket.
    import random

    fetched = cluster.cli("artifacts", job_id, "--all", "-o", str(tmp_path / "out"), timeout=300)
    assert fetched.returncode == 0 and "checked" in fetched.stdout, fetched.stdout + fetched.stderr
    assert (tmp_path / "out" / "report.bin").read_bytes() == random.Random(8).randbytes(3 << 20)
    artifact = next(row for row in cluster.get(f"jobs/{job_id}/artifacts/") if row["name"] == "report.bin")
    redirect = cluster.session.get(f"{cluster.url}/api/v1/jobs/{job_id}/artifacts/{artifact['id']}/download/",
                                   allow_redirects=False, timeout=30)
    assert redirect.status_code == 302 and redirect.headers["Location"].startswith(seaweedfs.endpoint)
    listed = cluster.cli("artifacts", job_id)
    assert listed.returncode == 0 and "report.bin" in listed.stdout and "3.0 MiB" in listed.stdout, listed.stdout
