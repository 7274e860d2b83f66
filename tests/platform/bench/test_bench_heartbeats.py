"""Smoke test of the heartbeat part of ``strata bench control-plane`` (benchmarks.core.heartbeats): a real stack on
PostgreSQL + Redis, a few simulated nodes heartbeating at the real interval, a short window, the passes."""

from __future__ import annotations

import pytest

from benchmarks import benchkit
from benchmarks.core import heartbeats
from benchmarks.stack import services_available

TINY = {"sizes": [20], "window_s": {20: 5.0}, "warmup_s": 2.0, "jobs_per_node": 5, "max_pass_runs": 1,
        "quiet_pass_runs": 1}


@pytest.mark.postgres
def test_heartbeat_load_on_a_real_stack():
    problem = services_available()
    if problem:
        pytest.skip(problem)
    result = heartbeats.measure(sizes=TINY)
    step = result["steps"][-1]
    beats = step["heartbeats"]
    assert step["nodes"] == 20 and beats["nodes"] == 20
    assert beats["answered"] > 0
    assert beats["error_count"] == 0, result["error_samples"]
    assert beats["interval_s"] == 3.0 and beats["lease_s"] == 15.0  # the real interval and lease
    # The agent's lean protocol: renewals, and a full heartbeat (the batched samples) per telemetry cadence.
    assert beats["protocol"] == "lean" and beats["telemetry_seconds"] == 15.0
    assert step["database"] == {"registered": 20, "not_up": 0}
    assert step["leases"]["nodes_lost_lease"] == 0
    assert step["pass_under_heartbeats"]["runs"] and result["pass_quiet"]["runs"]
    assert step["pass_under_heartbeats"]["nodes_up"] == [20]

    made = heartbeats.figures(result, quick=True)
    assert [figure.key for figure in made] == ["heartbeats_per_s", "pass_under_heartbeats_s"]
    doc = benchkit.document("control-plane-heartbeats", True, made, details=result)
    assert benchkit.validate_document(doc) == []
    figure = doc["figures"]["heartbeats_per_s"]
    assert figure["baseline"] == pytest.approx(20 / 3.0)
    assert figure["mechanism"] > 0
