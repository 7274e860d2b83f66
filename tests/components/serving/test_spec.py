"""The serve kind's spec: a null where the schema allows none is a field error, never a crash (found by the
schemathesis run, tests/platform/api/test_fuzz_schemathesis.py: ``request_timeout_s: null`` was a 500)."""

import pytest

from components.serving.spec import ServeSpec, SpecError

MODEL = {"job": "3f0c5b8e-9a51-4c55-9c1e-0f1b2f0d9a11"}


@pytest.mark.parametrize("field", ["port", "request_timeout_s", "max_rows"])
def test_a_null_is_an_error_of_its_field(field):
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, field: None})
    assert raised.value.errors == {f"spec.{field}": "must not be null"}


def test_the_defaults_fill_what_is_left_out():
    assert ServeSpec().validate({"model": MODEL}) == {
        "model": MODEL, "port": 0, "request_timeout_s": 10.0, "max_rows": 1024}
