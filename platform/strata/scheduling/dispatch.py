"""Publishing attempts to node queues. The control plane sends by task name: it never imports node code."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

RUN_ATTEMPT_TASK = "strata.node.run_attempt"


def publish_all(dispatches) -> None:
    from strata.celery import app

    with app.producer_or_acquire() as producer:
        for queue, attempt_id, token in dispatches:
            try:
                app.send_task(RUN_ATTEMPT_TASK, args=[attempt_id, token], queue=queue, producer=producer)
            except Exception:  # the reconciler republishes anything not sent
                log.exception("could not publish attempt %s to %s", attempt_id, queue)
