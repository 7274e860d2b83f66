"""A team's notification targets (webhooks, e-mail subscriptions) and the log of every delivery to them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from strata.accounts.models import Team
from strata.notify.names import EVENTS, TEST_EVENT

__all__ = ["EVENTS", "TEST_EVENT", "Delivery", "EmailSubscription", "Webhook"]


class Webhook(models.Model):
    """An HTTPS (or HTTP) endpoint told about the team's events, each body signed with the webhook's secret
    (``Strata-Signature``; strata/notify/signing.py). The secret is shown once, at creation; the database holds
    its Fernet ciphertext (``strata.accounts.team_secrets.encrypt``)."""

    class Format(models.TextChoices):
        JSON = "json"  # the event as JSON (docs/architecture.md, Notifications)
        SLACK = "slack"  # a Slack incoming-webhook message: {"text": ..., "blocks": [...]}

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    format = models.CharField(max_length=8, choices=Format.choices, default=Format.JSON)
    events = models.JSONField(default=list)  # names from EVENTS
    secret_ciphertext = models.TextField()
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team_id", "id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of team {self.team_id}"


class EmailSubscription(models.Model):
    """An address told about the team's events by e-mail (Django's mail backend: EMAIL_* settings)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="email_subscriptions")
    address = models.EmailField(max_length=254)
    events = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team_id", "address"]
        constraints = [models.UniqueConstraint(fields=["team", "address"], name="one_email_subscription_per_team")]

    def __str__(self) -> str:
        return f"e-mail {self.address} of team {self.team_id}"


class Delivery(models.Model):
    """One event sent (or being sent) to one target: what was sent, how each try went, the last answer."""

    class Status(models.TextChoices):
        PENDING = "pending"  # queued, not tried yet
        RETRYING = "retrying"  # a try failed; the next one is due at next_attempt_at
        SUCCEEDED = "succeeded"  # a 2xx answer (an e-mail: handed to the mail backend)
        FAILED = "failed"  # every try failed, or the target was disabled or deleted meanwhile

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    webhook = models.ForeignKey(Webhook, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries")
    email = models.ForeignKey(EmailSubscription, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="deliveries")
    event = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    duration_ms = models.FloatField(null=True, blank=True)  # of the last try
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["webhook", "-created_at"], name="notify_delivery_webhook_recent"),
                   models.Index(fields=["email", "-created_at"], name="notify_delivery_email_recent")]

    def __str__(self) -> str:
        return f"delivery {self.pk} ({self.event}, {self.status})"
