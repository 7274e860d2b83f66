"""``strata user create``: onboarding a web UI user on the head node."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from strata.accounts.models import Membership
from strata.cli.main import main


@pytest.fixture
def cli_db(db, monkeypatch):
    # The command migrates first; the test database is already migrated.
    monkeypatch.setattr("strata.cli.server_commands.migrate", lambda quiet=True: None)


def test_creates_a_member_with_a_generated_password(cli_db, capsys):
    assert main(["user", "create", "carol", "--team", "vision", "--team", "nlp"]) == 0
    out = capsys.readouterr().out
    password = out.split("password: ")[1].strip()
    user = get_user_model().objects.get(username="carol")
    assert user.check_password(password) and not user.is_staff
    assert sorted(Membership.objects.filter(user=user).values_list("team__slug", flat=True)) == ["nlp", "vision"]


def test_password_from_a_file_and_admin_flag(cli_db, tmp_path, capsys):
    secret = tmp_path / "pw"
    secret.write_text("a-long-enough-secret\n")
    assert main(["user", "create", "dana", "--admin", "--password-file", str(secret)]) == 0
    assert "password:" not in capsys.readouterr().out
    user = get_user_model().objects.get(username="dana")
    assert user.is_staff and user.check_password("a-long-enough-secret")


def test_a_short_password_is_refused(cli_db, tmp_path, capsys):
    secret = tmp_path / "pw"
    secret.write_text("short\n")
    assert main(["user", "create", "erin", "--password-file", str(secret)]) == 2
    assert "password:" in capsys.readouterr().err
    assert not get_user_model().objects.filter(username="erin").exists()


def test_adding_an_existing_admin_to_a_team_keeps_its_password_and_rights(cli_db, make_user, capsys):
    make_user("root", admin=True)
    assert main(["user", "create", "root", "--team", "ml"]) == 0
    assert "password:" not in capsys.readouterr().out
    user = get_user_model().objects.get(username="root")
    assert user.is_staff and user.check_password("pw-root")
    assert Membership.objects.filter(user=user, team__slug="ml").exists()
