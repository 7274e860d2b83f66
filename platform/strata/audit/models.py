"""The audit log: one append-only row per security- or money-relevant action (docs/architecture.md, *Audit log*).

Rows are written by :func:`strata.audit.services.record` only, in the transaction of the action they record.
Nothing in the application edits or deletes one: ``save()`` refuses an existing row, the model's and the
queryset's ``delete()`` and ``update()`` refuse, the Django admin is read-only, and the database itself rejects
an UPDATE or DELETE with a trigger (migration 0001). The two exceptions:

* the retention collector (:func:`strata.audit.retention.audit_prune`) deletes rows older than
  ``STRATA_AUDIT_RETENTION_DAYS``; on PostgreSQL it sets ``strata.audit_retention`` for its own transaction
  (``set_config(..., true)``), the only way past the DELETE trigger. (SQLite has no session variables: there the
  trigger guards UPDATE only, since Django's test flush deletes every table's rows with DELETE; TRUNCATE, which
  the PostgreSQL flush uses, is not guarded either.)
* deleting a user or a team sets ``actor``/``team`` to NULL (``on_delete=SET_NULL``; the trigger allows exactly
  that change): ``actor_name`` and ``team_slug`` keep who and which team it was.
"""

from __future__ import annotations

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone


class AuditImmutable(Exception):
    """An attempt to change or delete an audit entry outside the retention collector."""


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AuditImmutable("audit entries are append-only: they cannot be updated")

    def delete(self):
        raise AuditImmutable("audit entries are append-only: only the retention collector deletes them")

    def _retention_delete(self) -> int:
        """The retention collector's delete (strata.audit.retention, inside its gate): the plain queryset's."""
        deleted, _ = super().delete()
        return deleted


class AuditEntry(models.Model):
    time = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    actor_name = models.CharField(max_length=150, blank=True)  # kept when the user is deleted
    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    team_slug = models.CharField(max_length=64, blank=True)  # kept when the team is deleted
    action = models.CharField(max_length=64, db_index=True)  # dotted: "token.create", "login.failure"
    target = models.CharField(max_length=200, blank=True)  # "job 1234", "token ab12cd34"
    before = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    after = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    address = models.CharField(max_length=64, blank=True)  # the client's IP address, as the login guard reads it
    user_agent = models.CharField(max_length=256, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-time", "-id"]
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["team", "time"], name="audit_team_time")]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor_name or '-'} {self.action} {self.target}".rstrip()

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AuditImmutable("audit entries are append-only: they cannot be updated")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AuditImmutable("audit entries are append-only: only the retention collector deletes them")

