"""The batching policies of components/serving/orloj.py: Orloj's empirical execution-time distributions, its batch
choice against a brute-force optimum on small queues, early answers for hopeless requests, and finish rates in
simulated time against Triton-style FIFO batching and EDF (seeded traces: exact, no wall-clock timing)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from components.serving.orloj import (
    EXACT_QUEUE,
    EdfBatcher,
    ExecProfile,
    FifoBatcher,
    OrlojBatcher,
    Pending,
    simulate,
)


def profile_with(runs: dict[tuple[int, int], list[float]]) -> ExecProfile:
    profile = ExecProfile()
    for (size, bucket), seconds in runs.items():
        for value in seconds:
            profile.observe(size, bucket, value)
    return profile


def test_the_profile_keeps_empirical_distributions_and_borrows_from_neighbours():
    ones = list(np.linspace(0.001, 0.003, 201))
    fours = list(np.linspace(0.004, 0.006, 201))
    profile = profile_with({(1, 0): ones, (4, 0): fours})
    assert profile.cdf(1, 0, 0.002) == pytest.approx(0.5, abs=0.05)
    assert profile.cdf(1, 0, 0.0005) == 0 and profile.cdf(1, 0, 0.01) == 1
    assert profile.mean(4, 0) == pytest.approx(0.005, abs=2e-4)
    # Between measured sizes: quantile by quantile, linearly; above: in proportion to the size.
    assert profile.mean(2, 0) == pytest.approx(0.002 + (0.005 - 0.002) / 3, abs=2e-4)
    assert profile.mean(8, 0) == pytest.approx(0.010, abs=5e-4)
    # A bucket never measured borrows the nearest lower one, scaled by the bucket ratio.
    assert profile.mean(1, 3) == pytest.approx(0.002 * 4, abs=3e-4)
    # A window: old runs fall out.
    small = ExecProfile(window=10)
    for value in [1.0] * 10 + [0.1] * 10:
        small.observe(1, 0, value)
    assert small.mean(1, 0) == pytest.approx(0.1)
    assert ExecProfile(prior_s=0.004).mean(3, 2) == pytest.approx(0.004)
    small.observe(1, 0, float("nan"))  # ignored
    assert small.runs(1, 0) == 10


def brute_force_value(policy: OrlojBatcher, batch, queue, now) -> float:
    """The objective written out directly: the batch's requests by the batch-time CDF at their slack, then the
    rest in deadline order, max_batch at a time, two batches ahead, each starting at the last one's mean end."""
    profile = policy.profile

    def cdf_sum(group, start):
        size, bucket = len(group), max(p.bucket for p in group)
        return sum(profile.cdf(size, bucket, p.deadline - start) for p in group)

    total = cdf_sum(batch, now)
    start = now + profile.mean(len(batch), max(p.bucket for p in batch))
    rest = sorted((p for p in queue if p not in batch), key=lambda p: (p.deadline, p.id))
    for index in range(2):
        chunk = rest[index * policy.max_batch:(index + 1) * policy.max_batch]
        if not chunk:
            break
        total += cdf_sum(chunk, start)
        start += profile.mean(len(chunk), max(p.bucket for p in chunk))
    return total


@pytest.mark.parametrize("seed", range(40))
def test_the_batch_choice_matches_a_brute_force_optimum(seed):
    rng = random.Random(seed)
    times = {(size, bucket): [rng.uniform(0.8, 1.2) * (0.002 + 0.0005 * size) * (1 + 3 * bucket)
                              for _ in range(40)] for size in (1, 2, 3) for bucket in (0, 1)}
    policy = OrlojBatcher(max_batch=3, profile=profile_with(times), drop_below=0.0)
    queue = [Pending(deadline=rng.uniform(0.002, 0.03), arrival=0.0, bucket=rng.choice([0, 1]), id=i)
             for i in range(rng.randint(1, EXACT_QUEUE))]
    decision = policy.decide(queue, now=0.0)
    best = max(brute_force_value(policy, subset, queue, 0.0)
               for size in range(1, 4) for subset in itertools.combinations(queue, size))
    assert brute_force_value(policy, decision.batch, queue, 0.0) == pytest.approx(best, abs=1e-9)
    assert 1 <= len(decision.batch) <= 3 and not decision.drop


def test_hopeless_requests_are_answered_early_and_the_rest_still_run():
    profile = profile_with({(1, 0): [0.010] * 20, (2, 0): [0.012] * 20})
    policy = OrlojBatcher(max_batch=4, profile=profile)
    doomed = Pending(deadline=0.005, arrival=0.0, id=1)  # needs 10 ms, has 5
    fine = Pending(deadline=0.050, arrival=0.0, id=2)
    decision = policy.decide([doomed, fine], now=0.0)
    assert decision.drop == [doomed] and decision.batch == [fine]


def test_orloj_keeps_long_inputs_out_of_a_batch_of_urgent_short_ones():
    """The longest input sets a batch's pace: two urgent short requests go without the long one."""
    profile = profile_with({(size, bucket): [(0.002 if bucket == 0 else 0.020) * (1 + 0.1 * size)] * 20
                            for size in (1, 2, 3) for bucket in (0, 3)})
    policy = OrlojBatcher(max_batch=4, profile=profile)
    short = [Pending(deadline=0.005, arrival=0.0, bucket=0, id=i) for i in range(2)]
    long = Pending(deadline=0.060, arrival=0.0, bucket=3, id=9)
    assert policy.decide([*short, long], now=0.0).batch == short
    # FIFO takes all three, and the short ones miss their deadlines.
    assert len(FifoBatcher(4, max_queue_delay_s=0.0).decide([*short, long], now=0.0).batch) == 3


def trace(seed: int, *, slo: float, dynamic: bool, count: int = 400, rate: float = 300.0):
    rng = random.Random(seed)
    now, arrivals = 0.0, []
    for _ in range(count):
        now += rng.expovariate(rate)
        bucket = (3 if rng.random() < 0.2 else 0) if dynamic else 0
        arrivals.append((now, now + slo, bucket))
    return arrivals


def run_time(seed: int):
    """A batch's true time: the longest input's per-row cost, growing with the batch, with noise."""
    rng = random.Random(seed + 1000)

    def run(batch):
        per_row = 0.002 if max(p.bucket for p in batch) == 0 else 0.016
        return (0.001 + per_row * (1 + 0.15 * (len(batch) - 1))) * rng.uniform(0.8, 1.2)

    return run


def finish_rate(make, *, slo, dynamic, seeds=range(2)):
    return float(np.mean([simulate(make(), trace(seed, slo=slo, dynamic=dynamic), run_time(seed)).finish_rate
                          for seed in seeds]))


def test_on_a_dynamic_model_orloj_finishes_more_requests_than_fifo_batching_and_edf():
    for slo in (0.02, 0.08):
        orloj = finish_rate(lambda: OrlojBatcher(8), slo=slo, dynamic=True)
        fifo = finish_rate(lambda: FifoBatcher(8, 0.002), slo=slo, dynamic=True)
        edf = finish_rate(lambda: EdfBatcher(8), slo=slo, dynamic=True)
        assert orloj >= 1.5 * fifo, (slo, orloj, fifo)
        assert orloj >= edf - 0.01, (slo, orloj, edf)


def test_on_a_static_model_orloj_is_no_worse_than_fifo_batching():
    for slo in (0.01, 0.04):
        orloj = finish_rate(lambda: OrlojBatcher(8), slo=slo, dynamic=False)
        fifo = finish_rate(lambda: FifoBatcher(8, 0.002), slo=slo, dynamic=False)
        assert orloj >= fifo - 0.01, (slo, orloj, fifo)


def test_every_request_is_answered_once_in_a_simulation():
    arrivals = trace(3, slo=0.01, dynamic=True, count=200)
    for policy in (OrlojBatcher(4), FifoBatcher(4), EdfBatcher(4)):
        outcome = simulate(policy, arrivals, run_time(3))
        assert outcome.on_time + outcome.late + outcome.dropped == outcome.requests == 200
        assert max(outcome.batch_sizes) <= 4 and sum(outcome.batch_sizes) == outcome.on_time + outcome.late


def test_fifo_waits_for_a_full_batch_at_most_its_queue_delay():
    policy = FifoBatcher(4, max_queue_delay_s=0.002)
    queue = [Pending(deadline=1.0, arrival=0.0, id=0), Pending(deadline=1.0, arrival=0.001, id=1)]
    waiting = policy.decide(queue, now=0.001)
    assert waiting.batch == [] and waiting.wake_at == pytest.approx(0.002)
    assert policy.decide(queue, now=0.002).batch == queue
    with pytest.raises(ValueError):
        FifoBatcher(0)


@pytest.mark.parametrize("seed", range(10))
def test_on_long_queues_the_choice_is_never_worse_than_any_deadline_ordered_batch(seed):
    rng = random.Random(seed)
    times = {(size, bucket): [rng.uniform(0.8, 1.2) * (0.002 + 0.0005 * size) * (1 + 3 * bucket)
                              for _ in range(20)] for size in range(1, 5) for bucket in (0, 1)}
    policy = OrlojBatcher(max_batch=4, profile=profile_with(times), drop_below=0.0)
    queue = [Pending(deadline=rng.uniform(0.002, 0.05), arrival=0.0, bucket=rng.choice([0, 1]), id=i)
             for i in range(12)]
    chosen = brute_force_value(policy, policy.decide(queue, now=0.0).batch, queue, 0.0)
    ordered = sorted(queue)
    assert all(chosen >= brute_force_value(policy, ordered[:size], queue, 0.0) - 1e-9 for size in range(1, 5))


@pytest.mark.parametrize("make", [lambda: OrlojBatcher(max_batch=4), lambda: EdfBatcher(max_batch=4)])
def test_before_any_batch_is_measured_the_prior_answers_nothing_early(make):
    """The prior (5 ms) is a guess: with 2-ms deadlines it would make every request hopeless, and a policy that
    answered all of them early would never measure a batch. Nothing is dropped until one has run."""
    policy = make()
    queue = [Pending(deadline=0.002, arrival=0.0, id=index) for index in range(3)]
    decision = policy.decide(queue, now=0.0)
    assert decision.drop == [] and decision.batch
    arrivals = [(index * 0.004, index * 0.004 + 0.002, 0) for index in range(50)]
    outcome = simulate(make(), arrivals, lambda batch: 0.001)
    assert outcome.dropped == 0 and outcome.on_time == 50
