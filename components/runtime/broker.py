"""Celery broker configuration shared by the control plane and the node agents.

``filesystem:///abs/dir`` is the embedded broker: kombu's filesystem transport spooling messages as files in
one directory, so ``strata up`` needs no server. ``redis://`` and ``amqp://`` URLs pass through unchanged.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

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
            "broker_url": "filesystem://",
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
