"""The datacache node service: owns the node's cache directory, keeps it under its budget and reports it.

The cache itself is a directory every process on the node reads and writes (:mod:`components.datacache.store`);
this service tells the attempts where it is (``STRATA_DATACACHE_DIR`` and ``STRATA_DATACACHE_BYTES`` through
:meth:`environment`), evicts down to the budget on every heartbeat (the budget may shrink between runs), and
reports its size, entries, hits, misses, evictions and corrupt entries dropped.

The directory is ``STRATA_DATACACHE_DIR`` when the node's environment sets it (fast local disk, say), else
``datacache/`` in the node agent's state directory; the budget is ``STRATA_DATACACHE_BYTES`` (default 4 GiB).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from components.datacache.store import BYTES_ENV, DIR_ENV, CacheStore, default_budget
from components.runtime.contract.services import NodeInfo, NodeService

log = logging.getLogger("strata.datacache")
REPORTED_ENTRIES = 100


class DataCacheService(NodeService):
    name = "cache"

    def __init__(self, root: Path, budget: int):
        self.store = CacheStore(root, budget)
        self.running = False

    @classmethod
    def instances(cls, node: NodeInfo) -> list[DataCacheService]:
        raw = os.environ.get(DIR_ENV, "").strip()
        root = Path(raw) if raw else node.directory("datacache")
        return [cls(root, default_budget())]

    def environment(self) -> dict[str, str]:
        return {DIR_ENV: str(self.store.root), BYTES_ENV: str(self.store.budget)}

    def start(self) -> None:
        self.store.root.mkdir(parents=True, exist_ok=True)
        self.running = True

    def check(self) -> bool:
        if not self.running:
            return False
        try:
            self.store.enforce_budget()  # recreates a directory removed under us
        except Exception as error:  # noqa: BLE001 - a sick cache is reported, never fatal to the agent
            log.warning("data cache at %s: %r", self.store.root, error)
        return True

    def stop(self, timeout: float = 15.0) -> None:
        self.running = False

    def report(self) -> dict[str, Any] | None:
        try:
            stats = self.store.stats()
            entries = self.store.entries(REPORTED_ENTRIES)
        except Exception as error:  # noqa: BLE001
            log.warning("data cache at %s cannot be read: %r", self.store.root, error)
            return None
        return {**stats, "time": time.time(), "entries": [{"key": e["key"][:16], "dataset": e["dataset"] or "",
                                      "pipeline": e["pipeline"] or "", "part": e["part"] or "",
                                      "bytes": int(e["bytes"] or 0), "hits": int(e["hits"] or 0),
                                      "last_used": float(e["last_used"] or 0.0),
                                      "build_seconds": round(float(e["build_seconds"] or 0.0), 3)}
                                     for e in entries]}
