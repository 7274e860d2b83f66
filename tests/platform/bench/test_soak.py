"""The soak test (benchmarks.core.soak), bounded: a real ``strata server`` + ``strata scheduler`` + ``strata node`` on
whatever the suite runs on (PostgreSQL + Redis when STRATA_DATABASE_URL / STRATA_BROKER_URL say so, else SQLite
and the embedded broker), half a minute of the mixed load of two teams' users, then: no 5xx, connection error or
timeout, no unexpected answer (a 4xx the call may not give, the other team's job readable, an idempotent replay
that made a new job), every acknowledged submit listed afterwards, the server's RSS and the database connections
flat by the soak's tolerance. Latency is reported, never asserted (the machine may be loaded)."""

from __future__ import annotations

import pytest

from benchmarks import benchkit
from benchmarks.core import soak

MB = 2**20


def _samples(rss: list[float], connections: list[int], step: float = 2.0, threads: int = 0) -> list[dict]:
    return [{"t": index * step, "server_rss": value, "db_connections": count, "server_db_connections": count,
             "server_threads": threads} for index, (value, count) in enumerate(zip(rss, connections, strict=True))]


def test_flatness_judges_growth_and_tolerates_noise():
    steady = _samples([100 * MB, 101 * MB, 100 * MB, 102 * MB, 101 * MB, 102 * MB, 101 * MB, 103 * MB],
                      [5, 6, 5, 6, 6, 7, 6, 7])
    judged = soak.flatness(steady, warmup_s=0.0)
    assert judged["judged"] and judged["flat"] is True
    assert judged["samples"] == [4, 4]

    leaking = _samples([100 * MB + i * 20 * MB for i in range(8)], [5] * 8)
    judged = soak.flatness(leaking, warmup_s=0.0)
    assert judged["rss"]["flat"] is False and judged["flat"] is False
    assert judged["db_connections"]["flat"] is True

    pool_growing = _samples([100 * MB] * 8, [4, 5, 5, 6, 8, 9, 10, 12])
    judged = soak.flatness(pool_growing, warmup_s=0.0)
    assert judged["db_connections"]["flat"] is False and judged["flat"] is False

    # SQLite: a sample counts the requests in flight. A burst up to one connection per server thread is no leak;
    # more than that, or a floor that rises, is.
    burst = _samples([100 * MB] * 8, [0, 0, 1, 0, 0, 9, 0, 1], threads=17)
    assert soak.flatness(burst, warmup_s=0.0)["flat"] is True
    beyond = _samples([100 * MB] * 8, [0, 0, 1, 0, 0, 25, 0, 1], threads=17)
    assert soak.flatness(beyond, warmup_s=0.0)["server_db_connections"]["flat"] is False
    floor = _samples([100 * MB] * 8, [0, 1, 0, 1, 4, 5, 4, 6], threads=17)
    assert soak.flatness(floor, warmup_s=0.0)["db_connections"]["flat"] is False

    # Samples taken during the warm-up are left out: a start-up climb is not a leak.
    climb = _samples([40 * MB, 70 * MB, 100 * MB, 100 * MB, 101 * MB, 100 * MB, 101 * MB, 101 * MB],
                     [1, 3, 6, 6, 6, 6, 6, 6])
    assert soak.flatness(climb, warmup_s=0.0)["flat"] is True  # the tolerance compares halves, not the start
    assert soak.flatness(climb, warmup_s=4.0)["samples"] == [3, 3]
    assert soak.flatness(climb[:3], warmup_s=0.0)["judged"] is False


@pytest.mark.e2e
def test_soak_on_a_real_platform():
    result = soak.measure(duration=20.0, rate=8.0, sample_s=1.5, warmup_s=5.0, drain_s=0.0, warm_job=False,
                          progress=print)
    print(soak.report(result))
    stats, jobs, flat = result["stats"], result["jobs"], result["flatness"]
    overall = stats["overall"]
    problems = stats["samples_error"] + stats["samples_unexpected"]

    assert overall["requests"] > 0
    assert all(stats["per_operation"][op]["requests"] > 0 for op in soak.MIX), stats["per_operation"]
    assert overall["error"] == 0, problems  # no 5xx, connection error or timeout
    assert overall["server_errors"] == overall["connection_errors"] == overall["timeouts"] == 0
    assert overall["unexpected"] == 0, problems  # no 4xx a call may not give; the other team's jobs are 404
    assert stats["per_operation"]["foreign_detail"]["statuses"].keys() <= {"404", "429"}
    assert stats["idempotent_replays"]["other_job"] == 0, problems

    # Every acknowledged submit is listed afterwards, under its own team.
    assert jobs["acknowledged"] > 0
    assert jobs["missing_count"] == 0, jobs["missing"]
    assert jobs["listed"] == jobs["acknowledged"] and jobs["wrong_team"] == 0
    assert jobs["finished"] > 0, jobs["states"]  # the node really ran them

    # The server's RSS and the database connections stay flat after the warm-up.
    assert flat["judged"], flat
    assert flat["rss"]["flat"], flat["rss"]
    assert flat["db_connections"]["flat"], flat["db_connections"]
    assert flat["server_db_connections"]["flat"], flat["server_db_connections"]
    assert result["rss"]["start"] > 0 and result["db_connections"]["max"] > 0

    doc = benchkit.document("soak", True, soak.figures(result), details=result)
    assert benchkit.validate_document(doc) == []
    assert doc["figures"]["jobs_listed"]["met"] is True
