"""Password guessing on every login page (the web UI's /login/, the Django admin's, DRF's /api-auth/login/) is
slowed down, then locked out, by the login guard; a refused attempt is a 429 with Retry-After and is not
checked against the password.

Time is the guard's injected clock (strata.accounts.login_guard.clock), moved by the tests; nothing sleeps.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.base_user import AbstractBaseUser
from django.test import Client

from strata.cli.main import main

A, B = "10.0.0.1", "10.0.0.2"
WRONG_PASSWORD = "Please enter a correct username and password"
TOO_MANY = "Too many failed logins; try again in"


@pytest.fixture
def clock(login_clock):
    return login_clock


@pytest.fixture
def checked(monkeypatch):
    """The passwords actually checked against an account."""
    seen: list[str] = []
    original = AbstractBaseUser.check_password
    monkeypatch.setattr(AbstractBaseUser, "check_password", lambda self, raw: seen.append(raw) or original(self, raw))
    return seen


@pytest.fixture
def alice(make_user):
    return make_user("alice")  # password "pw-alice"


def login(address: str, username: str = "alice", password: str = "wrong", *, path: str = "/login/", **headers):
    return Client(REMOTE_ADDR=address, **headers).post(path, {"username": username, "password": password})


def assert_refused(response, retry_after: int | None = None) -> int:
    assert response.status_code == 429, response.status_code
    wait = int(response["Retry-After"])
    assert wait >= 1 and (retry_after is None or wait == retry_after)
    return wait


def wrong_until_locked(clock, address: str, username: str = "alice") -> None:
    """A patient attacker: waits out each backoff, guesses again, until the pair is locked out."""
    for _ in range(40):
        response = login(address, username)
        if response.status_code == 429:
            wait = int(response["Retry-After"])
            if wait >= 900:
                return
            clock.advance(wait)
        else:
            assert response.status_code == 200 and WRONG_PASSWORD in response.content.decode()
    raise AssertionError("never locked out")


def test_thirty_wrong_passwords_in_a_row_are_refused_after_five_without_checking_them(clock, alice, checked):
    statuses = []
    for _ in range(30):
        response = login(A)
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert response["Retry-After"] == "1"
            assert f"{TOO_MANY} 1 s." in response.content.decode()
    assert statuses == [200] * 5 + [429] * 25
    assert checked == ["wrong"] * 5
    assert_refused(login(A, password="pw-alice"), 1)  # the right password is refused too, unchecked
    assert len(checked) == 5


def test_a_locked_out_user_gets_in_with_the_right_password_once_the_lock_expires(clock, alice, checked):
    wrong_until_locked(clock, A)
    assert len(checked) == 10  # five free, then one per backoff (1, 2, 4, 8, 16 s)
    response = login(A, password="pw-alice")
    assert_refused(response, 900)
    assert "Too many failed logins; try again in 900 s." in response.content.decode()
    clock.advance(899)
    assert_refused(login(A, password="pw-alice"), 1)
    clock.advance(1)
    response = login(A, password="pw-alice")
    assert response.status_code == 302 and response["Location"] == "/jobs/"


def test_a_lockout_from_one_address_only_slows_the_user_down_from_another(clock, alice):
    wrong_until_locked(clock, A)
    # From B the lockout does not apply, only the user name's own backoff (10 failures: 1 s).
    assert_refused(login(B, password="pw-alice"), 1)
    clock.advance(1)
    assert login(B, password="pw-alice").status_code == 302
    assert_refused(login(A, password="pw-alice"))  # A is still locked


def test_one_address_guessing_many_user_names_is_slowed_then_locked(clock, make_user):
    make_user("bob")
    for n in range(20):
        assert login(A, f"user{n}").status_code == 200  # one guess per user name
    assert_refused(login(A, "bob", "pw-bob"), 1)  # even a right password, from that address
    assert login(B, "bob", "pw-bob").status_code == 302  # another address is not affected
    n = 20
    while True:
        response = login(A, f"user{n}")
        if response.status_code == 429:
            if int(response["Retry-After"]) == 900:
                break
            clock.advance(int(response["Retry-After"]))
        else:
            n += 1
    assert n == 50


def test_the_admin_login_is_guarded_and_says_why(clock, make_user, checked):
    make_user("root", admin=True)
    for _ in range(5):
        response = login(A, "root", path="/admin/login/")
        assert response.status_code == 200 and "Please enter the correct username and password" in response.content.decode()
    response = login(A, "root", "pw-root", path="/admin/login/")
    assert_refused(response, 1)
    assert f"{TOO_MANY} 1 s." in response.content.decode()
    assert len(checked) == 5
    clock.advance(1)
    assert login(A, "root", "pw-root", path="/admin/login/").status_code == 302


def test_the_browsable_api_login_is_guarded(clock, alice, checked):
    for _ in range(5):
        assert login(A, path="/api-auth/login/").status_code == 200
    assert_refused(login(A, password="pw-alice", path="/api-auth/login/"), 1)
    assert len(checked) == 5


def test_every_login_page_shares_the_counters(clock, alice):
    for path in ["/login/", "/admin/login/", "/api-auth/login/", "/login/", "/admin/login/"]:
        assert login(A, path=path).status_code == 200
    for path in ["/login/", "/admin/login/", "/api-auth/login/"]:
        assert_refused(login(A, password="pw-alice", path=path), 1)


def test_a_successful_login_clears_the_counters_of_its_address(clock, alice):
    for _ in range(4):
        assert login(A).status_code == 200
    assert login(A, password="pw-alice").status_code == 302
    for _ in range(5):  # five free failures again
        assert login(A).status_code == 200
    assert_refused(login(A), 1)


def test_x_forwarded_for_does_not_dodge_the_guard_without_proxies(clock, alice):
    for n in range(5):
        assert login(A, HTTP_X_FORWARDED_FOR=f"203.0.113.{n}").status_code == 200
    assert_refused(login(A, HTTP_X_FORWARDED_FOR="203.0.113.99"), 1)


def test_strata_user_unlock_lets_a_locked_out_user_in(clock, alice, monkeypatch, capsys):
    monkeypatch.setattr("strata.cli.server_commands.migrate", lambda quiet=True: None)
    wrong_until_locked(clock, A)
    assert_refused(login(A, password="pw-alice"), 900)
    assert main(["user", "unlock", "alice"]) == 0
    assert "counter(s) cleared" in capsys.readouterr().out
    assert login(A, password="pw-alice").status_code == 302


def test_the_login_page_still_logs_in_and_says_wrong_password(clock, alice):
    response = login(A)
    assert response.status_code == 200 and WRONG_PASSWORD in response.content.decode()
    assert "Retry-After" not in response
    response = login(A, password="pw-alice")
    assert response.status_code == 302 and response["Location"] == "/jobs/"
