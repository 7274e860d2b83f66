"""The node's side of direct transfers (the control plane's ``strata.jobs.transfers``): an attempt's artifacts and
checkpoints go straight to the object store in parallel, checksummed parts, and what it reads comes straight
from the store in parallel ranges, each through a URL the control plane signed for this attempt. Where the store
is local disk (or the object small), the bytes go through the control plane's own routes, as before.

Memory stays small whatever the size: a part is streamed from the file twice (its MD5, then the PUT), never held.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import io
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from components.runtime.client.client import ApiError, ControlPlaneClient

log = logging.getLogger(__name__)

PARALLEL = 4  # parts (or ranges) in flight at once
RANGE_BYTES = 64 << 20  # a download's range
PART_TRIES = 4  # one part's PUT (or one range's GET), with a fresh URL each time
READ = 1 << 20


class TransferError(RuntimeError):
    """A transfer that could not complete (the store or the control plane refused it, or the bytes differ)."""


class _Range(io.RawIOBase):
    """``length`` bytes of a file from ``offset``, as a stream for ``requests`` (it sends a file-like body in
    pieces, with its length: nothing is held in memory)."""

    def __init__(self, path: Path, offset: int, length: int):
        super().__init__()
        self._file = path.open("rb")
        self._file.seek(offset)
        self._left = length
        self.len = length  # what requests reads for Content-Length

    def readable(self) -> bool:
        return True

    def tell(self) -> int:  # requests subtracts it from ``len``: without it, it would send the body chunked
        return self.len - self._left

    def readinto(self, buffer) -> int:
        if self._left <= 0:
            return 0
        data = self._file.read(min(len(buffer), self._left))
        buffer[:len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


def file_digest(path: Path, offset: int = 0, length: int | None = None, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as source:
        source.seek(offset)
        left = path.stat().st_size - offset if length is None else length
        while left > 0 and (chunk := source.read(min(READ, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest() if algorithm == "sha256" else base64.b64encode(digest.digest()).decode()


def upload(client: ControlPlaneClient, base: str, auth: dict[str, str], path: Path, name: str, kind: str,
           *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Store the file ``path`` as the attempt's ``name`` (an artifact or the checkpoint). ``base`` is the attempt's
    route prefix (``node/attempts/<id>/``). Returns the control plane's record (id, size, sha256)."""
    size = path.stat().st_size
    sha256 = file_digest(path)
    start = client.post(f"{base}uploads/", {"name": name, "kind": kind, "size": size, "sha256": sha256},
                        params=auth)
    if not start.get("direct"):
        with path.open("rb") as body:
            return client.request("PUT", f"{base}artifacts/{name}/", data=body, params={**auth, "kind": kind},
                                  headers={"Content-Type": "application/octet-stream"}, timeout=3600)
    ticket, part_bytes, count = start["upload"], int(start["part_bytes"]), int(start["parts"])
    began = time.monotonic()
    try:
        for _round in range(PART_TRIES):
            stored = client.post(f"{base}uploads/parts/", {"upload": ticket, "parts": []}, params=auth)["stored"]
            missing = [n for n in range(1, count + 1) if str(n) not in stored]
            if missing:
                _send_parts(client, base, auth, ticket, path, part_bytes, size, missing, progress)
            try:
                answer = client.post(f"{base}uploads/complete/", {"upload": ticket}, params=auth)
            except ApiError as error:
                if error.status == 400 and round_may_help(error):
                    continue  # a part went missing or short: send it again
                raise
            if progress is not None:
                seconds = time.monotonic() - began
                progress(f"{name}: {size / 2**20:.0f} MiB stored directly in {count} part(s), {seconds:.1f} s "
                         f"({size / 2**20 / max(seconds, 1e-6):.0f} MiB/s)")
            return answer
        raise TransferError(f"the upload of {name} did not complete after {PART_TRIES} rounds")
    except BaseException:
        try:
            client.post(f"{base}uploads/abort/", {"upload": ticket}, params=auth, retries=0)
        except Exception:  # noqa: BLE001 - the store's lifecycle rule and the control plane's beat clean up
            log.debug("abort of the upload of %s failed", name, exc_info=True)
        raise


def round_may_help(error: ApiError) -> bool:
    payload = error.payload if isinstance(error.payload, dict) else {}
    return bool(payload) and set(payload) <= {"parts", "sizes"}


def _send_parts(client: ControlPlaneClient, base: str, auth: dict[str, str], ticket: str, path: Path,
                part_bytes: int, size: int, numbers: list[int], progress) -> None:
    def sign(number: int, md5: str) -> str:
        return client.post(f"{base}uploads/parts/", {"upload": ticket, "parts": [{"number": number, "md5": md5}]},
                           params=auth)["urls"][0]["url"]

    send_parts(path, numbers, lambda n: ((n - 1) * part_bytes, min(part_bytes, size - (n - 1) * part_bytes)), sign,
               progress)


def send_parts(path: Path, numbers: list[int], span: Callable[[int], tuple[int, int]],
               sign: Callable[[int, str], str], progress: Callable[[str], None] | None = None) -> None:
    """PUT the parts ``numbers`` of the file ``path`` to the object store, :data:`PARALLEL` at once: part ``n`` is
    ``span(n)`` (offset, length) of the file, sent to the URL ``sign(n, its Content-MD5)`` answers (asked again
    for each try). Raises :class:`TransferError` when the store refuses a part :data:`PART_TRIES` times."""
    session = requests.Session()  # no control-plane credentials on the store's URLs
    done, lock = [0], threading.Lock()

    def send(number: int) -> None:
        offset, length = span(number)
        md5 = file_digest(path, offset, length, "md5")
        for attempt in range(PART_TRIES):
            url = sign(number, md5)
            body = _Range(path, offset, length)
            try:
                response = session.put(url, data=body, headers={"Content-MD5": md5,
                                                                "Content-Length": str(length)}, timeout=600)
            except requests.RequestException as error:
                problem = f"{type(error).__name__}"
            else:
                if response.status_code < 300:
                    break
                problem = f"HTTP {response.status_code} {response.text[:200]}"
            finally:
                body.close()
            if attempt == PART_TRIES - 1:
                raise TransferError(f"part {number} was refused by the store: {problem}")
            time.sleep(min(0.5 * 2 ** attempt, 5.0))
        with lock:
            done[0] += 1
            if progress is not None and len(numbers) >= 8 and done[0] % max(1, len(numbers) // 4) == 0:
                progress(f"uploaded {done[0]}/{len(numbers)} parts")

    with session, concurrent.futures.ThreadPoolExecutor(PARALLEL, thread_name_prefix="strata-upload") as pool:
        for future in concurrent.futures.as_completed([pool.submit(send, n) for n in numbers]):
            future.result()


def download(client: ControlPlaneClient, route: str, auth: dict[str, str], target: Path, *,
             timeout: float = 3600) -> bool:
    """Fetch what ``route`` serves (a checkpoint, a source artifact, a bundle, a data set) into ``target``. False
    when there is none (404). Direct: parallel ranges of the presigned URL, checked against the object's SHA-256
    where the control plane names it."""
    try:
        link = client.request("GET", route, params={**auth, "link": "1"}, timeout=60)
    except ApiError as error:
        if error.status == 404:
            return False
        raise
    url = (link or {}).get("url") if isinstance(link, dict) else None
    if not url:
        response = client.request("GET", route, params=auth, raw=True, stream=True, timeout=timeout)
        with response, target.open("wb") as out:
            for chunk in response.iter_content(READ):
                out.write(chunk)
        return True
    size, sha256 = int(link["size"]), link.get("sha256")
    _ranged(url, size, target, lambda: client.request("GET", route, params={**auth, "link": "1"},
                                                      timeout=60)["url"])
    if sha256 and file_digest(target) != sha256:
        target.unlink(missing_ok=True)
        raise TransferError(f"the downloaded bytes do not match their SHA-256 ({route})")
    return True


def _ranged(url: str, size: int, target: Path, fresh_url: Callable[[], str]) -> None:
    with target.open("wb") as out:
        out.truncate(size)
    current = [url]
    session = requests.Session()

    def fetch(offset: int) -> None:
        length = min(RANGE_BYTES, size - offset)
        for attempt in range(PART_TRIES):
            try:
                response = session.get(current[0], headers={"Range": f"bytes={offset}-{offset + length - 1}"},
                                       stream=True, timeout=600)
                if response.status_code == 403 and attempt < PART_TRIES - 1:  # expired: sign again
                    current[0] = fresh_url()
                    continue
                if response.status_code not in (200, 206):
                    raise TransferError(f"the store answered HTTP {response.status_code}")
                written = 0
                with response, open(target, "r+b") as out:
                    out.seek(offset)
                    for chunk in response.iter_content(READ):
                        out.write(chunk)
                        written += len(chunk)
                if written != length:
                    raise TransferError(f"range at {offset}: {written} of {length} bytes")
                return
            except (requests.RequestException, TransferError):
                if attempt == PART_TRIES - 1:
                    raise
                time.sleep(min(0.5 * 2 ** attempt, 5.0))

    if size == 0:
        return
    with session, concurrent.futures.ThreadPoolExecutor(PARALLEL, thread_name_prefix="strata-download") as pool:
        for future in concurrent.futures.as_completed([pool.submit(fetch, o) for o in range(0, size, RANGE_BYTES)]):
            future.result()


def upload_bytes(client: ControlPlaneClient, base: str, auth: dict[str, str], data: bytes, name: str, kind: str,
                 directory: str | os.PathLike | None = None) -> dict[str, Any]:
    """:func:`upload` of bytes held in memory (a workload's checkpoint as ``torch.save`` made it)."""
    import tempfile

    with tempfile.NamedTemporaryFile(dir=directory, prefix="strata-upload-") as spool:
        spool.write(data)
        spool.flush()
        return upload(client, base, auth, Path(spool.name), name, kind)
