"""TokenGate: checks against the job's working token digests, refreshed in the background."""

import threading

from support import wait_for

from components.runtime.shared.tokens import TokenGate, bearer, token_digest


def test_bearer_reads_the_authorization_header_or_x_strata_token():
    assert bearer([("authorization", "Bearer abc")]) == "abc"
    assert bearer([("Authorization", "bearer  abc ")]) == "abc"
    assert bearer([("x-strata-token", "xyz")]) == "xyz"
    assert bearer([("authorization", "Basic abc"), ("other", "1")]) is None
    assert bearer([("authorization-bin", b"abc")]) is None
    assert bearer([]) is None


def test_check_accepts_working_tokens_only_and_follows_revocations():
    working = {token_digest("sj_a"), token_digest("sj_b")}
    gate = TokenGate(lambda: set(working), refresh_s=0.05, name="t").start()
    try:
        assert gate.check("sj_a") is None and gate.check("sj_b") is None
        assert "no access token" in gate.check(None) and "no access token" in gate.check("")
        assert "not valid" in gate.check("sj_c")
        assert "not valid" in gate.check("x" * 10_000)  # refused without hashing
        working.discard(token_digest("sj_a"))  # revoked
        wait_for(lambda: gate.check("sj_a") is not None, 10, "the revocation to reach the gate")
        assert gate.check("sj_b") is None and gate.known == 1
    finally:
        gate.stop()


def test_a_failed_refresh_keeps_the_known_tokens_and_a_gate_that_never_read_accepts_no_one():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) > 1:
            raise ConnectionError("control plane down")
        return [token_digest("sj_a")]

    gate = TokenGate(flaky, refresh_s=0.02).start()
    try:
        wait_for(lambda: gate.failures >= 2, 10, "failed refreshes")
        assert gate.check("sj_a") is None  # still known
    finally:
        gate.stop()

    def down():
        raise ConnectionError("control plane down")

    never = TokenGate(down, refresh_s=60)
    never.refresh()
    assert "could not be read yet" in never.check("sj_a")


def test_stop_ends_the_refresh_thread():
    gate = TokenGate(lambda: [], refresh_s=0.01, name="stopper").start()
    gate.stop()
    assert not [t for t in threading.enumerate() if t.name == "token-gate-stopper"]
