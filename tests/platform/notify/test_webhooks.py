"""Notifications: webhooks signed and delivered to a real HTTP receiver on 127.0.0.1, retried with backoff, a hanging
receiver cut off by the timeout without holding up another team's delivery, Slack's body, e-mail through the mail
backend, the lifecycle events that make them (job ends, quota reached, node lost), and the API's rules."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from strata.notify import services
from strata.notify.models import Delivery, EmailSubscription, Webhook
from strata.notify.signing import SignatureError, verify_signature

HOOKS = "/api/v1/webhooks/"


def create_hook(client, url, **body):
    answer = client.post(HOOKS, {"url": url, **body}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def run_queued(queued, limit: int = 20) -> list[float]:
    """Make every queued try, as the notifier would (the next try of a failed one is queued by the task);
    returns the countdowns the retries asked for."""
    from strata.notify.tasks import deliver_task

    countdowns = []
    done = 0
    while queued and done < limit:
        delivery_id, countdown = queued.pop(0)
        if countdown:
            countdowns.append(countdown)
        deliver_task(delivery_id)
        done += 1
    return countdowns


def test_a_test_delivery_is_signed_and_a_replay_is_detectable(admin_team, receiver, queued,
                                                              django_capture_on_commit_callbacks):
    client = admin_team["client"]
    created = create_hook(client, receiver.url)
    secret = created["secret"]
    assert secret.startswith("whsec_") and created["format"] == "json" and created["team"] == "alpha"
    assert created["events"] == ["job.succeeded", "job.failed", "job.preempted", "quota.reached", "node.lost"]
    # The secret is shown once: never in a listing or a read, and not stored in clear.
    assert "secret" not in client.get(f"{HOOKS}{created['id']}/").json()
    assert all("secret" not in row for row in client.get(HOOKS).json()["results"])
    assert secret not in Webhook.objects.get(pk=created["id"]).secret_ciphertext

    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(f"{HOOKS}{created['id']}/test/")
    assert answer.status_code == 202 and answer.json()["status"] == "pending"
    assert run_queued(queued) == []
    (request,) = receiver.wait_for(1)
    body = request.json()
    assert body["event"] == "webhook.test" and body["team"] == "alpha" and body["id"] == str(answer.json()["id"])
    assert request.headers["Strata-Event"] == "webhook.test"
    assert request.headers["Strata-Delivery"] == str(answer.json()["id"])
    header = request.headers["Strata-Signature"]
    stamp = verify_signature(secret, request.body, header)
    assert abs(stamp - time.time()) < 120
    # A replay: the same request, more than 5 minutes later, is refused; so is a changed body or another secret.
    with pytest.raises(SignatureError, match="replay"):
        verify_signature(secret, request.body, header, now=stamp + 301)
    verify_signature(secret, request.body, header, now=stamp + 299)
    with pytest.raises(SignatureError, match="does not match"):
        verify_signature(secret, request.body.replace(b"alpha", b"omega"), header)
    with pytest.raises(SignatureError, match="does not match"):
        verify_signature("whsec_other", request.body, header)
    with pytest.raises(SignatureError, match="malformed"):
        verify_signature(secret, request.body, "v1=abc")

    log = client.get(f"{HOOKS}{created['id']}/deliveries/").json()["results"]
    assert len(log) == 1 and log[0]["status"] == "succeeded" and log[0]["attempts"] == 1
    assert log[0]["response_code"] == 200 and log[0]["duration_ms"] is not None and log[0]["error"] == ""


def test_a_failing_receiver_is_retried_with_backoff_until_it_answers(admin_team, receiver, queued,
                                                                      django_capture_on_commit_callbacks):
    client = admin_team["client"]
    hook = create_hook(client, receiver.url)
    receiver.codes = [500, 500]  # then 200
    with django_capture_on_commit_callbacks(execute=True):
        delivery_id = client.post(f"{HOOKS}{hook['id']}/test/").json()["id"]
    # The retries are queued 0.5 s, then 1 s later (STRATA_NOTIFY_BACKOFF_S doubling).
    assert run_queued(queued) == [0.5, 1.0]
    requests = receiver.wait_for(3)
    assert len(requests) == 3
    assert [r.headers["Strata-Attempt"] for r in requests] == ["1", "2", "3"]
    assert {r.headers["Strata-Delivery"] for r in requests} == {str(delivery_id)}  # one delivery, three tries
    for request in requests:
        verify_signature(hook["secret"], request.body, request.headers["Strata-Signature"])
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("succeeded", 3, 200)
    assert delivery.finished_at is not None and delivery.next_attempt_at is None


def test_a_receiver_failing_every_try_ends_failed_with_its_answer(admin_team, receiver, queued,
                                                                   django_capture_on_commit_callbacks):
    hook = create_hook(admin_team["client"], receiver.url)
    receiver.codes = [503] * 10
    with django_capture_on_commit_callbacks(execute=True):
        delivery_id = admin_team["client"].post(f"{HOOKS}{hook['id']}/test/").json()["id"]
    assert run_queued(queued) == [0.5, 1.0, 2.0]  # 4 tries in all (STRATA_NOTIFY_MAX_ATTEMPTS)
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 4, 503)
    assert delivery.error == "HTTP 503: receiver error"
    assert len(receiver.received) == 4


def test_backoff_doubles_up_to_its_cap(notify_settings):
    assert [services.backoff(tries) for tries in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def attempt_in_thread(delivery_id) -> threading.Thread:
    """One try in a thread of its own, as the notifier's thread pool makes it (its own database connection)."""
    from django.db import connection

    def run():
        try:
            services.attempt(delivery_id)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)  # the try in a thread reads what the test committed
def test_a_hanging_receiver_times_out_without_delaying_another_teams_delivery(
        admin_team, receivers, queued, make_team, make_user, make_token, api, django_capture_on_commit_callbacks):
    hanging, healthy = receivers(), receivers()
    hanging.hang = 30.0  # far beyond the 1 s read timeout: only the timeout ends the try
    other = make_team("beta")
    bea = make_user("bea", other, role="team-admin")
    slow_hook = create_hook(admin_team["client"], hanging.url)
    fast_hook = create_hook(api(make_token(bea, other)), healthy.url)
    with django_capture_on_commit_callbacks(execute=True):
        slow = admin_team["client"].post(f"{HOOKS}{slow_hook['id']}/test/").json()["id"]
        fast = api(make_token(bea, other)).post(f"{HOOKS}{fast_hook['id']}/test/").json()["id"]
    queued.clear()
    # The notifier runs tries side by side, each in a thread of its own (strata notifier --pool threads).
    slow_try = attempt_in_thread(slow)
    try:
        hanging.wait_for(1)  # team alpha's receiver holds its connection, saying nothing
        assert services.attempt(fast) is None  # team beta's delivery goes through meanwhile
        assert healthy.wait_for(1)[0].json()["team"] == "beta"
        assert Delivery.objects.get(pk=fast).status == "succeeded"
        assert slow_try.is_alive() or Delivery.objects.get(pk=slow).status == "retrying"
    finally:
        slow_try.join(timeout=60)
    assert not slow_try.is_alive()
    delivery = Delivery.objects.get(pk=slow)
    assert delivery.status == "retrying" and delivery.attempts == 1 and delivery.response_code is None
    assert delivery.error == "no answer within 1 s"
    assert delivery.next_attempt_at > timezone.now()


def test_the_scheduler_never_carries_deliveries(notify_settings, monkeypatch):
    """Every try goes to the notify queue, which `strata notifier` consumes (with the tracking queue) in threads; the scheduler consumes
    only the control queue."""
    from strata.celery import app
    from strata.cli import server_commands
    from strata.notify import cli as notify_cli

    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, **options: sent.append((name, options)))
    services.send(42, countdown=2.0)
    assert sent == [("strata.notify.deliver", {"args": [42], "queue": "notify", "countdown": 2.0})]
    assert notify_cli.worker_arguments(concurrency=8)[:3] == ["worker", "-Q", "notify,tracking"]
    assert "threads" in notify_cli.worker_arguments(concurrency=8)
    assert '"-Q", "control"' in open(server_commands.__file__).read()


def test_slack_format_body(admin_team, receiver, queued, submit, make_node, run_pass,
                           django_capture_on_commit_callbacks):
    from strata.jobs.models import JobState as S
    from strata.jobs.states import transition

    hook = create_hook(admin_team["client"], receiver.url, format="slack", events=["job.failed"])
    assert hook["format"] == "slack" and hook["events"] == ["job.failed"]
    make_node("n1", gpus=1)
    job = submit(admin_team["ada"], admin_team["team"], name="resnet")
    run_pass()
    job.refresh_from_db()
    assert job.state == S.SCHEDULED
    with django_capture_on_commit_callbacks(execute=True):
        transition(job, S.SCHEDULED, S.FAILED, "exit code 3")
    run_queued(queued)
    (request,) = receiver.wait_for(1)
    body = request.json()
    assert set(body) == {"text", "blocks"}
    assert body["text"] == f"Job resnet ({str(job.pk)[:8]}) of team alpha failed: exit code 3"
    assert body["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": body["text"]}}
    assert body["blocks"][1]["type"] == "context" and "job.failed" in body["blocks"][1]["elements"][0]["text"]
    verify_signature(hook["secret"], request.body, request.headers["Strata-Signature"])
    assert Delivery.objects.get().status == "succeeded"


def test_job_ends_reach_only_the_subscribed_hooks_of_the_jobs_team(admin_team, receivers, queued, submit,
                                                                   make_team, make_user, make_node, run_pass,
                                                                   django_capture_on_commit_callbacks):
    from strata.jobs.models import JobState as S
    from strata.jobs.states import transition

    ours, theirs = receivers(), receivers()
    succeeded = create_hook(admin_team["client"], ours.url, events=["job.succeeded"])
    create_hook(admin_team["client"], ours.url, events=["job.failed"])
    other = make_team("beta")
    Webhook.objects.create(team=other, url=theirs.url, events=["job.succeeded"], secret_ciphertext="x")
    make_node("n1", gpus=1)
    job = submit(admin_team["ada"], admin_team["team"], name="digits")
    run_pass()
    with django_capture_on_commit_callbacks(execute=True):
        transition(job, S.SCHEDULED, S.RUNNING, "started")
        transition(job, S.RUNNING, S.SUCCEEDED, "done")
    assert len(queued) == 1  # one hook subscribes to job.succeeded in the job's team; RUNNING makes nothing
    run_queued(queued)
    (request,) = ours.wait_for(1)
    body = request.json()
    assert body["event"] == "job.succeeded" and body["data"]["job"]["id"] == str(job.pk)
    assert body["data"]["job"]["name"] == "digits" and body["data"]["job"]["previous_state"] == "RUNNING"
    assert body["data"]["job"]["url"].endswith(f"/jobs/{job.pk}/")
    verify_signature(succeeded["secret"], request.body, request.headers["Strata-Signature"])
    assert theirs.received == []


def test_quota_reached_is_mailed_once_through_the_mail_backend(admin_team, queued, submit, make_node, run_pass,
                                                               django_capture_on_commit_callbacks):
    from strata.quotas.models import Quota

    client = admin_team["client"]
    answer = client.post("/api/v1/email-subscriptions/", {"address": "ops@example.org",
                                                           "events": ["quota.reached"]}, format="json")
    assert answer.status_code == 201, answer.content
    Quota.objects.filter(team=admin_team["team"]).update(max_concurrent_jobs=1)
    make_node("n1", gpus=4)
    with django_capture_on_commit_callbacks(execute=True):
        first = submit(admin_team["ada"], admin_team["team"], name="one")
        second = submit(admin_team["ada"], admin_team["team"], name="two")
        run_pass()
    second.refresh_from_db()
    assert second.state == "PENDING" and "max_concurrent_jobs" in second.reason
    assert len(queued) == 1
    run_queued(queued)
    (message,) = mail.outbox
    assert message.to == ["ops@example.org"]
    assert message.subject.startswith("[strata] Team alpha reached its quota (max_concurrent_jobs)")
    assert str(second.pk) in message.body and str(first.pk) not in message.body
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.event) == ("succeeded", 1, "quota.reached")
    # The next passes find the job still waiting on the same limit: no new notification.
    with django_capture_on_commit_callbacks(execute=True):
        run_pass()
        run_pass()
    assert queued == [] and Delivery.objects.count() == 1


def test_a_lost_node_is_told_to_the_teams_whose_jobs_ran_there(admin_team, receivers, queued, submit, make_node,
                                                               make_team, make_user, run_pass,
                                                               django_capture_on_commit_callbacks):
    from strata.cluster.models import Node
    from strata.scheduling.services import reap

    ours, theirs, idle = receivers(), receivers(), receivers()
    create_hook(admin_team["client"], ours.url, events=["node.lost"])
    beta, gamma = make_team("beta"), make_team("gamma")
    Webhook.objects.create(team=beta, url=theirs.url, events=["node.lost"], secret_ciphertext="x")
    Webhook.objects.create(team=gamma, url=idle.url, events=["node.lost"], secret_ciphertext="x")
    node = make_node("gpu-7", gpus=2)
    job = submit(admin_team["ada"], admin_team["team"])
    other = submit(make_user("bert", beta), beta)
    run_pass()
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert reap()["lost_nodes"] == 1
    assert len(queued) == 2  # alpha and beta ran jobs there; gamma did not
    run_queued(queued)
    (request,) = ours.wait_for(1)
    body = request.json()
    assert body["event"] == "node.lost" and body["data"]["node"]["name"] == "gpu-7"
    # Each team hears of its own jobs only: the node ran beta's too.
    assert body["data"]["node"]["reason"] == "node lease expired" and body["data"]["jobs"] == [str(job.pk)]
    assert str(other.pk) not in request.body.decode()
    assert Delivery.objects.get(team=beta).payload["data"]["jobs"] == [str(other.pk)]
    assert idle.received == []


def test_email_test_button_and_a_disabled_hook(admin_team, receiver, queued, django_capture_on_commit_callbacks):
    client = admin_team["client"]
    entry = client.post("/api/v1/email-subscriptions/", {"address": "me@example.org"}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/api/v1/email-subscriptions/{entry['id']}/test/").status_code == 202
    run_queued(queued)
    assert [m.subject for m in mail.outbox] == ["[strata] Test notification from Strata for team alpha"]
    # A disabled hook gets no event, but its test button still works.
    hook = create_hook(client, receiver.url, enabled=False)
    services.notify(services.Notification("job.failed", (admin_team["team"].pk,), {}))
    assert Delivery.objects.filter(webhook_id=hook["id"]).count() == 0
    answer = client.patch(f"{HOOKS}{hook['id']}/", {"enabled": True, "events": ["job.failed"]}, format="json")
    assert answer.status_code == 200 and answer.json()["enabled"] is True
    assert Webhook.objects.get(pk=hook["id"]).events == ["job.failed"]


def test_the_api_is_for_team_admins_and_names_every_bad_field(admin_team, receiver, make_team, make_user,
                                                               make_token, api):
    client, member = admin_team["client"], admin_team["member_client"]
    bad = client.post(HOOKS, {"url": "ftp://x", "format": "xml", "events": ["job.exploded"], "colour": 1},
                      format="json")
    assert bad.status_code == 400
    assert set(bad.json()) == {"url", "format", "events", "colour"}
    refused = member.post(HOOKS, {"url": receiver.url}, format="json")
    assert refused.status_code == 403 and "team-admin" in refused.json()["detail"]
    hook = create_hook(client, receiver.url)
    assert member.get(f"{HOOKS}{hook['id']}/").status_code == 403
    assert member.delete(f"{HOOKS}{hook['id']}/").status_code == 403
    assert member.get(HOOKS).json()["results"] == []
    outsider_team = make_team("beta")
    outsider = api(make_token(make_user("olaf", outsider_team, role="team-admin"), outsider_team))
    for answer in (outsider.get(f"{HOOKS}{hook['id']}/"), outsider.post(f"{HOOKS}{hook['id']}/test/"),
                   outsider.get(f"{HOOKS}{hook['id']}/deliveries/"), outsider.delete(f"{HOOKS}{hook['id']}/")):
        assert answer.status_code == 404
    assert client.delete(f"{HOOKS}{hook['id']}/").status_code == 204
    assert not Webhook.objects.exists()


def test_private_addresses_are_refused_unless_allowed(admin_team, settings):
    settings.STRATA_WEBHOOK_ALLOW_PRIVATE = False
    for url in ("http://127.0.0.1:9/hook", "http://localhost/x", "http://169.254.169.254/latest", "http://[::1]/"):
        answer = admin_team["client"].post(HOOKS, {"url": url}, format="json")
        assert answer.status_code == 400 and "not a public address" in answer.json()["url"][0], url
    assert services.address_problem("http://127.0.0.1:9/hook").startswith("host 127.0.0.1 resolves to 127.0.0.1")


def test_webhook_changes_are_audited(admin_team, receiver):
    from strata.audit.models import AuditEntry

    hook = create_hook(admin_team["client"], receiver.url)
    assert admin_team["client"].delete(f"{HOOKS}{hook['id']}/").status_code == 204
    entries = list(AuditEntry.objects.filter(action__startswith="webhook.").order_by("id"))
    assert [entry.action for entry in entries] == ["webhook.create", "webhook.delete"]
    assert all(entry.target == f"webhook {hook['id']}" and entry.team_slug == "alpha" for entry in entries)
    assert hook["secret"] not in str([entry.after for entry in entries] + [entry.before for entry in entries])


def test_an_email_subscription_is_one_per_address(admin_team):
    client = admin_team["client"]
    assert client.post("/api/v1/email-subscriptions/", {"address": "a@example.org"}, format="json").status_code == 201
    again = client.post("/api/v1/email-subscriptions/", {"address": "a@example.org"}, format="json")
    assert again.status_code == 400 and "subscribed already" in again.json()["address"][0]
    bad = client.post("/api/v1/email-subscriptions/", {"address": "nope", "events": []}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"address", "events"}
    assert EmailSubscription.objects.count() == 1


def test_core_subscribers_hear_only_the_events_they_name(db):
    """strata.jobs.events: the notify app is a core subscriber of its three events (no plugin posing); an event
    no one subscribes to makes no work, and plugins still hear every event."""
    from components.runtime.contract.events import MetricsReported, NodeLost
    from strata.jobs import events

    assert services.on_event in events.subscribers("job.transitioned")
    assert services.on_event in events.subscribers("node.lost")
    assert events.subscribers("metrics.reported") == []
    heard = []
    events.subscribe(heard.append, ["quota.reached"])
    try:
        events.deliver(NodeLost(node_id="1", node="n", reason="r"))  # no team: nothing to notify
        events.deliver(MetricsReported(job_id="j", attempt_id="a", kind="train"))
        assert heard == []
        events.subscribe(heard.append, ["quota.reached"])  # again: still once
        from components.runtime.contract.events import QuotaReached

        event = QuotaReached(team_id=1, limit="max_gpus", reason="team at max_gpus (1 held + 1 requested > 1)")
        events.deliver(event)
        assert heard == [event]
    finally:
        events.unsubscribe(heard.append)
    assert heard.append not in [subscriber for subscriber in events.subscribers()]


def test_a_delivery_whose_message_was_lost_is_queued_again_once(admin_team, receiver, queued):
    from strata.celery import app
    from strata.notify import tasks

    hook = Webhook.objects.create(team=admin_team["team"], url=receiver.url, events=["job.failed"],
                                  secret_ciphertext="x")
    now = timezone.now()
    lost = Delivery.objects.create(team=admin_team["team"], webhook=hook, event="job.failed",
                                   next_attempt_at=now - timedelta(minutes=6))
    Delivery.objects.create(team=admin_team["team"], webhook=hook, event="job.failed", status="retrying",
                            next_attempt_at=now - timedelta(minutes=1))  # due a minute ago: its message may come
    Delivery.objects.create(team=admin_team["team"], webhook=hook, event="job.failed", status="succeeded",
                            next_attempt_at=now - timedelta(hours=1))
    assert services.sweep(now) == 1 and queued == [(lost.pk, 0.0)]
    assert services.sweep(now) == 0  # claimed: another beat's sweep queues it no second time
    app.loader.import_default_modules()
    entry = app.conf.beat_schedule["notify-sweep"]
    assert entry["task"] == tasks.sweep_task.name and entry["options"]["queue"] == "notify"
