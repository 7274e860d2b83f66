"""Celery broker configuration shared by the control plane and the node agents.

``filesystem:///abs/dir`` is the embedded broker: kombu's filesystem transport spooling messages as files in
one directory (written atomically: :class:`AtomicFilesystemTransport`), so ``strata up`` needs no server.
``redis://``, ``rediss://`` and ``amqp://`` URLs pass through unchanged; Redis URLs are served by
:class:`RedisTransport` (kombu's, surviving a broker restart: see there).
"""

from __future__ import annotations

import logging
import os
import uuid
from contextlib import suppress
from pathlib import Path
from time import monotonic
from urllib.parse import urlparse

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.transport import redis as kombu_redis
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


class _RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, still able to reach the broker after its connection was closed under it.

    When the broker goes away (a Redis restart), Celery's consumer collects and closes the broken connection:
    kombu clears the transport's ``client`` (where the broker is) and, once a channel is closed, the channel's
    ``connection`` (its transport). A channel whose close was cut short by the connection error is closed again
    after that, and puts its unacknowledged messages back (``restore_unacked_once``) through a new connection
    pool, whose ``_connparams`` reads ``self.connection.client.hostname``: an ``AttributeError`` -- not a
    connection error, so nothing catches it and the worker dies ("Unrecoverable error") or hangs half-stopped.
    A task still running when the connection was lost acknowledges its message on that old channel when it
    ends, and hits the same error. This channel keeps its transport and the broker's address, so both reach
    Redis (the acknowledgement removes the message from the unacked index) or fail with a connection error,
    which kombu and Celery handle.
    """

    def __init__(self, connection, **kwargs):
        self._transport = connection
        self._broker = connection.client  # the kombu Connection: the broker's address and credentials
        super().__init__(connection, **kwargs)

    def _connparams(self, asynchronous=False):
        connection, transport = self.connection, self._transport
        if connection is not None and connection.client is not None:
            return super()._connparams(asynchronous=asynchronous)
        # Released under us: for this call only, as it was (kombu cleared both to break reference cycles).
        cleared = transport.client is None
        self.connection = transport
        if cleared:
            transport.client = self._broker
        try:
            return super()._connparams(asynchronous=asynchronous)
        finally:
            self.connection = connection
            if cleared:
                transport.client = None


class RedisTransport(kombu_redis.Transport):
    Channel = _RedisChannel


# Every process that builds broker settings imports this module first, so the scheme resolves everywhere.
TRANSPORT_ALIASES.setdefault(EMBEDDED_SCHEME, f"{__name__}:AtomicFilesystemTransport")
# Redis URLs keep their scheme (``rediss`` still means TLS to kombu) and get the transport above.
TRANSPORT_ALIASES["redis"] = TRANSPORT_ALIASES["rediss"] = f"{__name__}:RedisTransport"

# Celery settings both sides must agree on: JSON only, late acks, one message at a time.
COMMON_CELERY_SETTINGS = {
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    # Off, against Celery's planned 6.0 default and the research note's list of settings: cancelling exists so
    # that a late-acked message the broker redelivers after a connection loss never runs twice (celery#6654,
    # "no duplicate after broker drop"). Here a duplicate cannot run: an attempt is claimed once, fenced by its
    # token, and a node's second claim of it is refused (409), so the redelivered message ends at its claim.
    # Cancelling would instead kill every running attempt's processes on any broker blip (a Redis restart, a
    # dropped connection) and turn it into lost work, a requeue and lost GPU time. The attempt keeps running
    # and acknowledges its message when it ends (_RedisChannel keeps that possible).
    "worker_cancel_long_running_tasks_on_connection_loss": False,
    "broker_connection_retry_on_startup": True,
    "task_ignore_result": True,
    "worker_hijack_root_logger": False,
    "worker_send_task_events": False,
}

# Celery warns at every connection loss that the setting above is off (its 6.0 default will be on), and says the
# running tasks' messages will be redelivered: it is off on purpose (and set, so a new default changes nothing).
# The worker turns warnings into log records of ``py.warnings`` (and re-enables Celery's after any filter of ours).
_CANCEL_WARNING = "we introduced an optional breaking change which\non connection loss cancels"


class _QuietCancelWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _CANCEL_WARNING not in record.getMessage()


logging.getLogger("py.warnings").addFilter(_QuietCancelWarning())


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
