"""strata.conf's readers: env_float_or_none (a number that may be switched off with an empty value)."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from strata.conf import env_float_or_none


def test_unset_gives_the_default_empty_gives_none_a_number_is_checked(monkeypatch):
    monkeypatch.delenv("STRATA_TEST_DAYS", raising=False)
    assert env_float_or_none("STRATA_TEST_DAYS", 7.0, minimum=0) == 7.0
    assert env_float_or_none("STRATA_TEST_DAYS", None, minimum=0) is None
    monkeypatch.setenv("STRATA_TEST_DAYS", " ")
    assert env_float_or_none("STRATA_TEST_DAYS", 7.0, minimum=0) is None
    monkeypatch.setenv("STRATA_TEST_DAYS", "2.5")
    assert env_float_or_none("STRATA_TEST_DAYS", None, minimum=0) == 2.5
    monkeypatch.setenv("STRATA_TEST_DAYS", "-1")
    with pytest.raises(ImproperlyConfigured, match="STRATA_TEST_DAYS"):
        env_float_or_none("STRATA_TEST_DAYS", 7.0, minimum=0)
