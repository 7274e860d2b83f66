"""The lane allocator: admission never oversubscribes the budget, and whoever fits alone gets in."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.gpushare.lanes import LaneAllocator, MemoryRequest, parse_bytes

BUDGET = 1000


def request(p: int, e: int) -> MemoryRequest:
    return MemoryRequest(p, e)


# -- properties --------------------------------------------------------------------------------------------

arrivals = st.tuples(
    st.just("arrive"),
    st.integers(0, 700),  # persistent
    st.integers(0, 700),  # ephemeral
    st.integers(0, 2),  # priority
    st.sampled_from([False, False, False, True]),  # exclusive (an inference endpoint), now and then
)
departures = st.tuples(st.just("depart"), st.integers(0, 10**6))
separations = st.tuples(st.just("separate"), st.integers(0, 10**6))
resizes = st.tuples(st.just("resize"), st.integers(0, 10**6), st.integers(0, 700), st.integers(0, 700))
operations = st.lists(st.one_of(arrivals, arrivals, departures, separations, resizes), max_size=60)


def replay(ops, budget, max_lanes, max_bypass):
    """Apply ``ops``; check the invariants after each; return the allocator and what happened."""
    allocator = LaneAllocator(budget, max_lanes=max_lanes, max_bypass=max_bypass)
    ever_admitted: set[str] = set()
    fitting: set[str] = set()
    log = []
    for number, op in enumerate(ops):
        if op[0] == "arrive":
            _, p, e, priority, exclusive = op
            job = f"job{number}"
            answer = allocator.request(job, request(p, e), priority, exclusive=exclusive)
            log.append(answer)
            if p + e > budget:
                assert answer.status == "rejected"
            else:
                fitting.add(job)
                assert answer.status in ("admitted", "waiting")
                if answer.admitted:
                    ever_admitted.add(job)
            for other in answer.also_admitted:
                assert other.job_id in allocator.admitted
                ever_admitted.add(other.job_id)
        elif op[0] == "resize":
            admitted = sorted(allocator.admitted)
            if admitted:
                job = admitted[op[1] % len(admitted)]
                before = allocator.snapshot()
                ok, answers = allocator.resize(job, request(op[2], op[3]))
                if ok:
                    assert allocator.admitted[job] == request(op[2], op[3])
                    ever_admitted.update(answer.job_id for answer in answers)
                else:
                    assert allocator.snapshot() == before and answers == []
        elif op[0] == "separate":
            admitted = sorted(allocator.admitted)
            if admitted:
                job = admitted[op[1] % len(admitted)]
                before = allocator.snapshot()
                if allocator.separate(job):
                    assert allocator.lane_mates(job) == []
                else:
                    assert allocator.snapshot() == before
        else:
            admitted = sorted(allocator.admitted)
            if not admitted:
                continue
            for answer in allocator.release(admitted[op[1] % len(admitted)]):
                ever_admitted.add(answer.job_id)
                log.append(answer)
        allocator.check()
        assert allocator.persistent_total + sum(lane.size for lane in allocator.lanes) <= budget
        for lane in allocator.lanes:  # every admitted job's iteration fits its lane
            for job in lane.jobs:
                assert allocator.admitted[job].ephemeral <= lane.size
    return allocator, ever_admitted, fitting, log


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, max_lanes=st.none() | st.integers(1, 3), max_bypass=st.integers(0, 4))
def test_admitted_memory_never_exceeds_the_budget_and_every_fitting_job_gets_in(ops, max_lanes, max_bypass):
    allocator, ever_admitted, fitting, _ = replay(ops, BUDGET, max_lanes, max_bypass)
    # Departures continue until nobody waits: each fitting job must eventually be admitted.
    while allocator.waiting:
        admitted = sorted(allocator.admitted)
        assert admitted, f"{allocator.waiting} wait on an empty device"
        for answer in allocator.release(admitted[0]):
            ever_admitted.add(answer.job_id)
        allocator.check()
    assert fitting <= ever_admitted
    for job in list(allocator.admitted):
        allocator.release(job)
    assert allocator.reserved == 0 and allocator.lanes == []


@settings(max_examples=50, deadline=None)
@given(ops=operations, max_lanes=st.none() | st.integers(1, 3))
def test_admission_is_deterministic(ops, max_lanes):
    first = replay(ops, BUDGET, max_lanes, 3)
    second = replay(ops, BUDGET, max_lanes, 3)
    assert first[0].snapshot() == second[0].snapshot()
    assert first[3] == second[3]


# -- rules --------------------------------------------------------------------------------------------------

def test_jobs_share_a_lane_that_fits_and_open_new_lanes_otherwise():
    allocator = LaneAllocator(BUDGET)
    assert allocator.request("a", request(100, 200)).lane == 0
    assert allocator.request("b", request(100, 150)).lane == 0  # fits lane 0: shares it
    assert allocator.request("c", request(100, 300)).lane == 1  # too big for lane 0: a new lane
    assert allocator.reserved == 300 + 200 + 300
    assert allocator.free == 200
    # No room for a new 150 lane plus 100: it joins the smallest lane that fits.
    assert allocator.request("d", request(50, 150)).lane == 0
    allocator.check()


def test_a_job_grows_a_lane_when_no_new_lane_fits():
    allocator = LaneAllocator(BUDGET)
    allocator.request("a", request(300, 300))
    answer = allocator.request("b", request(100, 400))  # new lane needs 500 > 400 free; growing needs 200
    assert answer.lane == 0
    assert allocator.lanes[0].size == 400
    allocator.check()


def test_exclusive_jobs_get_a_lane_of_their_own():
    allocator = LaneAllocator(BUDGET)
    allocator.request("train", request(100, 300))
    assert allocator.request("serve", request(50, 100), exclusive=True).lane == 1
    assert allocator.request("other", request(50, 100)).lane == 0  # never joins the exclusive lane
    allocator.check()


def test_a_job_that_can_never_fit_is_rejected():
    allocator = LaneAllocator(BUDGET)
    answer = allocator.request("huge", request(600, 500))
    assert answer.status == "rejected"
    assert "budget" in answer.reason
    assert allocator.waiting == []


def test_a_waiting_job_is_admitted_when_others_leave_and_lanes_are_compacted():
    allocator = LaneAllocator(BUDGET)
    allocator.request("a", request(200, 400))
    allocator.request("b", request(100, 100))  # shares a's lane
    waiting = allocator.request("c", request(500, 200))
    assert waiting.status == "waiting" and waiting.position == 0
    admitted = allocator.release("a")  # the lane shrinks from 400 to b's 100
    assert [answer.job_id for answer in admitted] == ["c"]
    # With room for it, c gets a lane of its own (lanes may have iterations in flight together).
    assert [(lane.size, lane.jobs) for lane in allocator.lanes] == [(100, ["b"]), (200, ["c"])]
    allocator.check()


def test_priority_orders_the_queue_and_backfill_is_limited():
    allocator = LaneAllocator(BUDGET, max_bypass=1)
    allocator.request("big-running", request(500, 400))
    allocator.request("big-waiting", request(500, 400))  # does not fit: waits
    allocator.request("urgent", request(450, 400), priority=5)  # waits, ahead of big-waiting
    assert allocator.waiting == ["urgent", "big-waiting"]
    assert allocator.request("small", request(10, 10)).admitted  # backfilled past the blocked head
    assert allocator.request("small-2", request(10, 10)).status == "waiting"  # the head was bypassed once
    allocator.release("big-running")
    assert "urgent" in allocator.admitted


def test_resize_grows_in_place_moves_or_refuses():
    allocator = LaneAllocator(BUDGET)
    allocator.request("a", request(100, 100))
    allocator.request("b", request(100, 100))
    ok, _ = allocator.resize("a", request(100, 300))  # the shared lane grows to 300
    assert ok and allocator.lanes[0].size == 300
    ok, _ = allocator.resize("b", request(900, 100))
    assert not ok and allocator.admitted["b"] == request(100, 100)  # unchanged
    ok, admitted = allocator.resize("a", request(50, 50))
    assert ok and allocator.lanes[0].size == 100 and admitted == []
    allocator.check()


def test_memory_requests():
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("1.5 MB") == 1_500_000
    assert parse_bytes(1024) == 1024
    with pytest.raises(ValueError):
        parse_bytes("lots")
    with pytest.raises(ValueError):
        MemoryRequest(-1, 0)
    assert MemoryRequest.from_limit("1KiB") == MemoryRequest(1024, 0)
    assert MemoryRequest.from_limit("1KiB", persistent=24) == MemoryRequest(24, 1000)
    assert MemoryRequest(10, 20).with_headroom(0.5) == MemoryRequest(15, 30)
    assert MemoryRequest(10, 0).union(MemoryRequest(0, 5)) == MemoryRequest(10, 5)


def test_a_request_reports_the_other_jobs_it_lets_in():
    # Found by the property test: a higher-priority arrival that does not fit becomes the blocked head, so a
    # job held back by the previous head's bypass limit gets backfilled by this request.
    allocator = LaneAllocator(BUDGET, max_bypass=1)
    allocator.request("running", request(384, 389))
    assert allocator.request("blocked", request(228, 0)).status == "waiting"
    assert allocator.request("backfilled", request(0, 0)).admitted
    assert allocator.request("held-back", request(0, 0)).status == "waiting"  # bypass limit reached
    answer = allocator.request("urgent", request(0, 617), priority=1)
    assert answer.status == "waiting"
    assert [other.job_id for other in answer.also_admitted] == ["held-back"]
    assert "held-back" in allocator.admitted


def test_separate_gives_a_job_its_own_lane_when_memory_allows():
    allocator = LaneAllocator(BUDGET)
    allocator.request("a", request(100, 300))
    allocator.request("b", request(100, 200))  # shares a's lane
    assert allocator.separate("b")
    assert [(lane.size, lane.jobs) for lane in allocator.lanes] == [(300, ["a"]), (200, ["b"])]
    assert allocator.separate("b")  # already alone
    allocator.request("c", request(250, 100))  # joins the smallest fitting lane: b's
    assert allocator.lane_mates("c") == ["b"]
    assert not allocator.separate("c")  # 100 more bytes of lane do not fit in the 50 left
    assert allocator.lane_mates("c") == ["b"]
    allocator.check()
