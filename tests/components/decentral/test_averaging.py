"""The guard on averaged updates, and the guarded reducer of hivemind's butterfly all-reduce."""

from __future__ import annotations

import asyncio

import pytest
import torch

from components.decentral.averaging import UpdateGuard, guarded_reducer_class
from components.decentral.peer import Deadlines


def test_guard_accepts_honest_drift_and_refuses_nan_and_huge_updates():
    guard = UpdateGuard(max_ratio=10.0)
    local = torch.randn(1000)
    assert guard.check(local + 0.01 * torch.randn(1000), local) is None
    nan = local.clone()
    nan[3] = float("nan")
    assert "non-finite" in guard.check(nan, local)
    assert "non-finite" in guard.check(local + torch.tensor(float("inf")), local)
    huge = local + 1e6 * 0.01 * torch.randn(1000)
    assert "out of scale" in guard.check(huge, local)
    assert "shape" in guard.check(torch.zeros(10), local)
    # A part that starts at zero (a bias) drifts apart by a few hundredths per value between honest peers.
    bias = torch.zeros(64)
    assert guard.check(bias + 0.05 * torch.randn(64), bias + 0.01 * torch.randn(64)) is None
    assert "out of scale" in guard.check(bias + 1e6 * 0.003 * torch.randn(64), bias)
    assert guard.check_delta(torch.zeros(1000), local) is None
    assert "out of scale" in guard.check_delta(1e6 * torch.ones(1000), local)


def test_guarded_reducer_averages_only_good_senders():
    reducer_class = guarded_reducer_class()
    rejected = []
    reference = (torch.ones(4), torch.ones(4))

    async def scenario():
        reducer = reducer_class((torch.Size([4]), torch.Size([4])), 3, reference=reference,
                                guard=UpdateGuard(10.0), on_reject=lambda index, problem: rejected.append(index))
        good = [asyncio.create_task(reducer.accumulate_part(i, 0, torch.full((4,), 1.0 + i))) for i in (0, 1)]
        bad = asyncio.create_task(reducer.accumulate_part(2, 0, torch.full((4,), float("nan"))))
        done = await asyncio.gather(*good, bad, return_exceptions=True)
        return done

    first, second, bad = asyncio.run(scenario())
    assert torch.allclose(first, torch.full((4,), 1.5)) and torch.allclose(second, first)
    assert isinstance(bad, Exception) and "bad update" in str(bad)
    assert rejected == [2]


def test_deadlines_follow_measured_speed():
    deadlines = Deadlines(period_s=10.0)
    fast = deadlines.update([0.05, 0.06], model_bytes=1_000_000, peers=3).as_dict()
    slow = Deadlines(period_s=10.0).update([2.0, 2.5], model_bytes=1_000_000, peers=3).as_dict()
    assert slow["lead_s"] > fast["lead_s"]
    deadlines.recent_rounds.extend([0.2, 0.3, 0.25])
    quick = deadlines.update([0.05], 1_000_000, 3).allreduce_timeout_s
    deadlines.recent_rounds.extend([4.0] * 8)
    assert deadlines.update([0.05], 1_000_000, 3).allreduce_timeout_s > quick
    assert deadlines.allreduce_timeout_s <= 40.0  # clamped to four periods


@pytest.mark.parametrize("mode", ["nan", "scale"])
def test_corrupted_contributions(mode):
    from components.decentral.peer import PeerConfig, SwarmPeer

    peer = SwarmPeer(PeerConfig(job="j", name="x", public_key="00", corrupt={"mode": mode, "factor": 1e6}),
                     io=None, workdir="/tmp/strata-test-peer")
    snapshot = [torch.ones(5)]
    bad = peer._corrupted(snapshot)[0]
    guard = UpdateGuard(10.0)
    assert guard.check(bad, snapshot[0]) is not None
