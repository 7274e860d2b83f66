"""Fixtures of the scheduler's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def alpha(make_team, make_user):
    """Team alpha and its member alice: ``(user, team)``."""
    team = make_team("alpha")
    return make_user("alice", team), team
