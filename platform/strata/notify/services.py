"""Notifications: which lifecycle events a team hears of, the targets (webhooks, e-mail), and delivering them.

The lifecycle events (``components.runtime.contract.events``) reach :func:`on_event` after their transaction
committed (``strata.jobs.events``, a core subscriber registered by ``NotifyConfig.ready``). It stays quick: it
writes one :class:`Delivery` row per enabled target that subscribes to the notification and sends one Celery
message per row to the ``notify`` queue (after commit). ``strata notifier`` (a worker of that queue only, in
threads) makes each try (:func:`attempt`): a webhook is POSTed, signed (strata/notify/signing.py), with a short
connect and read timeout; an e-mail goes through Django's mail backend. A failed try is retried after
``STRATA_NOTIFY_BACKOFF_S``, doubling up to ``STRATA_NOTIFY_BACKOFF_MAX_S``, ``STRATA_NOTIFY_MAX_ATTEMPTS`` tries
in all. A receiver that hangs or errors costs only its own deliveries: the scheduler's ``control`` queue never
carries them, and each try holds one of the notifier's threads for at most the timeouts.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets as random_secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.validators import EmailValidator, ValidationError
from django.db import transaction
from django.utils import timezone

from components.runtime.contract.events import Event, JobTransitioned, NodeLost, QuotaReached
from strata.accounts import team_secrets
from strata.accounts.models import Team
from strata.notify import signing
from strata.notify.models import EVENTS, TEST_EVENT, Delivery, EmailSubscription, Webhook

log = logging.getLogger(__name__)

DELIVER_TASK = "strata.notify.deliver"  # strata.notify.tasks registers it
SWEEP_TASK = "strata.notify.sweep"  # likewise: the beat's, every SWEEP_INTERVAL_S on the notify queue
SWEEP_INTERVAL_S = 60.0
SWEEP_GRACE_S = 300.0  # a try this long overdue lost its message (a broker outage, a worker killed mid-try)
QUEUE = "notify"
SUBSCRIBED_EVENTS = (JobTransitioned.name, QuotaReached.name, NodeLost.name)  # the lifecycle events heard
JOB_ENDS = {"SUCCEEDED": "job.succeeded", "FAILED": "job.failed", "PREEMPTED": "job.preempted"}
MAX_WEBHOOKS_PER_TEAM = 20
MAX_EMAILS_PER_TEAM = 50
MAX_ANSWER_BYTES = 4096  # what is read (and kept, in the error) of a receiver's answer
USER_AGENT = "strata-webhooks/1"
TEAM_JOBS = "_jobs_by_team"  # a notification's jobs by team, cut down to each target's own team in its payload


class NotifyRejected(ValueError):
    """A target cannot be stored as asked: ``errors`` names each bad field (a 400)."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))


# -- notifications: what a lifecycle event tells which teams ----------------------------------------------------
@dataclass(frozen=True)
class Notification:
    name: str  # one of EVENTS (or TEST_EVENT)
    team_ids: tuple[int, ...]
    data: dict[str, Any]


def notification_of(event: Event) -> Notification | None:
    """The notification a lifecycle event makes, or None (most transitions make none)."""
    if isinstance(event, JobTransitioned):
        name = JOB_ENDS.get(event.target)
        if name is None or event.team_id is None:
            return None
        from strata.jobs.models import Job

        row = Job.objects.filter(pk=event.job_id).values("name", "owner__username").first() or {}
        return Notification(name, (event.team_id,), {
            "job": {"id": event.job_id, "name": row.get("name", ""), "kind": event.kind, "owner":
                    row.get("owner__username", ""), "state": event.target, "previous_state": event.source,
                    "reason": event.reason, "url": _url(f"/jobs/{event.job_id}/")}})
    if isinstance(event, QuotaReached):
        return Notification("quota.reached", (event.team_id,), {
            "quota": {"limit": event.limit, "reason": event.reason, "waiting_jobs": list(event.job_ids)}})
    if isinstance(event, NodeLost):
        from strata.jobs.models import Job

        by_team: dict[int, list[str]] = {}
        for job_id, team_id in Job.objects.filter(pk__in=list(event.job_ids)).values_list("pk", "team_id"):
            by_team.setdefault(team_id, []).append(str(job_id))
        return Notification("node.lost", tuple(event.team_ids), {
            "node": {"id": event.node_id, "name": event.node, "reason": event.reason},
            TEAM_JOBS: {team: sorted(jobs) for team, jobs in by_team.items()}})
    return None


def _url(path: str) -> str:
    return str(settings.STRATA_PUBLIC_URL).rstrip("/") + path


def _subject(event: Event) -> tuple[str, tuple[int, ...]] | None:
    """(notification name, team ids) of an event, cheaply (no query); None when it makes no notification."""
    if isinstance(event, JobTransitioned):
        name = JOB_ENDS.get(event.target)
        return (name, (event.team_id,)) if name is not None and event.team_id is not None else None
    if isinstance(event, QuotaReached):
        return "quota.reached", (event.team_id,)
    if isinstance(event, NodeLost):
        return ("node.lost", tuple(event.team_ids)) if event.team_ids else None
    return None


def targets(name: str, team_ids) -> list[Webhook | EmailSubscription]:
    """The enabled targets of the teams that subscribe to notification ``name``."""
    hooks = [hook for hook in Webhook.objects.filter(team_id__in=team_ids, enabled=True) if name in (hook.events or [])]
    emails = [entry for entry in EmailSubscription.objects.filter(team_id__in=team_ids, enabled=True)
              if name in (entry.events or [])]
    return [*hooks, *emails]


def on_event(event: Event) -> None:
    """The core subscriber: queue a delivery to every enabled target of the teams the event concerns that
    subscribes to it (two queries for an event no target wants). Never raises into the caller's transition
    (``strata.jobs.events`` logs a failure)."""
    subject = _subject(event)
    if subject is None or not targets(*subject):
        return
    notification = notification_of(event)
    if notification is not None:
        notify(notification)


def notify(notification: Notification) -> list[Delivery]:
    """Write one pending delivery per subscribed target and send each to the notify queue after commit."""
    chosen = targets(notification.name, notification.team_ids)
    if not chosen:
        return []
    slugs = dict(Team.objects.filter(pk__in=notification.team_ids).values_list("pk", "slug"))
    now = timezone.now()
    rows = [Delivery.objects.create(
        team_id=target.team_id, webhook=target if isinstance(target, Webhook) else None,
        email=target if isinstance(target, EmailSubscription) else None, event=notification.name,
        payload=_payload(notification, target.team_id, slugs.get(target.team_id, ""), now), created_at=now,
        updated_at=now, next_attempt_at=now) for target in chosen]
    ids = [row.pk for row in rows]
    transaction.on_commit(lambda: [send(delivery_id) for delivery_id in ids])
    return rows


def _payload(notification: Notification, team_id: int, team: str, now) -> dict:
    """What one target's deliveries send: a team sees only its own jobs (a lost node ran other teams' too)."""
    data = dict(notification.data)
    if TEAM_JOBS in data:
        data["jobs"] = data.pop(TEAM_JOBS).get(team_id, [])
    return {"event": notification.name, "created_at": now.isoformat(), "team": team, "data": data}


def send(delivery_id: int, countdown: float = 0.0) -> None:
    """Send one try of a delivery to the notify queue (by task name), ``countdown`` seconds from now. A message
    that cannot be sent is logged; the delivery stays pending (shown in its log)."""
    from strata.celery import app

    try:
        app.send_task(DELIVER_TASK, args=[delivery_id], queue=QUEUE, countdown=countdown or None)
    except Exception:  # noqa: BLE001 - a broker outage must not break the transition that caused the event
        log.exception("could not queue notification delivery %s", delivery_id)
        Delivery.objects.filter(pk=delivery_id).update(error="could not reach the broker to queue it",
                                                        updated_at=timezone.now())


def sweep(now=None, limit: int = 500) -> int:
    """Queue again the deliveries whose try is more than SWEEP_GRACE_S overdue: their message was lost (the
    broker was unreachable when it was sent, or a worker died during the try). Each row is claimed by a
    conditional UPDATE of its due time, so beats of several scheduler replicas queue it once. Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=SWEEP_GRACE_S)
    stale = list(Delivery.objects.filter(status__in=[Delivery.Status.PENDING, Delivery.Status.RETRYING],
                                         next_attempt_at__lt=cutoff)
                 .order_by("next_attempt_at").values_list("pk", "next_attempt_at")[:limit])
    queued = 0
    for pk, due in stale:
        if Delivery.objects.filter(pk=pk, next_attempt_at=due).update(next_attempt_at=now, updated_at=now):
            send(pk)
            queued += 1
    if queued:
        log.warning("queued %d notification deliveries again: their messages were lost", queued)
    return queued


# -- the message ------------------------------------------------------------------------------------------------
def summary(payload: dict) -> str:
    """One line saying what happened, for Slack and e-mail."""
    event, data, team = payload.get("event", ""), payload.get("data") or {}, payload.get("team", "")
    if event.startswith("job."):
        job = data.get("job") or {}
        what = {"job.succeeded": "succeeded", "job.failed": "failed", "job.preempted": "was preempted"}[event]
        reason = f": {job.get('reason')}" if job.get("reason") and event != "job.succeeded" else ""
        return f"Job {job.get('name') or job.get('id', '')} ({str(job.get('id', ''))[:8]}) of team {team} {what}{reason}"
    if event == "quota.reached":
        quota = data.get("quota") or {}
        count = len(quota.get("waiting_jobs") or [])
        return (f"Team {team} reached its quota ({quota.get('limit')}): {count} job{'s' if count != 1 else ''} "
                f"waiting: {quota.get('reason')}")
    if event == "node.lost":
        node = data.get("node") or {}
        count = len(data.get("jobs") or [])
        return (f"Node {node.get('name')} was lost ({node.get('reason')}): {count} job{'s' if count != 1 else ''} "
                f"of team {team} ran there and were requeued or ended")
    if event == TEST_EVENT:
        return f"Test notification from Strata for team {team}"
    return f"{event} for team {team}"


def body_of(delivery: Delivery, format: str) -> bytes:
    """The request body of a webhook delivery: the event as JSON, or a Slack message."""
    payload = delivery.payload or {}
    if format == Webhook.Format.SLACK:
        text = summary(payload)
        message = {"text": text, "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text":
                                              f"team {payload.get('team')} · {payload.get('event')} · "
                                              f"delivery {delivery.pk}"}]}]}
        return json.dumps(message, separators=(",", ":")).encode()
    return json.dumps({"id": str(delivery.pk), **payload}, separators=(",", ":"), sort_keys=True).encode()


# -- one try -------------------------------------------------------------------------------------------------------
def backoff(tries: int) -> float:
    """Seconds before the next try after ``tries`` failed ones: STRATA_NOTIFY_BACKOFF_S doubling, capped."""
    return min(float(settings.STRATA_NOTIFY_BACKOFF_S) * 2 ** max(tries - 1, 0),
               float(settings.STRATA_NOTIFY_BACKOFF_MAX_S))


@dataclass
class Outcome:
    ok: bool
    code: int | None = None
    error: str = ""


def attempt(delivery_id: int) -> float | None:
    """Make one try of a delivery and log it; returns the seconds to wait before the next try, or None when the
    delivery is done (succeeded, out of tries, or its target is gone or disabled)."""
    delivery = Delivery.objects.select_related("webhook", "email").filter(pk=delivery_id).first()
    if delivery is None or delivery.status in (Delivery.Status.SUCCEEDED, Delivery.Status.FAILED):
        return None
    target = delivery.webhook or delivery.email
    started = time.monotonic()
    if target is None or (not target.enabled and delivery.event != TEST_EVENT):
        outcome = Outcome(False, None, "the target was deleted or disabled")
        final = True
    else:
        try:
            outcome = _post(delivery) if delivery.webhook is not None else _mail(delivery)
        except Exception as error:  # noqa: BLE001 - any failure of one try is logged on the delivery
            outcome = Outcome(False, None, f"{type(error).__name__}: {error}")
        final = False
    duration = (time.monotonic() - started) * 1000.0
    tries = delivery.attempts + 1
    now = timezone.now()
    if outcome.ok:
        status, delay = Delivery.Status.SUCCEEDED, None
    elif final or tries >= int(settings.STRATA_NOTIFY_MAX_ATTEMPTS):
        status, delay = Delivery.Status.FAILED, None
    else:
        status, delay = Delivery.Status.RETRYING, backoff(tries)
    Delivery.objects.filter(pk=delivery.pk).update(
        status=status, attempts=tries, response_code=outcome.code, error=outcome.error[:2000],
        duration_ms=round(duration, 1), updated_at=now,
        next_attempt_at=now + timedelta(seconds=delay) if delay is not None else None,
        finished_at=now if delay is None else None)
    if not outcome.ok:
        log.info("notification delivery %s (%s) try %d failed: %s", delivery.pk, delivery.event, tries,
                 outcome.error or outcome.code)
    return delay


def _post(delivery: Delivery) -> Outcome:
    import requests

    hook = delivery.webhook
    assert hook is not None
    if problem := address_problem(hook.url):
        return Outcome(False, None, problem)
    body = body_of(delivery, hook.format)
    secret = team_secrets.decrypt(hook.secret_ciphertext)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               signing.HEADER: signing.sign(secret, body), "Strata-Event": delivery.event,
               "Strata-Delivery": str(delivery.pk), "Strata-Attempt": str(delivery.attempts + 1)}
    connect, read = float(settings.STRATA_NOTIFY_CONNECT_TIMEOUT_S), float(settings.STRATA_NOTIFY_READ_TIMEOUT_S)
    deadline = time.monotonic() + connect + read
    try:
        with requests.post(hook.url, data=body, headers=headers, timeout=(connect, read), stream=True,
                           allow_redirects=False) as answer:
            text = b""
            for chunk in answer.iter_content(1024):  # a receiver trickling its answer is cut at the deadline
                text += chunk
                if len(text) >= MAX_ANSWER_BYTES or time.monotonic() > deadline:
                    break
            if 200 <= answer.status_code < 300:
                return Outcome(True, answer.status_code)
            detail = text[:300].decode("utf-8", "replace").strip()
            return Outcome(False, answer.status_code, f"HTTP {answer.status_code}{': ' + detail if detail else ''}")
    except requests.exceptions.ConnectTimeout:
        return Outcome(False, None, f"no connection within {connect:g} s")
    except requests.exceptions.ReadTimeout:
        return Outcome(False, None, f"no answer within {read:g} s")
    except requests.exceptions.RequestException as error:
        return Outcome(False, None, f"{type(error).__name__}: {error}"[:500])


def _mail(delivery: Delivery) -> Outcome:
    from django.core.mail import send_mail

    entry = delivery.email
    assert entry is not None
    payload = delivery.payload or {}
    line = summary(payload)
    text = f"{line}\n\n{json.dumps({'id': str(delivery.pk), **payload}, indent=2, sort_keys=True)}\n"
    sent = send_mail(f"[strata] {line}"[:200], text, settings.DEFAULT_FROM_EMAIL, [entry.address],
                     fail_silently=False)
    return Outcome(bool(sent), None, "" if sent else "the mail backend sent nothing")


def address_problem(url: str) -> str | None:
    """Why a delivery to ``url`` is refused: its host resolves to a loopback, private, link-local or otherwise
    non-public address (unless STRATA_WEBHOOK_ALLOW_PRIVATE), or does not resolve; None when it may go."""
    if settings.STRATA_WEBHOOK_ALLOW_PRIVATE:
        return None
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
                                   proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as error:
        return f"host {parts.hostname} does not resolve: {error}"
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not address.is_global:
            return (f"host {parts.hostname} resolves to {address}, not a public address "
                    "(STRATA_WEBHOOK_ALLOW_PRIVATE allows it)")
    return None


# -- targets -----------------------------------------------------------------------------------------------------
def clean_events(value: Any, errors: dict[str, str]) -> list[str]:
    if value is None:
        return list(EVENTS)
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        errors["events"] = f"a list of event names: {', '.join(EVENTS)}"
        return []
    unknown = [item for item in value if item not in EVENTS]
    if unknown:
        errors["events"] = f"unknown event {', '.join(unknown)}: one of {', '.join(EVENTS)}"
    elif not value:
        errors["events"] = f"at least one of {', '.join(EVENTS)}"
    return list(dict.fromkeys(value))


def url_problem(url: Any) -> str | None:
    if not isinstance(url, str) or not url.strip():
        return "required: the URL events are POSTed to"
    if len(url) > 2000:
        return "at most 2000 characters"
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if parts.username or parts.password:
        return "no user or password in the URL (the body is signed instead)"
    if not settings.STRATA_WEBHOOK_ALLOW_PRIVATE:
        literal = parts.hostname
        try:
            address = ipaddress.ip_address(literal)
        except ValueError:
            address = None
        if literal == "localhost" or (address is not None and not address.is_global):
            return f"{literal} is not a public address (STRATA_WEBHOOK_ALLOW_PRIVATE allows it)"
    return None


def new_secret() -> str:
    return "whsec_" + random_secrets.token_urlsafe(32)


def webhook_create(team: Team, *, url: Any, format: Any = "json", events: Any = None, enabled: Any = True,
                   user=None) -> tuple[Webhook, str]:
    """Create a webhook; returns it and its secret (shown this once). :class:`NotifyRejected` names each bad
    field."""
    errors: dict[str, str] = {}
    if problem := url_problem(url):
        errors["url"] = problem
    if format not in Webhook.Format.values:
        errors["format"] = f"one of {', '.join(Webhook.Format.values)}"
    chosen = clean_events(events, errors)
    if not isinstance(enabled, bool):
        errors["enabled"] = "true or false"
    if Webhook.objects.filter(team=team).count() >= MAX_WEBHOOKS_PER_TEAM:
        errors.setdefault("url", f"team {team.slug} has {MAX_WEBHOOKS_PER_TEAM} webhooks already (the most)")
    if errors:
        raise NotifyRejected(errors)
    secret = new_secret()
    hook = Webhook.objects.create(team=team, url=str(url).strip(), format=format, events=chosen,
                                  secret_ciphertext=team_secrets.encrypt(secret), enabled=enabled,
                                  created_by=user if user is not None and user.is_authenticated else None)
    return hook, secret


def email_create(team: Team, *, address: Any, events: Any = None, user=None) -> EmailSubscription:
    errors: dict[str, str] = {}
    if not isinstance(address, str) or not address.strip():
        errors["address"] = "required: an e-mail address"
    else:
        try:
            EmailValidator()(address.strip())
        except ValidationError:
            errors["address"] = "not a valid e-mail address"
    chosen = clean_events(events, errors)
    if "address" not in errors and EmailSubscription.objects.filter(team=team, address=str(address).strip()).exists():
        errors["address"] = f"{address} is subscribed already"
    if EmailSubscription.objects.filter(team=team).count() >= MAX_EMAILS_PER_TEAM:
        errors.setdefault("address", f"team {team.slug} has {MAX_EMAILS_PER_TEAM} e-mail subscriptions (the most)")
    if errors:
        raise NotifyRejected(errors)
    return EmailSubscription.objects.create(team=team, address=str(address).strip(), events=chosen,
                                            created_by=user if user is not None and user.is_authenticated else None)


def send_test(target: Webhook | EmailSubscription) -> Delivery:
    """Queue a ``webhook.test`` delivery to one target (enabled or not), whatever it subscribes to."""
    now = timezone.now()
    slug = Team.objects.filter(pk=target.team_id).values_list("slug", flat=True).first() or ""
    notification = Notification(TEST_EVENT, (target.team_id,), {"message": "a test notification",
                                                                "target": str(target.pk)})
    delivery = Delivery.objects.create(team_id=target.team_id, webhook=target if isinstance(target, Webhook) else None,
                                       email=target if isinstance(target, EmailSubscription) else None,
                                       event=TEST_EVENT, payload=_payload(notification, target.team_id, slug, now),
                                       created_at=now,
                                       updated_at=now, next_attempt_at=now)
    transaction.on_commit(lambda: send(delivery.pk))
    return delivery


def audit(action: str, *, request=None, team=None, target: str = "", before=None, after=None) -> None:
    """Record a webhook change in the audit log (strata.audit); call it inside the change's transaction."""
    from strata.audit.services import record

    record(action, request=request, team=team, target=target, before=before, after=after)
