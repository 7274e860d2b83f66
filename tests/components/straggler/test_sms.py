"""SMS pieces in one process: the predictor, batch shrinking (unbiasedness), gradient transfer control (error
feedback conserves mass), the strategy's options, and the runtime's step, report and checkpoint on a gang of one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from components.runtime.contract.distributed import ring_allreduce_bytes
from components.runtime.node.gang import Gang
from components.straggler.sms import (
    GradientControl,
    SMSRuntime,
    StragglerPredictor,
    batch_features,
    near_duplicate_clusters,
    pick_representatives,
    shrink_batch,
)
from components.straggler.strategies import SMS_DEFAULTS, SMSStrategy


def duplicated_batch(seed: int = 0, distinct: int = 8, copies: int = 4, noise: float = 1e-4, dims: int = 64):
    rng = torch.Generator().manual_seed(seed)
    base = torch.randn(distinct, dims, generator=rng)
    inputs = base.repeat_interleave(copies, dim=0)
    if noise:
        inputs = inputs + noise * torch.randn(inputs.shape, generator=rng)
    targets = torch.arange(distinct).remainder(3).repeat_interleave(copies)
    order = torch.randperm(len(inputs), generator=rng)
    return inputs[order], targets[order], torch.arange(distinct).repeat_interleave(copies)[order]


# -- dedup -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9])
def test_dedup_keeps_one_sample_per_near_duplicate_cluster(keep):
    inputs, targets, group = duplicated_batch()
    for seed in range(5):
        rng = torch.Generator().manual_seed(seed)
        labels = near_duplicate_clusters(batch_features(inputs, targets), math.ceil(keep * 32), rng)
        assert int(labels.max()) + 1 == 8
        for cluster in range(8):  # each cluster is exactly one group of copies
            assert len(set(group[labels == cluster].tolist())) == 1
        kept_inputs, kept_targets, weights, dropped = shrink_batch(inputs, targets, keep, rng)
        assert len(kept_targets) == 8 and dropped == 24
        assert weights.tolist() == [4.0] * 8
        kept_groups = [int(group[(inputs == row).all(dim=1)][0]) for row in kept_inputs]
        assert sorted(kept_groups) == list(range(8))


def test_dedup_reaches_the_requested_size_on_distinct_samples():
    rng = torch.Generator().manual_seed(1)
    inputs, targets = torch.rand(64, 64, generator=rng), torch.randint(0, 10, (64,), generator=rng)
    for keep in (0.25, 0.5, 0.75):
        kept_inputs, kept_targets, weights, dropped = shrink_batch(inputs, targets, keep, rng)
        k = math.ceil(keep * 64)
        assert len(kept_targets) == len(kept_inputs) == 64 - dropped
        assert k // 2 <= len(kept_targets) <= k  # Lloyd may empty a few clusters, never adds any
        assert float(weights.sum()) == 64.0
    same = shrink_batch(inputs, targets, 1.0, rng)
    assert same[0] is inputs and same[3] == 0 and same[2].tolist() == [1.0] * 64


def test_clusters_do_not_mix_classes_when_k_allows():
    rng = torch.Generator().manual_seed(2)
    inputs = torch.rand(64, 64, generator=rng)
    targets = torch.randint(0, 4, (64,), generator=rng)
    labels = near_duplicate_clusters(batch_features(inputs, targets), 16, rng)
    for cluster in range(int(labels.max()) + 1):
        assert len(set(targets[labels == cluster].tolist())) == 1


def test_seeded_shrink_is_deterministic():
    rng = torch.Generator().manual_seed(3)
    inputs, targets = torch.rand(48, 20, generator=rng), torch.randint(0, 5, (48,), generator=rng)
    first = shrink_batch(inputs, targets, 0.4, torch.Generator().manual_seed(7))
    second = shrink_batch(inputs, targets, 0.4, torch.Generator().manual_seed(7))
    assert torch.equal(first[0], second[0]) and torch.equal(first[2], second[2]) and first[3] == second[3]


def weighted_gradient(model, inputs, targets, weights=None):
    model.zero_grad(set_to_none=True)
    logits = model(inputs)
    if weights is None:
        loss = F.cross_entropy(logits, targets)
    else:  # the ClassificationWorkload.backward weighted mean
        loss = (F.cross_entropy(logits, targets, reduction="none") * weights).sum() / weights.sum()
    loss.backward()
    return torch.cat([param.grad.reshape(-1) for param in model.parameters()]).clone()


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def per_sample_gradients(model, inputs, targets):
    return torch.stack([weighted_gradient(model, inputs[row: row + 1], targets[row: row + 1])
                        for row in range(len(targets))])


def assert_unbiased(model, inputs, targets, keep, rng, prior=None, draws=4000):
    """The mean over many random shrinks of the weighted-batch gradient is the full-batch gradient, within 5
    standard errors per coordinate (a false alarm has probability ~6e-7 per coordinate, ~1e-4 in all).

    A draw's gradient is computed from per-sample gradients (the weighted mean loss's gradient is the weighted
    mean of theirs), checked against a real backward on the shrunk batch for the first draws."""
    full = weighted_gradient(model, inputs, targets, prior)
    singles = per_sample_gradients(model, inputs, targets)
    rows_of = {tuple(row.tolist()): index for index, row in enumerate(inputs)}
    estimates = []
    for draw in range(draws):
        kept_inputs, kept_targets, weights, dropped = shrink_batch(inputs, targets, keep, rng, prior)
        assert 0 < dropped < len(targets)
        rows = torch.tensor([rows_of[tuple(row.tolist())] for row in kept_inputs])
        estimate = (weights.double().unsqueeze(1) * singles[rows]).sum(dim=0) / weights.double().sum()
        if draw < 5:
            assert torch.allclose(estimate, weighted_gradient(model, kept_inputs, kept_targets, weights.double()),
                                  atol=1e-10)
        estimates.append(estimate)
    samples = torch.stack(estimates)
    error = (samples.mean(dim=0) - full).abs()
    standard_error = samples.std(dim=0) / math.sqrt(draws)
    assert bool((error <= 5 * standard_error + 1e-10).all()), float((error / (standard_error + 1e-12)).max())
    assert float(samples.std(dim=0).max()) > 1e-3  # shrinking does add variance: the check is not vacuous


def test_shrunk_batch_gradient_is_unbiased():
    model = small_model()
    rng = torch.Generator().manual_seed(4)
    inputs = torch.randn(32, 12, generator=rng, dtype=torch.float64)
    targets = torch.randint(0, 4, (32,), generator=rng)
    assert_unbiased(model, inputs, targets, 0.25, rng)


def test_shrunk_batch_gradient_is_unbiased_with_prior_weights():
    model = small_model()
    rng = torch.Generator().manual_seed(5)
    inputs = torch.randn(24, 12, generator=rng, dtype=torch.float64)
    targets = torch.randint(0, 4, (24,), generator=rng)
    prior = torch.rand(24, generator=rng, dtype=torch.float64) + 0.5
    assert_unbiased(model, inputs, targets, 0.3, rng, prior)


def test_shrunk_batch_gradient_is_exact_on_exact_duplicates():
    model = small_model()
    inputs, targets, _ = duplicated_batch(seed=6, noise=0.0, dims=12)
    inputs = inputs.double()
    full = weighted_gradient(model, inputs, targets)
    for seed in range(10):
        shrunk = shrink_batch(inputs, targets, 0.5, torch.Generator().manual_seed(seed))
        assert shrunk[3] == 24
        assert torch.allclose(weighted_gradient(model, *shrunk[:3]), full, rtol=0, atol=1e-12)


def test_pick_representatives_draws_uniformly_within_a_cluster():
    labels = torch.tensor([0, 0, 0, 0, 1, 1])
    rng = torch.Generator().manual_seed(8)
    counts = torch.zeros(6)
    for _ in range(4000):
        rows, mass = pick_representatives(labels, rng)
        assert mass.tolist() == [4.0, 2.0]
        counts[rows] += 1
    assert torch.allclose(counts[:4] / 4000, torch.full((4,), 0.25), atol=0.04)
    assert torch.allclose(counts[4:] / 4000, torch.full((2,), 0.5), atol=0.04)


# -- gradient transfer control ---------------------------------------------------------------------------------------
def run_ranks(controls, gradients):
    """One step of several simulated ranks: MAX of the flags, SUM of the payloads."""
    own = [control.flags(grad) for control, grad in zip(controls, gradients, strict=True)]
    agreed = torch.stack(own).max(dim=0).values
    packed = [control.pack(agreed) for control in controls]
    total = torch.stack([payload for _, payload in packed]).sum(dim=0)
    return [control.unpack(chosen, total.clone()) for control, (chosen, _) in zip(controls, packed, strict=True)]


@pytest.mark.parametrize("world", [1, 3])
def test_error_feedback_conserves_gradient_mass(world):
    numel, steps = 1000, 60
    controls = [GradientControl(numel, world, eps=0.5, chunk=64) for _ in range(world)]
    rng = torch.Generator().manual_seed(9)
    drift = torch.randn(numel, generator=rng, dtype=torch.float64)
    applied_sum = torch.zeros(numel, dtype=torch.float64)
    mean_sum = torch.zeros(numel, dtype=torch.float64)
    for step in range(steps):
        grads = [(drift + 0.2 * torch.randn(numel, generator=rng, dtype=torch.float64)).float() for _ in range(world)]
        applied = run_ranks(controls, grads)
        assert all(torch.equal(applied[0], other) for other in applied[1:])  # every rank applies the same
        applied_sum += applied[0].double()
        mean_sum += torch.stack(grads).double().mean(dim=0)
        residual = torch.stack([control.residual[:numel] for control in controls]).double().mean(dim=0)
        assert torch.allclose(applied_sum + residual, mean_sum, rtol=0, atol=1e-5 * (step + 1)), step
    total = controls[0].chunks_sent + controls[0].chunks_skipped
    assert controls[0].chunks_skipped > 0 and total == steps * controls[0].chunks  # something was skipped
    assert controls[0].bytes_full == steps * ring_allreduce_bytes(numel * 4, world)
    assert controls[0].bytes_sent + controls[0].bytes_skipped == controls[0].bytes_full


def test_error_feedback_identity_with_sync_in_a_world_of_one():
    control = GradientControl(300, 1, eps=0.3, chunk=32)
    rng = torch.Generator().manual_seed(10)
    applied_sum = torch.zeros(300, dtype=torch.float64)
    grad_sum = torch.zeros(300, dtype=torch.float64)
    base = torch.randn(300, generator=rng)
    for _ in range(40):
        grad = base + 0.1 * torch.randn(300, generator=rng)
        applied_sum += control.sync(grad).double()
        grad_sum += grad.double()
    assert torch.allclose(applied_sum + control.residual[:300].double(), grad_sum, atol=1e-5)
    assert control.chunks_skipped > 0


def test_eps_zero_sends_every_chunk_and_averages_exactly():
    world, numel = 3, 500
    controls = [GradientControl(numel, world, eps=0.0, chunk=64) for _ in range(world)]
    rng = torch.Generator().manual_seed(11)
    constant = torch.randn(numel, generator=rng)
    for _ in range(5):
        grads = [constant.clone() for _ in range(world)]  # unchanged gradients: still sent with eps 0
        applied = run_ranks(controls, grads)
        assert torch.allclose(applied[0], torch.stack(grads).mean(dim=0), rtol=0, atol=1e-6)
    assert controls[0].chunks_skipped == 0 and controls[0].bytes_skipped == 0
    assert all(float(control.residual.abs().max()) == 0 for control in controls)


def test_disabled_control_sends_everything():
    control = GradientControl(100, 2, eps=5.0, chunk=16, enabled=False)
    grad = torch.ones(100)
    for _ in range(3):
        assert bool((control.flags(grad) == 1).all())
        control.unpack(*control.pack(torch.ones(control.chunks)))
    assert control.chunks_skipped == 0


def test_unchanged_chunks_are_skipped_and_counted():
    control = GradientControl(256, 2, eps=0.01, chunk=64)
    grad = torch.randn(256, generator=torch.Generator().manual_seed(12))
    assert control.flags(grad).tolist() == [1.0] * 4
    control.unpack(*control.pack(torch.ones(4)))
    changed = grad.clone()
    changed[:64] += 1.0  # only the first chunk moved
    assert control.flags(changed).tolist() == [1.0, 0.0, 0.0, 0.0]
    control.unpack(*control.pack(torch.tensor([1.0, 0.0, 0.0, 0.0])))
    assert control.bytes_sent == ring_allreduce_bytes(256 * 4, 2) + ring_allreduce_bytes(64 * 4, 2)
    assert control.bytes_skipped == ring_allreduce_bytes(256 * 4, 2) - ring_allreduce_bytes(64 * 4, 2)


def test_gradient_control_state_round_trip_conserves_mass():
    control = GradientControl(200, 1, eps=0.5, chunk=32)
    rng = torch.Generator().manual_seed(13)
    base = torch.randn(200, generator=rng)
    applied_sum = torch.zeros(200, dtype=torch.float64)
    grad_sum = torch.zeros(200, dtype=torch.float64)
    for _ in range(8):
        grad = base + 0.2 * torch.randn(200, generator=rng)
        applied_sum += control.sync(grad).double()
        grad_sum += grad.double()
    assert float(control.residual.abs().sum()) > 0
    state = control.state_dict()
    again = GradientControl(200, 1, eps=0.5, chunk=32)
    again.load_state_dict(state)
    assert torch.equal(again.residual, control.residual) and torch.equal(again.average, control.average)
    assert not again.primed and again.bytes_sent == control.bytes_sent
    grad = base + 0.2 * torch.randn(200, generator=rng)
    assert again.flags(grad).tolist() == [1.0] * again.chunks  # the first step after a resume sends everything
    applied_sum += again.unpack(*again.pack(torch.ones(again.chunks))).double()
    grad_sum += grad.double()
    assert torch.allclose(applied_sum + again.residual[:200].double(), grad_sum, atol=1e-5)
    fresh = GradientControl(200, 1, eps=0.5, chunk=32)
    fresh.load_state_dict(state, residual=False)
    assert not fresh.primed and float(fresh.residual.abs().sum()) == 0
    assert torch.equal(fresh.average, control.average)


# -- the predictor --------------------------------------------------------------------------------------------------------
def test_predictor_flags_a_slow_rank_and_stops_when_it_recovers():
    predictor = StragglerPredictor(4, threshold=0.2, min_keep=0.25)
    assert predictor.keeps == [1.0] * 4 and predictor.stragglers() == []
    fast = 1e-4
    step = 0
    for _ in range(10):
        predictor.observe(step, [fast] * 4)
        step += 1
    assert predictor.stragglers() == []
    flagged_after = None
    for index in range(20):  # rank 2 is twice as slow per sample
        predictor.observe(step, [fast, fast, 2 * fast, fast])
        step += 1
        if flagged_after is None and predictor.stragglers() == [2]:
            flagged_after = index + 1
    assert flagged_after is not None and flagged_after <= 3
    assert predictor.stragglers() == [2]
    assert predictor.keep(2) == pytest.approx(0.5, abs=0.02)  # it should take half its batch to match
    assert [predictor.keep(rank) for rank in (0, 1, 3)] == [1.0, 1.0, 1.0]
    recovered_after = None
    for index in range(20):
        predictor.observe(step, [fast] * 4)
        step += 1
        if recovered_after is None and predictor.stragglers() == []:
            recovered_after = index + 1
    assert recovered_after is not None and recovered_after <= 5
    assert predictor.stragglers() == [] and predictor.keeps == [1.0] * 4
    predictor.observe(step, [fast, 5 * fast, fast, fast])  # a one-step hiccup is not a straggler to come
    assert predictor.stragglers() == []
    step += 1
    # 20 actual straggling steps of rank 2; predicted on all but the first few, plus a few after recovery
    assert predictor.actual_count == 21 and predictor.actual_pairs[-1] == (step - 1, 1)
    assert predictor.true_positives == 20 - (flagged_after - 1) - 1
    assert predictor.predicted_count == predictor.true_positives + recovered_after
    assert predictor.recall == pytest.approx(predictor.true_positives / 21)
    assert predictor.precision == pytest.approx(predictor.true_positives / predictor.predicted_count)
    assert 0.8 <= predictor.recall <= 1 and 0.7 <= predictor.precision <= 1
    assert all(rank == 2 for _, rank in list(predictor.actual_pairs)[:-1])
    assert (10, 2) in predictor.actual_pairs


def test_predictor_keep_is_clamped_and_lists_are_bounded():
    predictor = StragglerPredictor(2, threshold=0.2, min_keep=0.25)
    for step in range(700):
        predictor.observe(step, [1e-4, 1e-2])  # rank 1 is 100x slower
    assert predictor.keep(1) == 0.25 and predictor.keep(0) == 1.0
    assert len(predictor.actual_pairs) == 512 and len(predictor.predicted_pairs) == 512
    assert predictor.actual_pairs[-1] == (699, 1)
    assert predictor.precision == 1.0 and predictor.recall == pytest.approx(699 / 700)


def test_predictor_per_sample_normalization_does_not_oscillate():
    """A straggler whose batch shrank to half takes half the time, but its per-sample time is unchanged: it stays
    flagged with the same keep instead of flipping back and forth."""
    predictor = StragglerPredictor(2)
    keeps = []
    for step in range(30):
        keep = predictor.keep(1)
        keeps.append(keep)
        samples = round(64 * keep)
        slow_time = 2e-4 * samples  # the step time shrinks with the batch; the per-sample time does not
        predictor.observe(step, [1e-4, slow_time / samples])
    assert all(keep == pytest.approx(0.5, abs=0.05) for keep in keeps[5:])


def test_predictor_load_surge_anticipates():
    predictor = StragglerPredictor(3, load_weight=0.5)
    for step in range(20):
        predictor.observe(step, [1e-4] * 3, [0.0, 0.0, 0.0])
    predictor.observe(20, [1e-4] * 3, [0.0, 0.0, 1.0])  # a one-step hiccup is ignored
    assert predictor.stragglers() == []
    predictor.observe(21, [1e-4] * 3, [0.0, 0.0, 1.0])  # rank 2's contention rose for good; its time not yet
    assert predictor.stragglers() == [2]


def test_predictor_is_deterministic_and_restores():
    first, second = StragglerPredictor(3), StragglerPredictor(3)
    rng = torch.Generator().manual_seed(14)
    for step in range(50):
        times = (1e-4 * (1 + torch.rand(3, generator=rng))).tolist()
        first.observe(step, times)
        second.observe(step, times)
        assert first.keeps == second.keeps and first.predicted == second.predicted
    third = StragglerPredictor(3)
    third.load_state_dict(first.state_dict())
    assert third.keeps == first.keeps and third.predicted == first.predicted
    assert list(third.actual_pairs) == list(first.actual_pairs) and third.recall == first.recall


# -- the strategy (control plane side) -----------------------------------------------------------------------------------
def test_strategy_options():
    strategy = SMSStrategy()
    assert strategy.name == "sms" and strategy.min_workers == 2
    assert strategy.runtime == "components.straggler.sms:SMSRuntime"
    assert strategy.options == frozenset({"threshold", "min_keep", "eps", "chunk", "dedup", "transfer_control"})
    assert strategy.validate({}) == {}
    assert strategy.defaults({}) == SMS_DEFAULTS
    assert strategy.defaults({"eps": 0, "chunk": 1024})["eps"] == 0.0
    bad = strategy.validate({"threshold": 0, "min_keep": 1.5, "eps": -1, "chunk": 3.5, "dedup": "yes",
                             "transfer_control": 1})
    assert set(bad) == {"threshold", "min_keep", "eps", "chunk", "dedup", "transfer_control"}
    assert "threshold" in bad["threshold"] or "(0," in bad["threshold"]
    assert strategy.validate({"threshold": True}) and strategy.validate({"eps": float("nan")})


def test_strategy_module_is_light():
    import subprocess
    import sys

    code = ("import sys; import components.straggler.strategies as s; "
            "print('torch' in sys.modules, s.SMSStrategy().name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "sms"]


# -- the runtime on a gang of one (no process group) --------------------------------------------------------------------
class FakeContext:
    spec = {"seed": 0}


class TinyWorkload:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.batches = []

    def backward(self, batch):
        self.batches.append(batch)
        inputs, targets, *rest = batch
        logits = self.model(inputs)
        if rest:
            loss = (F.cross_entropy(logits, targets, reduction="none") * rest[0]).sum() / rest[0].sum()
        else:
            loss = F.cross_entropy(logits, targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return {"loss": loss.detach(), "samples": len(targets)}

    def apply_gradients(self):
        self.optimizer.step()


def test_runtime_needs_a_split_step():
    runtime = SMSRuntime(FakeContext(), {"strategy": "sms"}, Gang(0, 1, "gloo", "cpu", ""))
    with pytest.raises(TypeError, match="backward"):
        runtime.setup(object())
    with pytest.raises(ValueError, match="eps"):
        SMSRuntime(FakeContext(), {"strategy": "sms", "eps": -1}, Gang(0, 1, "gloo", "cpu", ""))


def test_runtime_step_report_and_checkpoint_on_one_rank():
    workload = TinyWorkload()
    runtime = SMSRuntime(FakeContext(), {"strategy": "sms", "eps": 0.0}, Gang(0, 1, "gloo", "cpu", "", ["node-a"]))
    runtime.setup(workload)
    reference = TinyWorkload()
    rng = torch.Generator().manual_seed(15)
    for _ in range(6):
        batch = (torch.randn(16, 6, generator=rng), torch.randint(0, 3, (16,), generator=rng))
        values = runtime.train_step(workload, batch)
        reference.backward(batch)
        reference.apply_gradients()
        assert values["kept"] == 1.0 and values["samples"] == 16
    for mine, theirs in zip(workload.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)  # a world of one with eps 0 is plain training
    metrics = runtime.rank_metrics()
    assert set(metrics) == {"step_ms", "compute_ms", "keep"} and metrics["keep"] == 1.0
    assert runtime.rank_metrics() == {}
    report = runtime.report()
    assert set(report) == {"strategy", "world_size", "step", "ranks", "heatmap", "stragglers", "dropped_samples",
                           "bytes_sent", "bytes_skipped", "bytes_full"}
    assert report["strategy"] == "sms" and report["world_size"] == 1 and report["step"] == 6
    assert report["ranks"][0]["node"] == "node-a" and report["ranks"][0]["keep"] == 1.0
    assert report["heatmap"]["steps"] == list(range(6)) and all(len(row) == 1 for row in report["heatmap"]["ms"])
    assert set(report["stragglers"]) == {"predicted", "actual", "precision", "recall"}
    assert report["dropped_samples"] == 0 and report["bytes_full"] == 0  # no bytes travel in a world of one
    state = runtime.state_dict()
    again = SMSRuntime(FakeContext(), {"strategy": "sms", "eps": 0.0}, Gang(0, 1, "gloo", "cpu", ""))
    again.setup(TinyWorkload())
    again.load_state_dict(state)
    assert again.step == 6 and not again.control.primed  # its first step sends every chunk
    assert torch.equal(again.control.average, runtime.control.average)
    assert again.report()["ranks"][0]["node"] == ""


def test_runtime_shrinks_a_predicted_stragglers_batch():
    workload = TinyWorkload()
    runtime = SMSRuntime(FakeContext(), {"strategy": "sms"}, Gang(0, 1, "gloo", "cpu", ""))
    runtime.setup(workload)
    runtime.predictor.keeps = [0.5]  # as if the predictor had flagged this rank
    runtime.predictor.observe = lambda step, times, loads=None: []  # and kept it flagged
    rng = torch.Generator().manual_seed(16)
    values = runtime.train_step(workload, (torch.randn(32, 6, generator=rng), torch.randint(0, 3, (32,), generator=rng)))
    inputs, targets, weights = workload.batches[-1]
    assert len(targets) <= 16 and float(weights.sum()) == 32.0
    assert values["kept"] == len(targets) / 32 and runtime.dropped_samples == 32 - len(targets)
