"""The gpushare node service: one sharing-service process per device (:mod:`components.gpushare.service`),
declared in the plugin's manifest (``node_services``) and supervised by the node agent like any node service.

Started eagerly (an idle service is a small process that imports torch only on its first job), restarted with
backoff when it dies, stopped with the agent. The services listen on unix sockets under
``<state dir>/gpushare`` (or a short temporary directory when that path is too long for a socket),
authenticated with a random key kept in a 0600 file there. Each heartbeat carries what they did
(``reports["gpushare"] = {"devices": [entry per device]}``, see :meth:`DeviceService.report
<components.gpushare.service.DeviceService.report>`), and the heartbeat's answer sets their policy
(``sharing_policy``). In the node's worker, :meth:`DeviceSharingService.host_for` sends an attempt that got a
fraction of one device here.

Light: no torch.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.runtime.contract.services import NodeInfo, ProcessService
from components.runtime.shared.protocol import HostAddress, call, read_authkey, socket_path

log = logging.getLogger("strata.gpushare.node")

POLICY_ENV = "STRATA_GPUSHARE_POLICY"  # the policy until the control plane sends the pool's
CALL_TIMEOUT_S = 2.0
SLICE_LIMIT = 2000  # slices per heartbeat (as components.gpushare.service.SLICE_LIMIT)


@dataclass
class _Shared:
    """What the device services of one node share: the directory, the socket directory and the key."""

    directory: Path
    socket_dir: Path
    authkey_file: Path
    live: set[int] = field(default_factory=set)

    @classmethod
    def create(cls, directory: Path) -> _Shared:
        socket_dir = directory
        if len(str(directory / "device-999.sock")) > 100:  # AF_UNIX paths are limited to 108 bytes
            socket_dir = Path(tempfile.mkdtemp(prefix="strata-gpushare-"))
        authkey_file = directory / "authkey"
        authkey_file.write_text(secrets.token_hex(32))
        authkey_file.chmod(0o600)
        return cls(directory, socket_dir, authkey_file)


class DeviceSharingService(ProcessService):
    """The sharing service of one device."""

    name = "device"

    def __init__(self, device: Any, shared: _Shared, policy: str | None = None):
        self.device = device
        self.shared = shared
        self.policy = policy or os.environ.get(POLICY_ENV, "fair")
        self.applied: str | None = None  # the policy the running process was last given
        self.cursor = time.time()

    @classmethod
    def instances(cls, node: NodeInfo) -> list[DeviceSharingService]:
        if not node.devices:
            return []
        shared = _Shared.create(node.directory("gpushare"))
        return [cls(device, shared) for device in node.devices]

    @property
    def label(self) -> str:
        return f"gpushare/device-{self.device.index}"

    @property
    def socket(self) -> str:
        return socket_path(self.shared.socket_dir, self.device.index)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "components.gpushare.service", "--device-index", str(self.device.index),
                "--kind", "cuda" if self.device.kind == "cuda" else "virtual",
                "--memory", str(self.device.memory_total), "--socket", self.socket,
                "--authkey-file", str(self.shared.authkey_file), "--policy", self.policy]

    def start(self) -> None:
        super().start()
        self.applied = self.policy
        self.shared.live.add(self.device.index)

    def call(self, message: dict) -> dict | None:
        if not self.check():
            return None
        try:
            return call(self.socket, read_authkey(self.shared.authkey_file), message, CALL_TIMEOUT_S)
        except (OSError, EOFError, TimeoutError) as error:
            log.debug("%s did not answer %s: %s", self.label, message.get("op"), error)
            return None

    def configure(self, settings: dict[str, Any]) -> None:
        policy = settings.get("sharing_policy")
        if not policy:
            return
        self.policy = str(policy)
        if self.applied == self.policy:
            return
        reply = self.call({"op": "policy", "policy": self.policy})
        if reply and reply.get("ok"):
            self.applied = self.policy
            log.info("device %d now shares with policy %s", self.device.index, self.policy)
        elif reply:
            log.warning("device %d refused policy %r: %s", self.device.index, self.policy, reply.get("reason"))
            self.applied = self.policy  # do not ask again every beat

    def report(self) -> dict[str, Any] | None:
        """``{"devices": [entry]}``: this device's sharing entry, slices since the previous report."""
        reply = self.call({"op": "report", "since": self.cursor, "limit": SLICE_LIMIT})
        if not (reply and reply.get("ok")):
            return None
        self.cursor = reply["cursor"]
        return {"devices": [reply["sharing"]]}

    @classmethod
    def merge(cls, payloads: list[Any]) -> dict[str, Any]:
        devices = [entry for payload in payloads for entry in payload.get("devices", [])]
        return {"devices": sorted(devices, key=lambda entry: entry.get("index", 0))}

    def worker_config(self) -> dict[str, Any]:
        return {"socket_dir": str(self.shared.socket_dir), "authkey_file": str(self.shared.authkey_file)}

    @classmethod
    def host_for(cls, config: dict[str, Any], claim: dict[str, Any], node: str) -> HostAddress | None:
        """The device's service for a one-worker attempt that got a fraction of one device on this node."""
        if not config.get("socket_dir") or int(claim.get("world_size", 1)) != 1:
            return None
        mine = [a for a in claim.get("allocations", []) if a.get("node") == node]
        if len(mine) != 1 or not mine[0].get("device"):
            return None
        device = mine[0]["device"]
        if float(device.get("share", 1.0)) >= 1.0:
            return None
        return HostAddress(socket_path(config["socket_dir"], int(device["index"])), config["authkey_file"],
                           label=f"the GPU-sharing service of device {device['index']}")

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)
        self.shared.live.discard(self.device.index)
        if not self.shared.live and self.shared.socket_dir != self.shared.directory:
            shutil.rmtree(self.shared.socket_dir, ignore_errors=True)
