"""The login guard (strata.accounts.login_guard): backoff, lockout, keys, client addresses, unlock.

Time is the guard's injected clock, moved by the tests; nothing sleeps. The HTTP side (status 429,
Retry-After, the three login pages) is in tests/dashboard/test_login.py.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate
from django.test import RequestFactory

from strata.accounts import login_guard
from strata.accounts.login_guard import Limit, LoginRefused, begin
from strata.accounts.models import LoginThrottle
from strata.cli.main import main

A, B = "10.0.0.1", "10.0.0.2"


@pytest.fixture
def policy(login_policy):
    return login_policy


@pytest.fixture
def clock(login_clock):
    return login_clock


def fail(username: str, address: str | None, times: int = 1) -> None:
    """Charge ``times`` attempts that are not followed by a success (wrong passwords)."""
    for _ in range(times):
        begin(username, address)


def refused(username: str, address: str | None) -> int:
    """The Retry-After of a refused attempt (the test fails if the attempt is let through)."""
    with pytest.raises(LoginRefused) as error:
        begin(username, address)
    return error.value.retry_after


def attack(clock, username: str, failures: int) -> None:
    """Guess ``username``'s password ``failures`` times from 10.1.0.x, five guesses an address (the free ones
    of each pair), waiting out the user name's backoff between them."""
    for n in range(failures):
        address = f"10.1.0.{n // 5}"
        clock.advance(login_guard.wait_seconds(username, address))
        fail(username, address)


def fail_until_locked(clock, username: str, address: str, failures: int = 10) -> None:
    """Fail ``failures`` times, waiting out each backoff the way a patient attacker would."""
    for _ in range(failures):
        wait = login_guard.wait_seconds(username, address)
        clock.advance(wait)
        fail(username, address)


# --- the policy's numbers -------------------------------------------------------------------------------------


def test_backoff_doubles_after_the_free_failures_then_locks_out():
    pair = Limit(free=5, lockout_at=10)
    waits = [pair.wait(n, base=1, cap=60, lockout=900) for n in range(12)]
    assert waits == [0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 900, 900]


def test_the_per_user_name_limit_only_slows_down_and_is_capped():
    user = Limit(free=10, lockout_at=None)
    assert [user.wait(n, base=1, cap=60, lockout=900) for n in (9, 10, 11, 15, 16, 10_000)] == [0, 1, 2, 32, 60, 60]


# --- per (user name, address) ---------------------------------------------------------------------------------


def test_five_free_failures_then_each_attempt_waits_its_backoff(clock):
    fail("alice", A, 5)
    assert refused("alice", A) == 1
    clock.advance(0.5)
    assert refused("alice", A) == 1  # rounded up
    clock.advance(0.5)
    fail("alice", A)  # the 6th failure: the next attempt waits 2 s
    assert refused("alice", A) == 2
    clock.advance(2)
    fail("alice", A)
    assert refused("alice", A) == 4


def test_a_refused_attempt_is_not_counted(clock):
    fail("alice", A, 5)
    for _ in range(20):
        refused("alice", A)
    row = LoginThrottle.objects.get(scope="user+address")
    assert row.failures == 5


def test_ten_failures_lock_out_for_fifteen_minutes_and_each_later_failure_again(clock):
    fail_until_locked(clock, "alice", A)
    assert refused("alice", A) == 900
    clock.advance(899)
    assert refused("alice", A) == 1
    clock.advance(1)
    fail("alice", A)  # the 11th failure locks again
    assert refused("alice", A) == 900


def test_failures_expire_after_the_window(clock):
    fail_until_locked(clock, "alice", A)
    clock.advance(3600)
    fail("alice", A, 5)  # counted from zero again: five free
    assert refused("alice", A) == 1


def test_a_success_clears_the_pair_and_refunds_its_own_charge(clock):
    fail("alice", A, 4)
    begin("alice", A).succeeded()
    pair, address, user = (LoginThrottle.objects.get(scope=scope) for scope in ("user+address", "address", "user"))
    assert (pair.failures, pair.last_failure_at, pair.last_success_at) == (0, None, clock.now)
    assert address.failures == 4 and user.failures == 4  # the other keys keep the real failures
    fail("alice", A, 5)
    assert refused("alice", A) == 1


def test_a_success_puts_back_the_last_failure_time_of_the_shared_keys(clock):
    fail("alice", A, 4)
    failed_at = clock.now
    clock.advance(10)
    begin("alice", A).succeeded()
    assert set(LoginThrottle.objects.exclude(scope="user+address").values_list("last_failure_at", flat=True)) == {
        failed_at}


def test_the_charge_is_taken_before_the_password_is_checked(clock):
    """An attempt counts as a failure from the moment it is let through, so requests sent in parallel cannot
    all pass the gate on the same count; only a success gives the charge back."""
    attempts = [begin("alice", A) for _ in range(5)]
    assert refused("alice", A) == 1
    attempts[0].succeeded()
    assert LoginThrottle.objects.get(scope="user+address").failures == 0


# --- per address and per user name --------------------------------------------------------------------------------


def test_one_address_guessing_many_user_names_is_slowed_then_locked(clock):
    for n in range(20):
        fail(f"user{n}", A)  # one guess each: every pair stays free
    assert refused("someone-new", A) == 1
    for n in range(20, 50):
        clock.advance(login_guard.wait_seconds(f"user{n}", A))
        fail(f"user{n}", A)
    assert refused("yet-another", A) == 900
    # Another address is not affected.
    begin("yet-another", B).succeeded()


def test_a_lockout_from_one_address_does_not_lock_the_user_out_from_another(clock):
    fail_until_locked(clock, "alice", A)
    assert refused("alice", A) == 900
    # From B only the user name's own slow-down applies: it waits out the last failure's backoff (10
    # failures: 1 s), never the lockout.
    assert refused("alice", B) == 1
    clock.advance(1)
    begin("alice", B).succeeded()
    assert refused("alice", A) == 899  # A stays locked


def test_the_user_name_limit_never_locks_however_many_addresses_guess(clock):
    attack(clock, "alice", 200)  # from 40 addresses
    assert LoginThrottle.objects.get(scope="user").failures == 200
    assert refused("alice", "10.2.0.1") == 60  # capped backoff, not a lockout
    clock.advance(60)
    begin("alice", "10.2.0.1").succeeded()


def test_an_address_the_user_logged_in_from_skips_the_user_name_slow_down(clock):
    begin("alice", B).succeeded()  # alice's usual address
    attack(clock, "alice", 15)  # from three other addresses: the user name's backoff is now 32 s
    assert refused("alice", "10.9.9.9") == 32
    begin("alice", B).succeeded()  # no wait from B
    clock.advance(31 * 86400)  # a known address is forgotten after 30 days without a login from it
    attack(clock, "alice", 15)
    assert refused("alice", B) == 32


def test_without_an_address_only_the_user_name_key_applies(clock):
    fail("alice", None, 10)
    assert refused("alice", None) == 1
    assert set(LoginThrottle.objects.values_list("scope", flat=True)) == {"user"}


# --- keys ---------------------------------------------------------------------------------------------------------------


def test_user_names_are_keyed_case_insensitively_and_never_stored_unless_they_are_accounts(clock, make_user):
    fail("Alice", A, 3)
    fail("ALICE", A, 2)
    assert refused("alice", A) == 1
    assert set(LoginThrottle.objects.values_list("username", flat=True)) == {""}
    password_in_the_name_box = "hunter2-secret"
    fail(password_in_the_name_box, A)
    make_user("bob")
    fail("bob", A)
    stored = " ".join(" ".join(map(str, row)) for row in LoginThrottle.objects.values_list())
    assert "hunter2" not in stored and "alice" not in stored.lower()
    assert LoginThrottle.objects.filter(scope="user", username="bob").exists()


def request_from(remote: str, forwarded: str | None = None):
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}
    return RequestFactory().post("/login/", REMOTE_ADDR=remote, **extra)


def test_x_forwarded_for_is_ignored_without_proxies(policy):
    assert login_guard.client_address(request_from("192.0.2.7", "203.0.113.9")) == "192.0.2.7"


def test_x_forwarded_for_is_read_from_the_right_with_proxies(policy):
    policy.REST_FRAMEWORK = {**policy.REST_FRAMEWORK, "NUM_PROXIES": 1}
    # The client forged the first entry; the proxy appended the address it saw.
    assert login_guard.client_address(request_from("10.0.0.254", "6.6.6.6, 203.0.113.9")) == "203.0.113.9"
    assert login_guard.client_address(request_from("10.0.0.254", "not-an-ip")) == "10.0.0.254"
    assert login_guard.client_address(request_from("10.0.0.254")) == "10.0.0.254"


def test_ipv6_clients_are_grouped_by_their_64_and_mapped_ipv4_is_ipv4(policy):
    assert login_guard.client_address(request_from("2001:db8:1:2::5")) == "2001:db8:1:2::/64"
    assert login_guard.client_address(request_from("2001:db8:1:2:ffff::9")) == "2001:db8:1:2::/64"
    assert login_guard.client_address(request_from("::ffff:192.0.2.1")) == "192.0.2.1"
    assert login_guard.client_address(request_from("garbage")) is None
    assert login_guard.client_address(None) is None


# --- the backend -----------------------------------------------------------------------------------------------------


def test_the_backend_refuses_without_checking_the_password(clock, make_user, monkeypatch):
    make_user("alice")
    checked = []
    from django.contrib.auth.base_user import AbstractBaseUser

    original = AbstractBaseUser.check_password
    monkeypatch.setattr(AbstractBaseUser, "check_password",
                        lambda self, raw: checked.append(raw) or original(self, raw))
    request = request_from(A)
    for _ in range(5):
        assert authenticate(request, username="alice", password="wrong") is None
    assert len(checked) == 5
    assert authenticate(request, username="alice", password="pw-alice") is None  # refused
    assert len(checked) == 5 and getattr(request, login_guard.REFUSED_ATTR) == 1
    clock.advance(1)
    assert authenticate(request_from(A), username="alice", password="pw-alice").username == "alice"


# --- unlock and housekeeping --------------------------------------------------------------------------------------


@pytest.fixture
def cli_db(db, monkeypatch):
    monkeypatch.setattr("strata.cli.server_commands.migrate", lambda quiet=True: None)


def test_strata_user_unlock_clears_a_lockout(clock, cli_db, make_user, capsys):
    make_user("alice")
    fail_until_locked(clock, "alice", A)
    fail_until_locked(clock, "alice", B)
    assert refused("alice", A) > 500 and refused("alice", B) == 900
    assert main(["user", "unlock", "Alice"]) == 0
    assert "3 failed-login counter(s) cleared" in capsys.readouterr().out
    assert authenticate(request_from(A), username="alice", password="pw-alice") is not None


def test_strata_user_unlock_with_an_address_clears_that_address_too(clock, cli_db, capsys):
    for n in range(50):
        clock.advance(login_guard.wait_seconds(f"user{n}", A))
        fail(f"user{n}", A)
    assert refused("alice", A) == 900
    assert main(["user", "unlock", "alice", "--address", A]) == 0
    begin("alice", A).succeeded()
    assert main(["user", "unlock", "alice", "--address", "not-an-ip"]) == 2


def test_purge_deletes_expired_counters_but_keeps_known_addresses(clock):
    begin("alice", A).succeeded()
    fail("mallory", B, 3)
    clock.advance(3601)
    fail("carol", B)
    # Gone: address A and alice's user name (nothing left to count), mallory's pair and user name (expired).
    assert login_guard.purge() == 4
    left = set(LoginThrottle.objects.values_list("scope", "address"))
    assert left == {("user+address", A), ("user+address", B), ("address", B), ("user", "")}  # carol's
