"""The node-local cache of preprocessed samples: files on disk, memory-mapped, checksummed, LRU under a budget.

One directory per node (the datacache node service tells every attempt where: ``STRATA_DATACACHE_DIR``), shared
by every process on the node -- attempts in child processes, sessions a device service hosts, loader workers:

    <root>/index.sqlite        entries (key, dataset, pipeline, part, bytes, checksum, last use, build cost) and
                               counters (hits, misses, evictions, corrupt, uncached), SQLite in WAL mode
    <root>/entries/<key>.npc   one entry: a JSON header naming its arrays, then their bytes
    <root>/locks/<key>.lock    flock'ed while the entry is computed: one computation per entry, node-wide

:meth:`CacheStore.get` is the whole protocol. A hit maps the file read-only-copy-on-write, checks its BLAKE2b
checksum against the index, and returns numpy arrays over the mapping (no copy). A miss takes the entry's lock --
a second process asking for the same entry meanwhile waits on it and then hits, so concurrent jobs compute it
once -- builds, writes to a temporary file, makes room (least recently used first, under a global lock, never
past the budget), renames into place and records it. A corrupt entry (a checksum mismatch, a short file, a
broken header) is counted, dropped and computed again: it is never returned. An entry larger than the whole
budget is returned uncached.

A deleted or unwritable cache directory costs recomputation, never an error: every operation recreates what
it needs, and when even that fails :meth:`CacheStore.get` returns ``build()`` uncached.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import sqlite3
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("strata.datacache")

DIR_ENV = "STRATA_DATACACHE_DIR"
BYTES_ENV = "STRATA_DATACACHE_BYTES"
DEFAULT_BUDGET = 4 << 30
MAGIC = b"STRATA-DC1\n"
ALIGN = 64
COUNTERS = ("hits", "misses", "evictions", "corrupt", "uncached")


class CorruptEntry(Exception):
    """An entry's bytes do not match its checksum, or its file cannot be read as an entry."""


def default_root() -> Path:
    raw = os.environ.get(DIR_ENV, "").strip()
    if raw:
        return Path(raw)
    return Path(tempfile.gettempdir()) / f"strata-datacache-{os.getuid()}"


def default_budget() -> int:
    raw = os.environ.get(BYTES_ENV, "").strip()
    try:
        return max(0, int(float(raw))) if raw else DEFAULT_BUDGET
    except ValueError:
        log.warning("%s=%r is not a number of bytes; using %d", BYTES_ENV, raw, DEFAULT_BUDGET)
        return DEFAULT_BUDGET


def checksum(payload: memoryview | bytes) -> str:
    return hashlib.blake2b(payload, digest_size=32).hexdigest()


# -- the entry file format --------------------------------------------------------------------------------------
def write_entry(path: Path, arrays: dict[str, np.ndarray]) -> tuple[int, str]:
    """Write ``arrays`` as one entry file; returns ``(bytes on disk, checksum of the payload)``."""
    layout, offset, digest = [], 0, hashlib.blake2b(digest_size=32)
    contiguous = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    for name, array in contiguous.items():
        layout.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape), "offset": offset,
                       "nbytes": int(array.nbytes)})
        offset += -(-int(array.nbytes) // ALIGN) * ALIGN
    header = json.dumps({"arrays": layout, "payload": offset}).encode()
    start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
    with open(path, "wb") as out:
        out.write(MAGIC + struct.pack("<Q", len(header)) + header)
        out.write(b"\0" * (start - out.tell()))
        for item, array in zip(layout, contiguous.values(), strict=True):
            data = memoryview(array).cast("B") if array.nbytes else b""
            out.write(data)
            digest.update(data)
            pad = -(-item["nbytes"] // ALIGN) * ALIGN - item["nbytes"]
            out.write(b"\0" * pad)
            digest.update(b"\0" * pad)
        out.flush()
        os.fsync(out.fileno())
    return start + offset, digest.hexdigest()


def read_entry(path: Path, expected: str) -> dict[str, np.ndarray]:
    """Map an entry file and check it against ``expected`` (its checksum); raises :class:`CorruptEntry`."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < len(MAGIC) + 8:
            raise CorruptEntry(f"{path.name}: {size} bytes is too short")
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)  # private: writes never reach the file
    try:
        if mapped[: len(MAGIC)] != MAGIC:
            raise CorruptEntry(f"{path.name}: not a cache entry")
        (length,) = struct.unpack("<Q", mapped[len(MAGIC): len(MAGIC) + 8])
        header = json.loads(bytes(mapped[len(MAGIC) + 8: len(MAGIC) + 8 + length]))
        start = -(-(len(MAGIC) + 8 + length) // ALIGN) * ALIGN
        if start + int(header["payload"]) != size:
            raise CorruptEntry(f"{path.name}: {size} bytes, the header says {start + header['payload']}")
        with memoryview(mapped) as whole, whole[start:] as view:
            matches = checksum(view) == expected
        if not matches:
            raise CorruptEntry(f"{path.name}: checksum mismatch")
        arrays = {}
        for item in header["arrays"]:
            dtype = np.dtype(item["dtype"])
            count = int(np.prod(item["shape"], dtype=np.int64))
            arrays[item["name"]] = np.frombuffer(mapped, dtype=dtype, count=count,
                                                 offset=start + int(item["offset"])).reshape(item["shape"])
        return arrays
    except CorruptEntry:
        mapped.close()
        raise
    except (ValueError, KeyError, TypeError, struct.error) as error:
        mapped.close()
        raise CorruptEntry(f"{path.name}: unreadable header ({error})") from error


# -- the store --------------------------------------------------------------------------------------------------
SETUP_TRIES = 20

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY, dataset TEXT, pipeline TEXT, part TEXT, bytes INTEGER, checksum TEXT,
    created REAL, last_used REAL, build_seconds REAL, cpu_seconds REAL, hits INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER);
"""


class CacheStore:
    """The cache in directory ``root`` with a size budget of ``budget`` bytes (see the module docstring)."""

    def __init__(self, root: str | Path | None = None, budget: int | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.budget = default_budget() if budget is None else int(budget)

    # -- plumbing -------------------------------------------------------------------------------------------
    def _dirs(self) -> None:
        for path in (self.root, self.root / "entries", self.root / "locks"):
            path.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A fresh connection per operation: a directory deleted under us is simply recreated next time."""
        self._dirs()
        connection = sqlite3.connect(self.root / "index.sqlite", timeout=60, isolation_level=None)
        try:
            for attempt in range(SETUP_TRIES):
                try:
                    # Switching a new index to WAL needs it to itself: processes that open it together may get
                    # SQLITE_BUSY at once, without the busy timeout, so the setup is retried.
                    connection.execute("PRAGMA journal_mode=WAL")
                    connection.execute("PRAGMA synchronous=NORMAL")
                    connection.executescript(SCHEMA)
                    break
                except sqlite3.OperationalError as error:
                    if "locked" not in str(error) and "busy" not in str(error) or attempt == SETUP_TRIES - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
            yield connection
        finally:
            connection.close()

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        self._dirs()
        with open(self.root / "locks" / f"{name}.lock", "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _count(self, db: sqlite3.Connection, name: str, by: int = 1) -> None:
        db.execute("INSERT INTO counters(name, value) VALUES (?, ?) "
                   "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value", (name, by))

    def _entry_path(self, key: str) -> Path:
        return self.root / "entries" / f"{key}.npc"

    # -- the protocol ---------------------------------------------------------------------------------------
    def get(self, key: str, build: Callable[[], dict[str, np.ndarray]], meta: dict[str, Any] | None = None,
            on_build: Callable[[], None] | None = None) -> tuple[dict[str, np.ndarray], bool]:
        """``(arrays, hit)`` for ``key``, computing them with ``build()`` at most once node-wide.

        ``meta`` (``dataset``, ``pipeline``, ``part``) is recorded with the entry. ``on_build`` is called just
        before this process starts computing (after it knows nobody else has)."""
        meta = meta or {}
        try:
            found = self._hit(key)
            if found is not None:
                return found, True
            with self._lock(key):
                found = self._hit(key, count_miss=True)  # a peer may have computed it while we waited
                if found is not None:
                    return found, True
                if on_build is not None:
                    on_build()
                began = time.perf_counter()
                arrays = build()
                seconds = time.perf_counter() - began
                return self._store(key, arrays, meta, seconds), False
        except (OSError, sqlite3.Error) as error:
            log.warning("data cache at %s unusable (%s): computing %s uncached", self.root, error, key[:12])
            return build(), False

    def _hit(self, key: str, count_miss: bool = False) -> dict[str, np.ndarray] | None:
        with self._db() as db:
            row = db.execute("SELECT checksum FROM entries WHERE key = ?", (key,)).fetchone()
            if row is None:
                if count_miss:
                    self._count(db, "misses")
                return None
            try:
                arrays = read_entry(self._entry_path(key), row[0])
            except (CorruptEntry, FileNotFoundError) as error:
                log.warning("data cache: entry %s dropped (%s); computing it again", key[:12], error)
                db.execute("DELETE FROM entries WHERE key = ?", (key,))
                if isinstance(error, CorruptEntry):
                    self._count(db, "corrupt")
                self._entry_path(key).unlink(missing_ok=True)
                return None
            db.execute("UPDATE entries SET last_used = ?, hits = hits + 1 WHERE key = ?", (time.time(), key))
            self._count(db, "hits")
            return arrays

    def _store(self, key: str, arrays: dict[str, np.ndarray], meta: dict[str, Any],
               seconds: float) -> dict[str, np.ndarray]:
        self._dirs()
        handle, temporary = tempfile.mkstemp(prefix=f".{key[:12]}-", suffix=".tmp", dir=self.root / "entries")
        os.close(handle)
        temporary = Path(temporary)
        try:
            size, digest = write_entry(temporary, arrays)
            if size > self.budget:
                with self._db() as db:
                    self._count(db, "uncached")
                log.info("data cache: %s is %d bytes, more than the whole budget (%d): not cached", key[:12], size,
                         self.budget)
                return arrays
            with self._lock(".index"):
                self._make_room(size)
                os.replace(temporary, self._entry_path(key))
                cpu = float(np.asarray(arrays["cpu"]).reshape(-1)[0]) if "cpu" in arrays else seconds
                now = time.time()
                with self._db() as db:
                    db.execute("INSERT OR REPLACE INTO entries(key, dataset, pipeline, part, bytes, checksum, created,"
                               " last_used, build_seconds, cpu_seconds, hits) VALUES (?,?,?,?,?,?,?,?,?,?,0)",
                               (key, meta.get("dataset"), meta.get("pipeline"), str(meta.get("part", "")), size,
                                digest, now, now, seconds, cpu))
            return arrays
        finally:
            temporary.unlink(missing_ok=True)

    def _make_room(self, size: int) -> None:
        """Evict least recently used entries until ``size`` more bytes fit the budget (under the index lock).
        A reader that has an evicted entry mapped keeps reading it: unlinking never touches a live mapping."""
        with self._db() as db:
            used = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0]
            if used + size <= self.budget:
                return
            for key, nbytes in db.execute("SELECT key, bytes FROM entries ORDER BY last_used").fetchall():
                if used + size <= self.budget:
                    break
                db.execute("DELETE FROM entries WHERE key = ?", (key,))
                self._entry_path(key).unlink(missing_ok=True)
                used -= nbytes
                self._count(db, "evictions")

    def enforce_budget(self, budget: int | None = None) -> None:
        """Evict until the entries fit ``budget`` (default: this store's); the node service calls it."""
        if budget is not None:
            self.budget = int(budget)
        with self._lock(".index"):
            self._make_room(0)

    def drop(self, key: str) -> None:
        with self._lock(".index"), self._db() as db:
            db.execute("DELETE FROM entries WHERE key = ?", (key,))
            self._entry_path(key).unlink(missing_ok=True)

    def meta(self, key: str) -> dict[str, Any] | None:
        """An entry's record (build seconds, CPU seconds, bytes...), or None."""
        with self._db() as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM entries WHERE key = ?", (key,)).fetchone()
            return dict(row) if row is not None else None

    # -- what the node service reports ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._db() as db:
            counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
            count, used = db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM entries").fetchone()
        return {"bytes": int(used), "budget": int(self.budget), "entries": int(count),
                **{name: int(counters.get(name, 0)) for name in COUNTERS}}

    def entries(self, limit: int = 200) -> list[dict[str, Any]]:
        with self._db() as db:
            db.row_factory = sqlite3.Row
            rows = db.execute("SELECT key, dataset, pipeline, part, bytes, last_used, build_seconds, cpu_seconds, "
                              "hits FROM entries ORDER BY last_used DESC LIMIT ?", (limit,)).fetchall()
        return [dict(row) for row in rows]

    def disk_bytes(self) -> int:
        """Bytes of the entry files actually on disk (tests check the budget with it)."""
        total = 0
        for path in (self.root / "entries").glob("*.npc"):
            try:
                total += path.stat().st_size
            except FileNotFoundError:  # evicted while we looked
                continue
        return total
