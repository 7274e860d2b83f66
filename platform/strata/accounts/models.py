"""Users, teams, memberships and API tokens."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from components.runtime.shared.tokens import new_api_token, token_digest  # noqa: F401 -- token_digest re-exported


class Team(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user's place in a team: a role (strata.accounts.roles) and, optionally, the user's own limits inside the
    team's quota (null: only the team's quota limits them; admission in strata.quotas.services)."""

    class Role(models.TextChoices):
        VIEWER = "viewer"  # reads the team's jobs and data
        MEMBER = "member"  # also submits, and manages their own jobs, tokens, code and data
        TEAM_ADMIN = "team-admin"  # also every job of the team, its tokens, secrets, members and their limits

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    max_concurrent_jobs = models.PositiveIntegerField(
        null=True, blank=True, help_text="The user's admitted (queued or running) jobs in this team at once.")
    max_gpus = models.FloatField(null=True, blank=True,
                                 help_text="GPUs the user's jobs in this team hold at once (fractional).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 digest is stored; the raw value is shown once at creation."""

    class Kind(models.TextChoices):
        USER = "user"  # acts as its user, scoped to one team
        NODE = "node"  # lets a node agent register, heartbeat and report attempts

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.USER)
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens")
    # The token that created this one through the API (null: created from a browser session or the CLI's
    # --local). A child never outlives its parent and is revoked with it.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.kind} token {self.prefix}… ({self.name or self.user})"

    @staticmethod
    def generate() -> tuple[str, str]:
        return new_api_token()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


class LoginThrottle(models.Model):
    """Failed-password counters for one key of the login guard (``strata.accounts.login_guard``).

    A row is one of three scopes: a user name from one client address, a client address (any user name),
    or a user name (any address). User names are stored only as a keyed digest (``user_key``), so a password
    typed into the user name box is never kept; ``username`` is filled for display only when it names an
    existing account.
    """

    class Scope(models.TextChoices):
        USER_ADDRESS = "user+address", "user name from one address"
        ADDRESS = "address", "address (any user name)"
        USER = "user", "user name (any address)"

    scope = models.CharField(max_length=16, choices=Scope.choices)
    user_key = models.CharField(max_length=64, blank=True)  # HMAC-SHA256 of the normalized user name
    address = models.CharField(max_length=64, blank=True)  # an IPv4 address or an IPv6 /64
    username = models.CharField(max_length=150, blank=True)  # display only: set when it is an account's
    failures = models.PositiveIntegerField(default=0)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    # user+address rows: the last successful login from there (a known address skips the per-user gate).
    last_success_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "user_key", "address"], name="one_login_throttle_per_key")
        ]

    def __str__(self) -> str:
        who = " from ".join(part for part in (self.username or (self.user_key[:8] if self.user_key else ""),
                                              self.address) if part)
        return f"{self.scope} {who}: {self.failures} failures"


class Secret(models.Model):
    """A team's secret: a named value its jobs ask for (``spec.environment.secrets``) and get as an environment
    variable. Only the Fernet ciphertext is stored (``strata.accounts.team_secrets``); no answer ever carries the
    value, which goes only to the node that runs an attempt of the team's job that asks for it."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=64)
    ciphertext = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    # Who set the current value (the creator, or whoever replaced it last).
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_secret_name_per_team")]

    def __str__(self) -> str:
        return f"secret {self.name} of {self.team_id}"
