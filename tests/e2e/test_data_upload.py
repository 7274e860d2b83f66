"""Uploaded data sets on a real cluster (``strata up`` with a node): ``strata data upload`` sends a directory in
checked chunks, a command job mounts it with ``spec.data.mount`` and reads it read-only under ``STRATA_DATA_DIR``;
the data set is kept while the job runs and can be deleted once it ended. The cluster stores its bytes on S3 (a
real SeaweedFS, tests/seaweedfs.py): the chunks, the assembled data set and the node's download all go through
the bucket."""

from __future__ import annotations

import json
import textwrap

import pytest
from e2e_support import TERMINAL, running_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, seaweedfs):
    """``strata up`` with one local virtual GPU, its artifact storage on SeaweedFS, shared by the module's tests."""
    with running_cluster(tmp_path_factory.mktemp("strata-e2e-home"), virtual_gpus=1,
                         env=seaweedfs.settings("e2e-data-upload/")) as running:
        yield running

READ = textwrap.dedent('''
    import os, pathlib, sys
    root = pathlib.Path(os.environ["STRATA_DATA_DIR"]) / "images"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    print("files:", ",".join(files), flush=True)
    rows = (root / "labels.csv").read_text().splitlines()
    print(f"strata: rows={len(rows)}", flush=True)
    try:
        (root / "labels.csv").write_text("changed")
    except OSError:
        print("the data set is read-only", flush=True)
    else:
        sys.exit("the mounted data set was writable" if os.geteuid() else 0)
''')


def stored(seaweedfs, under: str) -> list[str]:
    """The keys in the bucket under the cluster's prefix and ``under``."""
    listing = seaweedfs.client().list_objects_v2(Bucket=seaweedfs.bucket, Prefix=f"e2e-data-upload/{under}")
    return [item["Key"] for item in listing.get("Contents", [])]


def test_a_command_job_reads_an_uploaded_directory(cluster, tmp_path, seaweedfs):
    data = tmp_path / "pets"
    (data / "cats").mkdir(parents=True)
    (data / "cats" / "a.bin").write_bytes(bytes(range(256)) * 40)
    (data / "labels.csv").write_text("a,cat\nb,dog\nc,cat\n")
    (data / ".gitignore").write_text("*\n")  # data: shipped like any file
    uploaded = cluster.cli("data", "upload", "pets", str(data), "--chunk-size", "4KiB", timeout=300)
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    assert "(100%)" in uploaded.stdout and "data set pets: 3 files" in uploaded.stdout, uploaded.stdout
    listed = cluster.cli("data", "list")
    assert listed.returncode == 0 and "pets" in listed.stdout, listed.stdout + listed.stderr
    assert len(stored(seaweedfs, "data/")) == 1 and not stored(seaweedfs, "uploads/")  # the chunks are dropped

    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps({
        "name": "reads-data", "kind": "train", "resources": {"gpus": 0.5},
        "spec": {"command": ["python", "-c", READ], "data": {"mount": {"images": "pets"}}}}))
    result = cluster.cli("submit", str(job_path), "--wait", timeout=600)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED", job
    digest = cluster.get("data/pets/")["digest"]
    assert job["spec"]["data"]["mount"]["images"]["digest"] == digest  # the stored spec names what was mounted
    text = "\n".join(cluster.logs(job_id))
    assert "files: .gitignore,cats/a.bin,labels.csv" in text, text[-3000:]
    assert "the data set is read-only" in text or "rows=3" in text, text[-3000:]
    assert any(point["name"] == "rows" and point["value"] == 3 for point in cluster.metrics(job_id))
    assert job["state"] in TERMINAL
    deleted = cluster.cli("data", "delete", "pets")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert not stored(seaweedfs, "data/")


HASH = textwrap.dedent('''
    import hashlib, os, pathlib
    root = pathlib.Path(os.environ["STRATA_DATA_DIR"]) / "big"
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        print(f"{path.relative_to(root)} {hashlib.sha256(path.read_bytes()).hexdigest()}", flush=True)
''')


def test_a_large_data_set_goes_straight_to_the_store(cluster, tmp_path, seaweedfs):
    """Over STRATA_DIRECT_MIN_BYTES the CLI sends the chunks to the bucket through presigned URLs (none reach the
    control plane's chunk route); the job that mounts the data set reads exactly the files uploaded."""
    import hashlib
    import os

    data = tmp_path / "big"
    data.mkdir()
    files = {"a.bin": os.urandom(6 << 20), "b.bin": os.urandom(5 << 20)}
    for name, payload in files.items():
        (data / name).write_bytes(payload)
    uploaded = cluster.cli("data", "upload", "big", str(data), "--chunk-size", "5MiB", timeout=600)
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    assert "straight to the object store" in uploaded.stdout and "data set big: 2 files" in uploaded.stdout, \
        uploaded.stdout
    assert not stored(seaweedfs, "uploads/")  # no chunk went through the control plane
    uploads = seaweedfs.client().list_multipart_uploads(Bucket=seaweedfs.bucket, Prefix="e2e-data-upload/")
    assert not uploads.get("Uploads"), uploads  # completed: nothing left open in the store

    job_path = tmp_path / "big.json"
    job_path.write_text(json.dumps({
        "name": "hashes-data", "kind": "train", "resources": {"gpus": 0.5},
        "spec": {"command": ["python", "-c", HASH], "data": {"mount": {"big": "big"}}}}))
    result = cluster.cli("submit", str(job_path), "--wait", timeout=600)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    text = "\n".join(cluster.logs(job_id))
    for name, payload in files.items():
        assert f"{name} {hashlib.sha256(payload).hexdigest()}" in text, text[-3000:]
