"""Each security- or money-relevant action leaves exactly one audit entry, with its actor, team, target, the
values before and after, and the client's address."""

from __future__ import annotations

import pytest
from django.test import Client

from strata.audit.models import AuditEntry

ADDRESS = "198.51.100.23"


def only(action: str) -> AuditEntry:
    entries = list(AuditEntry.objects.filter(action=action))
    assert len(entries) == 1, [(entry.action, entry.target) for entry in AuditEntry.objects.all()]
    return entries[0]


@pytest.fixture
def alpha(make_team):
    return make_team("alpha")


@pytest.fixture
def admin_client(make_user):
    """A cluster admin's browser session (so node tokens and quotas are allowed), from ADDRESS."""
    admin = make_user("root", admin=True)
    client = Client(REMOTE_ADDR=ADDRESS, HTTP_USER_AGENT="browser/1")
    client.force_login(admin)
    return client


# --- logins -----------------------------------------------------------------------------------------------------


def login(username: str, password: str):
    return Client(REMOTE_ADDR=ADDRESS, HTTP_USER_AGENT="browser/1").post(
        "/login/", {"username": username, "password": password})


def test_a_login_leaves_one_success(login_clock, make_user):
    alice = make_user("alice")
    assert login("alice", "pw-alice").status_code == 302
    entry = only("login.success")
    assert (entry.actor_id, entry.actor_name, entry.team_id, entry.target, entry.address, entry.user_agent) == (
        alice.pk, "alice", None, "user alice", ADDRESS, "browser/1")
    assert AuditEntry.objects.count() == 1


def test_a_wrong_password_leaves_one_failure_and_the_tenth_a_lockout(login_clock, make_user):
    alice = make_user("alice")
    assert login("alice", "wrong").status_code == 200
    entry = only("login.failure")
    assert (entry.actor_id, entry.actor_name, entry.target, entry.address, entry.after) == (
        alice.pk, "alice", "user alice", ADDRESS, {"account": True})
    for _ in range(9):  # the policy: 10 failures of one user name from one address lock it out
        login_clock.advance(120)  # past each backoff
        assert login("alice", "wrong").status_code == 200
    assert AuditEntry.objects.filter(action="login.failure").count() == 10
    lockout = only("login.lockout")
    assert (lockout.actor_id, lockout.target, lockout.address) == (alice.pk, "user alice", ADDRESS)
    assert lockout.after == {"scopes": ["user+address"], "seconds": 900.0}
    # A refused attempt (429) checks no password and leaves no entry.
    assert login("alice", "pw-alice").status_code == 429
    assert AuditEntry.objects.count() == 11


def test_a_failure_for_no_account_keeps_the_name_tried(login_clock):
    assert login("mallory", "guess").status_code == 200
    entry = only("login.failure")
    assert (entry.actor_id, entry.actor_name, entry.target, entry.after) == (
        None, "mallory", "user mallory", {"account": False})


# --- tokens -----------------------------------------------------------------------------------------------------


def test_api_tokens_created_and_revoked(alpha, make_user, make_token, api):
    alice = make_user("alice", alpha)
    client = Client(REMOTE_ADDR=ADDRESS)
    client.force_login(alice)
    answer = client.post("/api/v1/tokens/", {"name": "ci", "team": "alpha", "ttl_days": 3},
                         content_type="application/json")
    assert answer.status_code == 201, answer.content
    token = answer.json()
    entry = only("token.create")
    assert (entry.actor_id, entry.team_id, entry.target, entry.address, entry.before) == (
        alice.pk, alpha.pk, f"token {token['prefix']}", ADDRESS, None)
    assert entry.after["kind"] == "user" and entry.after["name"] == "ci" and entry.after["user"] == "alice"
    assert token["token"] not in str(entry.after)
    assert client.delete(f"/api/v1/tokens/{token['id']}/").status_code == 204
    entry = only("token.revoke")
    assert (entry.actor_id, entry.team_id, entry.target, entry.address) == (
        alice.pk, alpha.pk, f"token {token['prefix']}", ADDRESS)
    assert entry.before["revoked_at"] is None and entry.after["revoked_at"] is not None
    assert entry.after["revoked"] == 1


def test_node_tokens_created_and_revoked(admin_client):
    answer = admin_client.post("/api/v1/tokens/", {"name": "gpu-1", "kind": "node"}, content_type="application/json")
    assert answer.status_code == 201, answer.content
    entry = only("node_token.create")
    assert (entry.actor_name, entry.team_id, entry.target, entry.address) == (
        "root", None, f"token {answer.json()['prefix']}", ADDRESS)
    assert admin_client.delete(f"/api/v1/tokens/{answer.json()['id']}/").status_code == 204
    assert only("node_token.revoke").target == f"token {answer.json()['prefix']}"
    assert not AuditEntry.objects.filter(action__startswith="token.").exists()


def test_a_local_token_names_the_operator(alpha, make_user, monkeypatch, capsys):
    from strata.cli.main import main

    monkeypatch.setattr("strata.cli.server_commands.migrate", lambda quiet=True: None)
    make_user("alice", alpha)
    assert main(["token", "create", "--local", "--user", "alice", "--team", "alpha"]) == 0
    entry = only("token.create")
    assert entry.actor_id is None and entry.actor_name.endswith("(strata token create --local)")
    assert entry.team_id == alpha.pk and entry.address == ""


# --- secrets ----------------------------------------------------------------------------------------------------


def test_secrets_set_replaced_and_deleted_without_their_values(alpha, make_user):
    admin = make_user("tia", alpha, role="team-admin")
    client = Client(REMOTE_ADDR=ADDRESS)
    client.force_login(admin)
    for value in ("s3cr3t-one", "s3cr3t-two"):
        answer = client.post("/api/v1/secrets/", {"name": "WANDB_KEY", "value": value, "team": "alpha"},
                             content_type="application/json")
        assert answer.status_code in (200, 201), answer.content
    created, replaced = AuditEntry.objects.filter(action="secret.set").order_by("id")
    assert (created.actor_id, created.team_id, created.target, created.before, created.address) == (
        admin.pk, alpha.pk, "secret WANDB_KEY", None, ADDRESS)
    assert created.after["created"] is True and replaced.after["created"] is False
    assert replaced.before["updated_by"] == "tia"
    assert client.delete("/api/v1/secrets/WANDB_KEY/?team=alpha").status_code == 204
    entry = only("secret.delete")
    assert (entry.actor_id, entry.team_id, entry.target, entry.after) == (admin.pk, alpha.pk, "secret WANDB_KEY", None)
    every = str(list(AuditEntry.objects.values_list("before", "after")))
    assert "s3cr3t" not in every


def test_secret_pages_record_too(alpha, make_user):
    admin = make_user("tia", alpha, role="team-admin")
    client = Client(REMOTE_ADDR=ADDRESS)
    client.force_login(admin)
    assert client.post("/team/secrets/?team=alpha", {"name": "HF_TOKEN", "value": "v" * 8}).status_code == 302
    assert only("secret.set").address == ADDRESS
    assert client.post("/team/secrets/?team=alpha", {"name": "HF_TOKEN", "action": "delete"}).status_code == 302
    assert only("secret.delete").target == "secret HF_TOKEN"


# --- quotas and data roots ---------------------------------------------------------------------------------------


def test_quota_change_through_the_api(alpha, admin_client):
    answer = admin_client.patch("/api/v1/quotas/alpha/", {"max_gpus": 4, "priority": 7},
                                content_type="application/json")
    assert answer.status_code == 200, answer.content
    entry = only("quota.change")
    assert (entry.actor_name, entry.team_id, entry.target, entry.address) == ("root", alpha.pk, "quota alpha", ADDRESS)
    assert entry.before == {"max_gpus": None, "priority": 0}
    assert entry.after == {"max_gpus": 4, "priority": 7}
    # The same values again change nothing and record nothing.
    admin_client.patch("/api/v1/quotas/alpha/", {"max_gpus": 4}, content_type="application/json")
    assert AuditEntry.objects.count() == 1


def test_quota_editor_records_limits_and_data_roots_apart(alpha, admin_client, tmp_path):
    from strata.quotas.services import QUOTA_FIELDS

    form = {"team": "alpha", **{name: "" for name in QUOTA_FIELDS}, "max_gpus": "2", "priority": "0",
            "weight": "1", "window_hours": "168", "data_roots": str(tmp_path)}
    from strata.quotas.models import Quota

    quota = Quota.objects.get(team=alpha)
    for name in QUOTA_FIELDS:  # the editor posts every field: keep the others as they are
        value = getattr(quota, name)
        if name not in ("max_gpus",):
            form[name] = "" if value is None else str(value)
    answer = admin_client.post("/manage/quotas/", form)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    entry = only("quota.change")
    assert (entry.before, entry.after) == ({"max_gpus": None}, {"max_gpus": 2})
    roots = only("data_roots.grant")
    assert (roots.team_id, roots.target, roots.before, roots.after, roots.address) == (
        alpha.pk, "quota alpha", {"data_roots": []}, {"data_roots": [str(tmp_path)]}, ADDRESS)


# --- other people's jobs ----------------------------------------------------------------------------------------


def test_cancelling_and_resubmitting_another_persons_job(alpha, make_user, make_token, api, submit):
    owner = make_user("olga", alpha)
    admin = make_user("tia", alpha, role="team-admin")
    own = submit(owner, alpha)
    client = api(make_token(owner, alpha))
    assert client.post(f"/api/v1/jobs/{own.pk}/cancel/", REMOTE_ADDR=ADDRESS).status_code == 200
    assert not AuditEntry.objects.filter(action__startswith="job.").exists()  # one's own job: not recorded
    other = submit(owner, alpha)
    client = api(make_token(admin, alpha))
    assert client.post(f"/api/v1/jobs/{other.pk}/cancel/", REMOTE_ADDR=ADDRESS).status_code == 200
    entry = only("job.cancel_other")
    assert (entry.actor_id, entry.team_id, entry.target, entry.address) == (admin.pk, alpha.pk, f"job {other.pk}",
                                                                           ADDRESS)
    assert entry.before["owner"] == "olga" and entry.after == {"state": "CANCELLED"}
    answer = client.post(f"/api/v1/jobs/{other.pk}/resubmit/", REMOTE_ADDR=ADDRESS)
    assert answer.status_code == 201, answer.content
    entry = only("job.resubmit_other")
    assert (entry.actor_id, entry.target, entry.after) == (admin.pk, f"job {other.pk}", {"job": answer.json()["id"]})
