"""The audit log itself: record(), append-only at every level, retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory
from django.utils import timezone

from strata.audit.models import AuditEntry, AuditImmutable
from strata.audit.retention import audit_prune, entries_delete
from strata.audit.services import record


def _request(user=None, address="203.0.113.7", agent="pytest-agent/1", forwarded=None):
    request = RequestFactory().get("/", REMOTE_ADDR=address, HTTP_USER_AGENT=agent,
                                   **({"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}))
    if user is not None:
        request.user = user
    return request


@pytest.mark.django_db
def test_record_takes_actor_address_and_agent_from_the_request(make_team, make_user):
    team = make_team("alpha")
    alice = make_user("alice", team)
    entry = record("quota.change", request=_request(alice), team=team, target="quota alpha",
                   before={"max_gpus": 1}, after={"max_gpus": 4})
    entry = AuditEntry.objects.get(pk=entry.pk)
    assert (entry.action, entry.actor_id, entry.actor_name, entry.team_id, entry.team_slug, entry.target) == (
        "quota.change", alice.pk, "alice", team.pk, "alpha", "quota alpha")
    assert (entry.before, entry.after) == ({"max_gpus": 1}, {"max_gpus": 4})
    assert (entry.address, entry.user_agent) == ("203.0.113.7", "pytest-agent/1")


@pytest.mark.django_db
def test_record_address_behind_a_proxy_and_without_a_request(settings, make_user):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    entry = record("login.success", request=_request(make_user("bob"), address="10.0.0.1",
                                                      forwarded="198.51.100.9, 2001:db8::5"))
    assert entry.address == "2001:db8::5"  # the exact address, not the login guard's /64 key
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    assert record("x.y", request=_request(address="10.0.0.1", forwarded="198.51.100.9")).address == "10.0.0.1"
    entry = record("secret.set", actor="strata-cli", target="secret K")
    assert (entry.actor_id, entry.actor_name, entry.address, entry.user_agent) == (None, "strata-cli", "", "")


@pytest.mark.django_db
def test_record_rolls_back_with_the_action(make_user):
    with pytest.raises(RuntimeError), transaction.atomic():
        record("token.create", actor=make_user("carol"), target="token abcd")
        raise RuntimeError("the action failed")
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_orm_updates_and_deletes_raise(make_user):
    entry = record("token.revoke", actor=make_user("dave"), target="token 1")
    entry.target = "token 2"
    with pytest.raises(AuditImmutable):
        entry.save()
    with pytest.raises(AuditImmutable):
        entry.delete()
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.filter(pk=entry.pk).update(target="token 3")
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.filter(pk=entry.pk).delete()
    with pytest.raises(AuditImmutable), transaction.atomic():
        AuditEntry.objects.bulk_update([entry], ["target"])
    assert AuditEntry.objects.get(pk=entry.pk).target == "token 1"


@pytest.mark.django_db
def test_raw_update_is_rejected_by_the_database(make_user):
    entry = record("token.revoke", actor=make_user("erin"), target="token 1")
    table = AuditEntry._meta.db_table
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET target = %s WHERE id = %s", ["forged", entry.pk])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET actor_id = NULL, target = %s WHERE id = %s", ["forged", entry.pk])
    assert AuditEntry.objects.get(pk=entry.pk).target == "token 1"


@pytest.mark.postgres
@pytest.mark.django_db
def test_raw_delete_is_rejected_by_the_postgres_trigger_outside_retention(make_user):
    entry = record("token.revoke", actor=make_user("fay"), target="token 1")
    table = AuditEntry._meta.db_table
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [entry.pk])
    assert AuditEntry.objects.filter(pk=entry.pk).exists()
    # The retention's own delete goes through, and closes the way behind it.
    other = record("token.revoke", actor="x", target="token 2")
    assert entries_delete(AuditEntry.objects.filter(pk=other.pk)) == 1
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [entry.pk])
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_retention_switch_lasts_one_transaction(make_user):
    entry = record("token.revoke", actor=make_user("fay"), target="token 1")
    table = AuditEntry._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('strata.audit_retention', 'on', true)")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [entry.pk])
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


@pytest.mark.django_db
def test_deleting_the_user_or_team_keeps_the_entry_and_the_names(make_team, make_user):
    team = make_team("gone")
    user = make_user("gina", team)
    entry = record("membership.add", actor=user, team=team, target="user gina")
    user.delete()
    team.delete()
    entry = AuditEntry.objects.get(pk=entry.pk)
    assert (entry.actor_id, entry.actor_name, entry.team_id, entry.team_slug, entry.target) == (
        None, "gina", None, "gone", "user gina")


@pytest.mark.django_db
def test_retention_deletes_only_old_entries(settings, make_user):
    settings.STRATA_AUDIT_RETENTION_DAYS = 30
    user = make_user("hal")
    now = timezone.now()
    old = [AuditEntry.objects.create(action="login.success", actor=user, time=now - timedelta(days=days))
           for days in (31, 400)]
    kept = [AuditEntry.objects.create(action="login.success", actor=user, time=now - timedelta(days=days))
            for days in (29, 0)]
    assert audit_prune(now=now) == 2
    assert set(AuditEntry.objects.values_list("id", flat=True)) == {entry.pk for entry in kept}
    assert not AuditEntry.objects.filter(pk__in=[entry.pk for entry in old]).exists()
    assert audit_prune(now=now) == 0
    settings.STRATA_AUDIT_RETENTION_DAYS = 0  # kept forever
    assert audit_prune(now=now + timedelta(days=1000)) == 0
    assert AuditEntry.objects.count() == 2


@pytest.mark.django_db
def test_retention_task_runs_on_the_leader(settings, make_user, monkeypatch):
    from strata.audit import tasks
    from strata.scheduling import leader

    settings.STRATA_AUDIT_RETENTION_DAYS = 1
    AuditEntry.objects.create(action="login.success", time=timezone.now() - timedelta(days=2))
    monkeypatch.setattr(leader, "lease_acquire", lambda: None)
    assert tasks.retention_task() == 0
    assert AuditEntry.objects.count() == 1
    monkeypatch.setattr(leader, "lease_acquire", lambda: object())
    assert tasks.retention_task() == 1
    assert AuditEntry.objects.count() == 0


def test_beat_schedules_the_retention():
    from strata.celery import app

    app.loader.import_default_modules()
    assert app.conf.beat_schedule["audit-retention"]["task"] == "strata.audit.retention"
    assert "strata.audit.retention" in app.tasks


@pytest.mark.django_db
def test_the_django_admin_is_read_only(make_user):
    from django.test import Client

    root = make_user("root", admin=True)
    entry = record("quota.change", actor=root, target="quota alpha", after={"max_gpus": 2})
    client = Client()
    client.force_login(root)
    base = "/admin/audit/auditentry/"
    assert client.get(base).status_code == 200
    page = client.get(f"{base}{entry.pk}/change/")
    assert page.status_code == 200 and b'name="target"' not in page.content  # shown, not editable
    assert client.post(f"{base}{entry.pk}/change/", {"target": "forged"}).status_code == 403
    assert client.get(f"{base}add/").status_code == 403
    assert client.post(f"{base}{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(base, {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"}
                       ).status_code in (200, 302, 403)
    assert AuditEntry.objects.get(pk=entry.pk).target == "quota alpha"
