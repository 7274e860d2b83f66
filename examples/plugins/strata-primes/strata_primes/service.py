"""The ``primes`` node service: measures the node's scratch disk and load for every heartbeat.

It runs inside the node agent (no process of its own): ``report()`` is cheap, a ``statvfs`` and a load average.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from components.runtime.contract.services import NodeInfo, NodeService


class ScratchDiskService(NodeService):
    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.running = False

    @classmethod
    def instances(cls, node: NodeInfo) -> list[ScratchDiskService]:
        return [cls(node.directory("primes"))]  # one per node, watching a directory of its own

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.running = True

    def check(self) -> bool:
        return self.running and self.state_dir.is_dir()

    def stop(self, timeout: float = 10.0) -> None:
        self.running = False

    def report(self) -> dict[str, Any] | None:
        usage = shutil.disk_usage(self.state_dir)
        return {"disk_free": int(usage.free), "disk_total": int(usage.total), "load1": float(os.getloadavg()[0])}
