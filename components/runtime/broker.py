"""Celery broker configuration shared by the control plane and the node agents.

``filesystem:///abs/dir`` is the embedded broker: kombu's filesystem transport spooling messages as files in
one directory (written atomically: :class:`AtomicFilesystemTransport`), so ``strata up`` needs no server.
``redis://`` and ``amqp://`` URLs pass through unchanged.
"""

from __future__ import annotations

import os
import uuid
from contextlib import suppress
from pathlib import Path
from time import monotonic
from urllib.parse import urlparse

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

# The embedded broker's transport: kombu's filesystem transport, with messages written atomically (below).
EMBEDDED_SCHEME = "strata-filesystem"


class _AtomicChannel(filesystem.Channel):
    """Writes each message under a temporary name and renames it into place when complete.

    kombu's own ``_put`` creates ``<time>_<uuid>.<queue>.msg`` and then writes into it, while a consumer in
    another process lists the folder and moves any ``.msg`` file away at once: it can take an empty or partial
    file, fail to decode it, and crash the consuming worker (the message is lost with it). A rename is atomic on
    POSIX, and the temporary name does not end in ``.<queue>.msg``, so a consumer only ever sees whole messages.
    """

    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as error:
            with suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from error


class AtomicFilesystemTransport(filesystem.Transport):
    Channel = _AtomicChannel


# Every process that builds broker settings imports this module first, so the scheme resolves everywhere.
TRANSPORT_ALIASES.setdefault(EMBEDDED_SCHEME, f"{__name__}:AtomicFilesystemTransport")

# Celery settings both sides must agree on: JSON only, late acks, one message at a time.
COMMON_CELERY_SETTINGS = {
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    "worker_cancel_long_running_tasks_on_connection_loss": True,
    "broker_connection_retry_on_startup": True,
    "task_ignore_result": True,
    "worker_hijack_root_logger": False,
    "worker_send_task_events": False,
}


def celery_broker_options(url: str, prefix: str | None = None) -> dict:
    """Return Celery settings (``broker_url`` and transport options) for ``url``. ``prefix`` namespaces every
    Redis key, so several deployments (or test runs) can share one Redis server."""
    parsed = urlparse(url)
    if parsed.scheme == "filesystem":
        spool = Path(parsed.path or ".").expanduser().resolve()
        for folder in ("queue", "processed", "control"):
            (spool / folder).mkdir(parents=True, exist_ok=True)
        return {
            "broker_url": f"{EMBEDDED_SCHEME}://",
            "broker_transport_options": {
                "data_folder_in": str(spool / "queue"),
                "data_folder_out": str(spool / "queue"),
                "processed_folder": str(spool / "processed"),
                "control_folder": str(spool / "control"),  # exchange bindings; kombu's default is the cwd
                "store_processed": False,
                "polling_interval": 0.02,
            },
        }
    if parsed.scheme in {"redis", "rediss"}:
        # Above any job's runtime, so a long attempt is never redelivered while it still runs;
        # lost nodes are handled by the lease reaper instead.
        return {
            "broker_url": url,
            "broker_transport_options": {"visibility_timeout": 8 * 86400, "polling_interval": 0.05,
                                         **({"global_keyprefix": prefix} if prefix else {})},
        }
    if parsed.scheme == "memory":  # in-process only: unit tests, and importing the worker module unconfigured
        return {"broker_url": url, "broker_transport_options": {}}
    if parsed.scheme in {"amqp", "amqps", "pyamqp"}:
        return {"broker_url": url, "broker_transport_options": {}}
    raise ValueError(f"unsupported broker URL scheme {parsed.scheme!r}: use filesystem://, redis:// or amqp://")
