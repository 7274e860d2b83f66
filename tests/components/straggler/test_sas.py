"""SAS's decision logic (components/straggler/sas.py): the resource matrix, KMeans groups, P(adequate), the
expected completion time, and the choice among groups."""

from __future__ import annotations

import math

import numpy as np
import pytest

from components.straggler import sas
from components.straggler.availability import AvailabilityPredictor

DEMAND = [0.3, 0.3, 0.3]


def steady_and_bursty():
    """6 nodes: 0-2 steady and highly available, 3-5 about as available on average but bursty."""
    predicted = np.array([[0.85, 0.9, 0.88], [0.86, 0.91, 0.9], [0.84, 0.9, 0.87],
                          [0.8, 0.92, 0.9], [0.78, 0.95, 0.86], [0.82, 0.9, 0.91]])
    std = np.array([[0.03, 0.02, 0.03]] * 3 + [[0.3, 0.25, 0.3]] * 3)
    return predicted, std


def test_sas_picks_the_steady_group_for_a_gang():
    predicted, std = steady_and_bursty()
    labels = sas.group(predicted, std)
    assert len(set(labels[:3].tolist())) == 1 and len(set(labels[3:].tolist())) == 1
    assert labels[0] != labels[3]
    decision = sas.decide(predicted, std, DEMAND, workers=3)
    assert sorted(decision.placement) == [0, 1, 2]
    assert decision.group == labels[0] and decision.confident and decision.p_adequate > 0.99
    bursty = next(score for score in decision.groups if score.group == labels[3])
    assert bursty.p_adequate < sas.THETA < decision.p_adequate
    assert decision.latency_s >= 0


def test_sas_picks_steady_nodes_from_forecasts_of_their_histories():
    """End to end: the predictor's forecasts of steady and bursty histories, then SAS."""
    rng = np.random.default_rng(3)
    histories = []
    for node in range(6):
        level = 0.85 + 0.02 * node
        x = level + rng.normal(0, 0.01, 400)
        if node >= 3:  # bursty: a deep burst every ~50 samples, one going on now
            for start in range(10 + node, 400, 50):
                x[start:start + 15] *= 0.3
        histories.append({"cpu": np.clip(x, 0, 1)})
    predictor = AvailabilityPredictor(resources=("cpu",), horizon_s=20, interval_s=1, history=400)
    assert predictor.fit(histories)
    forecasts = predictor.predict_many(histories)
    predicted, std = sas.matrix([{"predicted": f.predicted, "std": f.std} for f in forecasts], ("cpu",))
    assert std[3:].min() > 2 * std[:3].max()
    decision = sas.decide(predicted, std, [0.5], workers=3)
    assert sorted(decision.placement) == [0, 1, 2]


def test_the_faster_group_wins_among_confident_ones_else_the_most_likely():
    predicted = np.array([[0.6, 0.6], [0.6, 0.6], [0.95, 0.95], [0.95, 0.95]])
    std = np.full((4, 2), 0.02)
    labels = [0, 0, 1, 1]
    decision = sas.choose(predicted, std, labels, [0.8, 0.8], workers=2)
    assert decision.group == 1 and decision.confident  # only group 1 keeps up with 0.8
    # both keep up with 0.5 at full speed: equal times, then the more likely group
    decision = sas.choose(predicted, std, labels, [0.5, 0.5], workers=2)
    assert decision.group == 1 and decision.confident
    # nobody keeps up with 0.99: the most likely group, not confident
    decision = sas.choose(predicted, std, labels, [0.99, 0.99], workers=2)
    assert decision.group == 1 and not decision.confident and decision.p_adequate < sas.THETA
    # both confident: group 0 is more likely (P 0.83 against 0.81) but group 1 is faster (its pessimistic
    # forecast, one std below the mean, is higher): the faster wins
    decision = sas.choose(np.array([[0.95], [0.75]]), np.array([[0.25], [0.045]]), [0, 1], [0.71], workers=1)
    first, second = decision.groups
    assert first.p_adequate > second.p_adequate >= sas.THETA and second.speed > first.speed
    assert decision.group == 1 and decision.placement == [1]
    wide = np.array([[0.95, 0.95], [0.95, 0.95], [0.9, 0.9], [0.9, 0.9]])
    spread = np.array([[0.4, 0.4], [0.4, 0.4], [0.01, 0.01], [0.01, 0.01]])
    decision = sas.choose(wide, spread, labels, [0.7, 0.7], workers=2)
    assert decision.group == 1  # slightly lower but certain beats higher but unreliable


def test_expected_time_is_the_slowest_used_node():
    predicted = np.array([[0.9], [0.45], [0.3]])
    std = np.full((3, 1), 0.001)
    decision = sas.choose(predicted, std, [0, 0, 0], [0.9], workers=2, risk=0.0, base_time=100.0)
    assert sorted(decision.placement) == [0, 1]
    assert decision.expected_time == pytest.approx(100.0 / 0.5)


def test_free_slots_and_shared_resources_bound_the_placement():
    predicted = np.array([[0.9, 0.9], [0.5, 0.5]])
    std = np.full((2, 2), 0.01)
    decision = sas.choose(predicted, std, [0, 0], [0.2, 0.8], workers=3, free=[2, 2], shared=[True, False])
    assert sorted(decision.placement) == [0, 0, 1]  # at most 2 on a node
    # the own (per-worker) resource does not add up; the shared one does
    after = sas.totals(np.zeros((1, 2)), np.array([0.2, 0.8]), 3, np.array([True, False]))
    assert after.tolist() == [[pytest.approx(0.6), 0.8]]
    loaded = sas.choose(predicted, std, [0, 0], [0.3, 0.1], workers=1, free=[4, 4],
                        load=np.array([[0.8, 0.0], [0.0, 0.0]]))
    assert loaded.placement == [1]  # node 0 is already busy with other workers


def test_a_gang_bigger_than_every_group_takes_the_nodes_as_one_group():
    predicted, std = steady_and_bursty()
    decision = sas.decide(predicted, std, DEMAND, workers=5)
    assert decision.group == -1 and len(decision.placement) == 5 and len(set(decision.placement)) == 5
    assert sas.decide(predicted, std, DEMAND, workers=7).placement == []  # no room anywhere
    empty = sas.decide(np.zeros((0, 3)), np.zeros((0, 3)), DEMAND, workers=1)
    assert empty.group is None and empty.placement == []


def test_grouping_is_deterministic_and_degenerate_inputs_are_one_group():
    rng = np.random.default_rng(0)
    predicted, std = rng.random((40, 3)), rng.random((40, 3)) * 0.2
    assert sas.group(predicted, std).tolist() == sas.group(predicted.copy(), std.copy()).tolist()
    assert len(set(sas.group(predicted, std, k=3).tolist())) == 3
    assert sas.group(predicted[:2], std[:2]).tolist() == [0, 0]
    same = np.tile([0.8, 0.8, 0.8], (10, 1))
    assert sas.group(same, same * 0.1).tolist() == [0] * 10


def test_p_adequate_falls_as_the_demand_rises():
    predicted, std = steady_and_bursty()
    labels = [0] * 6
    p = [sas.choose(predicted, std, labels, [d] * 3, workers=2).p_adequate for d in (0.2, 0.6, 0.8, 0.9)]
    assert p == sorted(p, reverse=True) and p[0] > 0.99 and p[-1] < 0.05


def test_the_matrix_reads_node_payloads_and_tolerates_gaps():
    predicted, std = sas.matrix([{"predicted": {"cpu": 0.5, "gpu": 2.0}, "std": {"cpu": 0.1}},
                                 {"predicted": {"cpu": math.nan}, "std": {}}, {}], ("cpu", "gpu"))
    assert predicted.tolist() == [[0.5, 1.0], [1.0, 1.0], [1.0, 1.0]]
    assert std[0, 0] == pytest.approx(0.1) and std.min() > 0


def test_loss_rate_shrinks_toward_the_cluster_mean():
    """Gamma-Poisson: a node never lost is not taken as safe at once; more watching separates the nodes."""
    losses = np.array([0.0, 0.0, 4.0, 0.0])
    short, long = sas.loss_rate(losses, 3600.0), sas.loss_rate(losses * 10, 36000.0)
    mean = losses.sum() / len(losses) / 3600.0
    assert short[0] == pytest.approx(1.0 / (3600.0 + 1.0 / mean))
    assert short[0] < mean < short[2] < 4.0 / 3600.0  # shrunk toward the mean from both sides
    assert long[2] / long[0] > short[2] / short[0]  # the same rates, watched 10x longer: told apart better
    assert sas.loss_rate(losses, 0.0).tolist() == [0.0] * 4
    pooled = sas.loss_rate(losses, 3600.0, pools=[0, 1, 1, 0])  # a pool's nodes share their counts
    assert pooled[1] == pooled[2] == pytest.approx(5.0 / (2 * 3600.0 + 1.0 / mean))
    assert pooled[0] == pooled[3] == pytest.approx(1.0 / (2 * 3600.0 + 1.0 / mean))
    assert pooled[0] < short[0]
    assert sas.loss_probability(np.array([0.0, 1 / 3600.0]), 3600.0) == pytest.approx([0.0, 1 - math.exp(-1)])


def test_a_gang_avoids_nodes_that_are_often_lost():
    """Four equally available nodes, two of them lost often (spot): a 2-worker gang goes to the other two,
    and its P(adequate) and expected time account for the loss rate."""
    predicted = np.full((4, 3), 0.8)
    std = np.full((4, 3), 0.02)
    hazard = np.array([1 / 1800.0, 0.0, 1 / 1800.0, 0.0])
    labels = np.zeros(4, dtype=int)
    safe = sas.choose(predicted, std, labels, DEMAND, workers=2, hazard=hazard, loss_s=900.0, base_time=600.0)
    assert sorted(safe.placement) == [1, 3]
    blind = sas.choose(predicted, std, labels, DEMAND, workers=2, base_time=600.0)
    assert sorted(blind.placement) == [0, 1]  # without the rates: ties go to the lower index
    risky = sas.choose(predicted[[0, 2]], std[[0, 2]], [0, 0], DEMAND, workers=2, hazard=hazard[[0, 2]],
                       loss_s=900.0, base_time=600.0)
    assert risky.p_adequate == pytest.approx(blind.p_adequate * math.exp(-2 / 1800.0 * 600.0), rel=1e-6)
    assert risky.expected_time == pytest.approx(600.0 * (1 + 2 / 1800.0 * 900.0))
    grouped = sas.group(predicted, std, extra=sas.loss_probability(hazard, 1200.0))
    assert grouped[0] == grouped[2] != grouped[1] == grouped[3]
