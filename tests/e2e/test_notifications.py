"""End-to-end: webhooks delivered by a real ``strata notifier`` (started by ``strata up``: a Celery worker of the
notify queue, in threads) to real receivers on 127.0.0.1. A receiver answering 500 is retried after the backoff
and then succeeds; a receiver that never answers holds only its own deliveries (cut at the read timeout) while
the other webhook's go through; ``strata webhooks test`` waits for and prints the outcome."""

from __future__ import annotations

import pytest
from e2e_support import running_cluster, wait_for
from webhook_receiver import receiving

from strata.notify.signing import verify_signature

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ENV = {"STRATA_WEBHOOK_ALLOW_PRIVATE": "1", "STRATA_NOTIFY_BACKOFF_S": "1", "STRATA_NOTIFY_READ_TIMEOUT_S": "3",
       "STRATA_NOTIFY_MAX_ATTEMPTS": "3"}


def test_the_notifier_retries_with_backoff_and_a_hanging_receiver_holds_up_no_other(tmp_path):
    with running_cluster(tmp_path / "home", virtual_gpus=0, env=ENV) as cluster, \
            receiving() as healthy, receiving() as hanging:
        hanging.hang = 120.0  # never answers in time: only the read timeout ends each try
        healthy.codes = [500]  # then 200
        slow = cluster.api("POST", "webhooks/", json={"url": hanging.url})
        fast = cluster.api("POST", "webhooks/", json={"url": healthy.url, "format": "json"})
        cluster.api("POST", f"webhooks/{slow['id']}/test/")
        hanging.wait_for(1)  # the notifier holds a connection to the silent receiver ...
        delivery = cluster.api("POST", f"webhooks/{fast['id']}/test/")
        first, second = healthy.wait_for(2, timeout=60)  # ... and the other webhook's tries go through meanwhile
        assert second.at - first.at >= 0.9, "the retry came before STRATA_NOTIFY_BACKOFF_S"
        assert [first.headers["Strata-Attempt"], second.headers["Strata-Attempt"]] == ["1", "2"]
        for request in (first, second):
            assert request.json()["id"] == str(delivery["id"])
            verify_signature(fast["secret"], request.body, request.headers["Strata-Signature"])
        done = wait_for(lambda: next((row for row in cluster.get(f"webhooks/{fast['id']}/deliveries/")["results"]
                                      if row["status"] == "succeeded"), None), 30, message="the delivery to succeed")
        assert (done["attempts"], done["response_code"]) == (2, 200)
        slow_log = wait_for(lambda: next((row for row in cluster.get(f"webhooks/{slow['id']}/deliveries/")["results"]
                                          if row["attempts"] >= 1), None), 60, message="the hanging try to end")
        assert slow_log["status"] in ("retrying", "failed") and slow_log["error"] == "no answer within 3 s"

        hanging.hang = 0.0
        hanging.release.set()
        listed = cluster.cli("webhooks", "list")
        assert listed.returncode == 0 and healthy.url in listed.stdout and hanging.url in listed.stdout
        tested = cluster.cli("webhooks", "test", str(fast["id"]))
        assert tested.returncode == 0, tested.stderr
        assert "succeeded after 1 try HTTP 200" in tested.stdout, tested.stdout
        deleted = cluster.cli("webhooks", "delete", str(slow["id"]))
        assert deleted.returncode == 0 and f"deleted webhook {slow['id']}" in deleted.stdout
        assert [row["id"] for row in cluster.get("webhooks/")["results"]] == [fast["id"]]
