import pytest

from components.gpushare.policies import JobView, get_policy


def view(job_id, arrival, **fields):
    return JobView(job_id, arrival, **fields)


def test_pack_is_round_robin_by_least_recently_run():
    pack = get_policy("pack")
    jobs = [view("a", 1, last_run=7), view("b", 2, last_run=3), view("c", 3, last_run=5)]
    assert pack.pick(jobs).job_id == "b"
    assert [job.job_id for job in pack.order(jobs)] == ["b", "c", "a"]
    fresh = [view("a", 1, last_run=0), view("new", 9)]  # never ran: goes first
    assert pack.pick(fresh).job_id == "new"


def test_srtf_picks_the_least_remaining_time():
    srtf = get_policy("srtf")
    jobs = [
        view("long", 1, remaining_steps=100, step_time=0.01),  # 1.0 s left
        view("short-steps-slow", 2, remaining_steps=10, step_time=0.2),  # 2.0 s left
        view("short", 3, remaining_steps=50, step_time=0.01),  # 0.5 s left
    ]
    assert srtf.pick(jobs).job_id == "short"
    # An unmeasured job is costed at the measured jobs' mean step time (0.01 s here): 30 steps = 0.3 s.
    assert srtf.pick([*jobs[:1], view("unmeasured", 4, remaining_steps=30)]).job_id == "unmeasured"
    # Unknown remaining steps go last; ties go by arrival.
    assert srtf.pick([view("unknown", 1), view("known", 2, remaining_steps=10**6)]).job_id == "known"
    assert srtf.pick([view("b", 2, remaining_steps=5), view("a", 1, remaining_steps=5)]).job_id == "a"


def test_fair_is_least_attained_service_per_weight():
    fair = get_policy("fair")
    jobs = [view("a", 1, attained=1.0, weight=1.0), view("b", 2, attained=1.5, weight=2.0)]
    assert fair.pick(jobs).job_id == "b"  # 0.75 < 1.0
    # A newcomer starts at the fair clock of its admission instead of zero.
    jobs = [view("old", 1, attained=50.0), view("new", 2, attained=0.0, virtual_start=50.5)]
    assert fair.pick(jobs).job_id == "old"


def test_priority_is_strict_and_fifo_within_a_level():
    priority = get_policy("priority")
    jobs = [view("low-early", 1, priority=0), view("high-late", 5, priority=3), view("high-early", 4, priority=3)]
    assert priority.pick(jobs).job_id == "high-early"
    assert [job.job_id for job in priority.order(jobs)] == ["high-early", "high-late", "low-early"]


def test_fifo_and_lookup():
    assert get_policy("fifo").pick([view("b", 2), view("a", 1)]).job_id == "a"
    assert get_policy("PACK").name == "pack"
    assert get_policy("srtf").pick([]) is None
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("lottery")
