"""The serve kind's spec: a null where the schema allows none is a field error, never a crash (found by the
schemathesis run, tests/platform/api/test_fuzz_schemathesis.py: ``request_timeout_s: null`` was a 500)."""

import pytest

from components.serving.spec import ServeSpec, SpecError

MODEL = {"job": "3f0c5b8e-9a51-4c55-9c1e-0f1b2f0d9a11"}
DEFAULTS = {"slo_ms": None, "auth": "token", "replicas": 1, "autoscale": None, "emoe": None, "batching": {"policy": "orloj", "max_batch": 8, "max_queue_delay_ms": 2.0, "max_queue": 128,
                     "preempt": True}}


@pytest.mark.parametrize("field", ["port", "request_timeout_s", "max_rows", "batching"])
def test_a_null_is_an_error_of_its_field(field):
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, field: None})
    assert raised.value.errors == {f"spec.{field}": "must not be null"}


def test_the_defaults_fill_what_is_left_out():
    assert ServeSpec().validate({"model": MODEL}) == {
        "model": {**MODEL, "entrypoint": None}, "port": 0, "request_timeout_s": 10.0, "max_rows": 1024, **DEFAULTS}


def test_batching_and_the_slo():
    spec = ServeSpec().validate({"model": MODEL, "slo_ms": 50, "batching": {"policy": "fifo", "max_batch": 16}})
    assert spec["batching"] == {"policy": "fifo", "max_batch": 16, "max_queue_delay_ms": 2.0, "max_queue": 128,
                     "preempt": True}
    assert ServeSpec.default_deadline_s(spec) == pytest.approx(0.05)
    assert ServeSpec.default_deadline_s(ServeSpec().validate({"model": MODEL, "request_timeout_s": 3})) == 3.0


def test_every_bad_batching_field_is_named_at_once():
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, "slo_ms": 0, "batching": {
            "policy": "lifo", "max_batch": 0, "max_queue_delay_ms": -1, "max_queue": 1.5, "size": 3}})
    assert set(raised.value.errors) == {"spec.slo_ms", "spec.batching.policy", "spec.batching.max_batch",
                                        "spec.batching.max_queue_delay_ms", "spec.batching.max_queue",
                                        "spec.batching.size"}
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, "batching": [1]})
    assert set(raised.value.errors) == {"spec.batching"}


def test_replicas_and_autoscale():
    spec = ServeSpec().validate({"model": MODEL, "replicas": 2, "autoscale": {"min": 1, "max": 4}})
    assert spec["replicas"] == 2 and spec["autoscale"] == {"min": 1, "max": 4, "target_attainment": 0.95,
                                                         "queue_per_replica": 16.0, "period_s": 10.0}
    assert ServeSpec.replica_spec(spec)["replicas"] == 1 and ServeSpec.replica_spec(spec)["autoscale"] is None
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, "replicas": 5, "autoscale": {"min": 1, "max": 4, "period_s": None,
                                                                           "target_attainment": None, "x": 1}})
    assert set(raised.value.errors) == {"spec.autoscale.period_s", "spec.autoscale.target_attainment",
                                        "spec.autoscale.x"}
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, "replicas": 5, "autoscale": {"min": 1, "max": 4}})
    assert set(raised.value.errors) == {"spec.replicas"}
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, "replicas": 0, "autoscale": {"min": 3, "max": 2}})
    assert set(raised.value.errors) == {"spec.replicas", "spec.autoscale.min"}
    with pytest.raises(SpecError) as raised:
        ServeSpec().validate({"model": MODEL, "autoscale": "yes"})
    assert set(raised.value.errors) == {"spec.autoscale"}
