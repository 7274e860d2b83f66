"""Fixtures of the notification tests: a real HTTP receiver on 127.0.0.1 (an http.server thread) that records what
it gets and answers as told, a team with its team-admin, and the notify queue's messages recorded."""

from __future__ import annotations

import contextlib

import pytest
from webhook_receiver import receiving


@pytest.fixture
def receivers():
    """``receivers()`` starts one more receiver (webhook_receiver.Receiver); every one is shut down at the end."""
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(receiving())


@pytest.fixture
def receiver(receivers):
    return receivers()


@pytest.fixture
def notify_settings(settings):
    settings.STRATA_WEBHOOK_ALLOW_PRIVATE = True  # the receiver is on 127.0.0.1
    settings.STRATA_NOTIFY_BACKOFF_S = 0.5
    settings.STRATA_NOTIFY_BACKOFF_MAX_S = 4.0
    settings.STRATA_NOTIFY_MAX_ATTEMPTS = 4
    settings.STRATA_NOTIFY_CONNECT_TIMEOUT_S = 2.0
    settings.STRATA_NOTIFY_READ_TIMEOUT_S = 1.0
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    return settings


@pytest.fixture
def queued(monkeypatch):
    """The notify queue's messages, recorded instead of sent: a list of (delivery id, countdown)."""
    from strata.notify import services

    sent: list[tuple[int, float]] = []
    monkeypatch.setattr(services, "send", lambda delivery_id, countdown=0.0: sent.append((delivery_id, countdown)))
    return sent


@pytest.fixture
def admin_team(make_team, make_user, make_token, api, notify_settings):
    """Team alpha with its team-admin ``ada`` (an API client with her token) and a plain member ``mel``."""
    team = make_team("alpha")
    ada = make_user("ada", team, role="team-admin")
    mel = make_user("mel", team, role="member")
    return {"team": team, "ada": ada, "mel": mel, "client": api(make_token(ada, team)),
            "member_client": api(make_token(mel, team))}
