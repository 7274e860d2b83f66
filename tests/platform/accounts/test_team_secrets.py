"""Team secrets (``strata.accounts.team_secrets``, ``/api/v1/secrets/``): encrypted at rest under a key derived
from the secret key, readable after the key is rotated (SECRET_KEY_FALLBACKS) and re-encrypted by
``secrets_rotate``; the API is scoped like tokens (another team's secret is a 404), names every bad field at
once, and never answers with a value."""

from __future__ import annotations

import base64

import pytest
from django.db import connection

from strata.accounts import team_secrets
from strata.accounts.models import Secret
from strata.cli.main import main

PREFIX = "/api/v1/secrets/"
VALUE = "hf_s3cr3t-value-0123456789"


@pytest.fixture
def alpha(make_team):
    return make_team("alpha")


@pytest.fixture
def beta(make_team):
    return make_team("beta")


@pytest.fixture
def alice(make_user, make_token, api, alpha):
    return api(make_token(make_user("alice", alpha, "team-admin"), alpha))  # secrets: team-admin (roles)


@pytest.fixture
def bob(make_user, make_token, api, beta):
    return api(make_token(make_user("bob", beta, "team-admin"), beta))


def _raw_column(secret_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT ciphertext FROM accounts_secret WHERE id = %s", [secret_id])
        return cursor.fetchone()[0]


# --- at rest --------------------------------------------------------------------------------------------------
def test_the_database_holds_only_ciphertext(alice):
    answer = alice.post(PREFIX, {"name": "HF_TOKEN", "value": VALUE}, format="json")
    assert answer.status_code == 201, answer.content
    secret = Secret.objects.get(name="HF_TOKEN")
    stored = _raw_column(secret.pk)
    assert VALUE not in stored and base64.b64encode(VALUE.encode()).decode()[:16] not in stored
    assert stored.startswith("gAAAA")  # a Fernet token
    assert team_secrets.decrypt(stored) == VALUE
    # Setting the same value again encrypts afresh (a random IV): equal values are not visible as equal.
    alice.post(PREFIX, {"name": "HF_TOKEN", "value": VALUE}, format="json")
    assert _raw_column(secret.pk) != stored


def test_rotating_the_secret_key_keeps_secrets_readable_and_rotate_reencrypts(alpha, settings):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "old-key-" + "o" * 50, []
    secret, created = team_secrets.secret_set(alpha, "API_KEY", VALUE)
    assert created
    before = secret.ciphertext
    # A new key, the old one in the fallbacks: still readable.
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-key-" + "n" * 50, ["old-key-" + "o" * 50]
    assert team_secrets.secret_values(alpha.pk, ["API_KEY"]) == ({"API_KEY": VALUE}, [])
    assert team_secrets.secrets_rotate() == 1
    after = Secret.objects.get(pk=secret.pk).ciphertext
    assert after != before
    # Re-encrypted under the new key: the old key can leave the fallbacks.
    settings.SECRET_KEY_FALLBACKS = []
    assert team_secrets.secret_values(alpha.pk, ["API_KEY"]) == ({"API_KEY": VALUE}, [])
    # Without the key it was written under, a secret is unreadable (reported by name, never guessed).
    settings.SECRET_KEY = "another-key-" + "x" * 50
    assert team_secrets.secret_values(alpha.pk, ["API_KEY"]) == ({}, ["API_KEY"])
    with pytest.raises(team_secrets.SecretUnreadable):
        team_secrets.secrets_rotate()
    assert Secret.objects.get(pk=secret.pk).ciphertext == after  # nothing changed


def test_strata_secrets_rotate_is_an_admin_command_on_the_local_database(alpha, settings, monkeypatch, capsys):
    monkeypatch.setattr("strata.cli.server_commands.migrate", lambda quiet=True: None)
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "old-key-" + "o" * 50, []
    team_secrets.secret_set(alpha, "API_KEY", VALUE)
    team_secrets.secret_set(alpha, "OTHER", "other-value")
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-key-" + "n" * 50, ["old-key-" + "o" * 50]
    assert main(["secrets", "rotate"]) == 0
    assert "2 secret(s) re-encrypted" in capsys.readouterr().out
    settings.SECRET_KEY_FALLBACKS = []
    assert team_secrets.secret_values(alpha.pk, ["API_KEY", "OTHER"])[0] == {"API_KEY": VALUE, "OTHER": "other-value"}
    settings.SECRET_KEY = "lost-" + "l" * 50
    assert main(["secrets", "rotate"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("strata: error: secret ") and "nothing was re-encrypted" in error and len(
        error.strip().splitlines()) == 1


# --- the API --------------------------------------------------------------------------------------------------
def test_create_replace_list_retrieve_delete_never_answer_with_the_value(alice):
    created = alice.post(PREFIX, {"name": "HF_TOKEN", "value": VALUE}, format="json")
    assert created.status_code == 201
    assert set(created.json()) == {"name", "team", "created_by", "created_at", "updated_by", "updated_at"}
    assert created.json()["team"] == "alpha" and created.json()["created_by"] == "alice"
    replaced = alice.post(PREFIX, {"name": "HF_TOKEN", "value": VALUE + "-2"}, format="json")
    assert replaced.status_code == 200 and replaced.json()["created_at"] == created.json()["created_at"]
    assert replaced.json()["updated_at"] >= created.json()["updated_at"]
    answers = [created, replaced, alice.get(PREFIX), alice.get(f"{PREFIX}HF_TOKEN/"), alice.get("/api/v1/schema/")]
    assert [row["name"] for row in answers[2].json()["results"]] == ["HF_TOKEN"]
    assert answers[3].status_code == 200 and answers[3].json()["name"] == "HF_TOKEN"
    for answer in answers:
        assert VALUE not in answer.content.decode()
    assert alice.delete(f"{PREFIX}HF_TOKEN/").status_code == 204
    assert alice.get(f"{PREFIX}HF_TOKEN/").status_code == 404
    assert alice.delete(f"{PREFIX}HF_TOKEN/").status_code == 404


def test_another_teams_secret_is_a_404_and_never_listed(alice, bob, alpha, make_user, api):
    assert alice.post(PREFIX, {"name": "ALPHA_ONLY", "value": VALUE}, format="json").status_code == 201
    assert bob.get(f"{PREFIX}ALPHA_ONLY/").status_code == 404
    assert bob.delete(f"{PREFIX}ALPHA_ONLY/").status_code == 404
    assert bob.get(PREFIX).json()["results"] == []
    assert bob.get(PREFIX, {"team": "alpha"}).json()["results"] == []
    # Naming another team in a write is refused like an unknown one; alpha's secret is untouched.
    refused = bob.post(PREFIX, {"name": "ALPHA_ONLY", "value": "overwritten", "team": "alpha"}, format="json")
    assert refused.status_code == 400 and set(refused.json()) == {"team"}
    assert team_secrets.secret_values(alpha.pk, ["ALPHA_ONLY"])[0] == {"ALPHA_ONLY": VALUE}
    # Bob may have a secret of the same name: each team sees its own.
    assert bob.post(PREFIX, {"name": "ALPHA_ONLY", "value": "bobs"}, format="json").status_code == 201
    assert [row["team"] for row in bob.get(PREFIX).json()["results"]] == ["beta"]
    assert [row["team"] for row in alice.get(PREFIX).json()["results"]] == ["alpha"]
    # A cluster admin's session sees the teams the admin belongs to, no other (as with tokens).
    root = api()
    root.force_login(make_user("root", admin=True))
    assert root.get(PREFIX).json()["results"] == []
    assert root.get(f"{PREFIX}ALPHA_ONLY/").status_code == 404
    assert root.post(PREFIX, {"name": "X_KEY", "value": "v" * 8, "team": "alpha"}, format="json").status_code == 400


def test_a_multi_team_user_token_is_scoped_to_its_team_and_a_session_picks_one(make_user, make_token, api, alpha,
                                                                               beta):
    carol = make_user("carol", alpha, "team-admin")
    from strata.accounts.services import membership_set

    membership_set(carol, beta, "team-admin")
    token_alpha = api(make_token(carol, alpha))
    assert token_alpha.post(PREFIX, {"name": "SHARED", "value": "alpha-v"}, format="json").json()["team"] == "alpha"
    assert token_alpha.post(PREFIX, {"name": "SHARED", "value": "x" * 5, "team": "beta"},
                            format="json").status_code == 400
    session = api()
    session.force_login(carol)
    missing = session.post(PREFIX, {"name": "SHARED", "value": "beta-v"}, format="json")
    assert missing.status_code == 400 and "several teams" in missing.json()["team"][0]
    assert session.post(PREFIX, {"name": "SHARED", "value": "beta-v", "team": "beta"}, format="json").status_code == 201
    assert sorted(row["team"] for row in session.get(PREFIX).json()["results"]) == ["alpha", "beta"]
    ambiguous = session.get(f"{PREFIX}SHARED/")
    assert ambiguous.status_code == 404 and "?team=" in ambiguous.json()["detail"]
    assert session.get(f"{PREFIX}SHARED/", {"team": "beta"}).json()["team"] == "beta"
    assert session.delete(f"{PREFIX}SHARED/?team=beta").status_code == 204
    assert team_secrets.secret_values(alpha.pk, ["SHARED"])[0] == {"SHARED": "alpha-v"}


def test_a_bad_body_is_a_400_naming_every_bad_field_at_once(alice):
    answer = alice.post(PREFIX, {"name": "lower-case", "value": "", "team": "nope"}, format="json")
    assert answer.status_code == 400 and set(answer.json()) == {"name", "value", "team"}, answer.content
    for name in ("PATH", "STRATA_TOKEN", "RANK", "LD_PRELOAD", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "1ABC",
                 "A" * 65, "HOME", "MASTER_ADDR"):
        answer = alice.post(PREFIX, {"name": name, "value": "v" * 8}, format="json")
        assert answer.status_code == 400 and set(answer.json()) == {"name"}, (name, answer.content)
    too_big = alice.post(PREFIX, {"name": "BIG", "value": "x" * (64 * 1024 + 1)}, format="json")
    assert too_big.status_code == 400 and "64 KiB" in too_big.json()["value"][0]
    exact = alice.post(PREFIX, {"name": "BIG", "value": "é" * (32 * 1024)}, format="json")
    assert exact.status_code == 201  # 64 KiB of UTF-8
    for body in ({}, {"name": "X_KEY"}, {"value": "abc"}, {"name": "X_KEY", "value": 12}):
        answer = alice.post(PREFIX, body, format="json")
        assert answer.status_code == 400 and answer.json(), (body, answer.content)
    assert alice.post(PREFIX, ["X"], format="json").status_code == 400
    assert alice.post(PREFIX, "X=1", content_type="text/plain").status_code in {400, 415}
    assert not Secret.objects.exclude(name="BIG").exists()


def test_values_keep_their_whitespace_and_node_tokens_are_refused(alice, node_token, api):
    value = "  line one\nline two  \n"
    assert alice.post(PREFIX, {"name": "PEM", "value": value}, format="json").status_code == 201
    secret = Secret.objects.get(name="PEM")
    assert team_secrets.secret_values(secret.team_id, ["PEM"])[0] == {"PEM": value}
    assert api(node_token).get(PREFIX).status_code == 403
    assert api().get(PREFIX).status_code == 401
