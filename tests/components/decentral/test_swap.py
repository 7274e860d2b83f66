"""Atom-style layer swapping: exact training, the device budget, the planner, the timeline, the link's bytes.

Swapped training must equal in-memory training (loss and host gradients, over Adam steps too); a model four times
the device budget must train without the memory accountant ever passing the budget; the dynamic programme must
agree with trying every cut; loads must overlap computation. Only structure and lower bounds are asserted, never
short wall times (a loaded 2-core machine)."""

from __future__ import annotations

import json
import random
import threading

import pytest
import torch

from components.decentral.model import (
    Corpus,
    ModelConfig,
    build_model,
    lm_loss,
    model_layers,
    parameter_bytes,
)
from components.decentral.swap import (
    COMPUTE_KINDS,
    DeviceMemory,
    DeviceMemoryError,
    HostLink,
    LayerProfile,
    SwappedModel,
    SwapPlanError,
    evaluate_plan,
    exhaustive_plan,
    minimum_budget,
    overlapping,
    plan_segments,
    profile_layers,
)

TINY = ModelConfig.named("tiny")  # 4 swap units: embedding, 2 blocks, head
DEEP = ModelConfig.named("small", layers=16, context=16)  # 18 units; fits a quarter of its bytes at batch 2


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread (restored afterwards): OpenMP teams spin-waiting on a loaded 2-core machine made steps
    of these small models many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_prefetch_threads_left():
    yield
    left = [t.name for t in threading.enumerate() if t.name.startswith(("swap-prefetch", "swap-host"))]
    assert left == [], f"prefetch threads left running: {left}"


def _profiles(config, batch, *, link=None, seed=0):
    model = build_model(config, seed)
    layers = model_layers(model)
    inputs, targets = Corpus(seed, context=config.context).batch(0, 0, batch)
    link = link or HostLink("cpu")
    profiles = profile_layers(layers, inputs, device="cpu", link=link, repeats=1, targets=targets, loss_fn=lm_loss)
    return model, layers, profiles


@pytest.fixture(scope="module")
def tiny_profiles():
    return _profiles(TINY, 4)[2]


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("cuts", [[(0, 1), (1, 2), (2, 3), (3, 4)], [(0, 2), (2, 3), (3, 4)], [(0, 1), (1, 4)],
                                  [(0, 4)]])
def test_swapped_step_equals_in_memory_training(tiny_profiles, cuts):
    plan = evaluate_plan(tiny_profiles, cuts)
    reference = build_model(TINY, 0)
    model = build_model(TINY, 0)
    layers = model_layers(model)
    memory = DeviceMemory(plan.budget_bytes)
    corpus = Corpus(0)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with SwappedModel(layers, plan, link=HostLink("cpu"), memory=memory) as swapped:
        for step in range(3):
            inputs, targets = corpus.batch(0, step, 4)
            ref_opt.zero_grad(set_to_none=True)
            expected = lm_loss(reference(inputs), targets)
            expected.backward()
            opt.zero_grad(set_to_none=True)
            loss = swapped.train_step(inputs, targets, lm_loss)
            assert loss == pytest.approx(float(expected.detach()), rel=1e-6, abs=1e-6)
            want, got = _grads(reference), _grads(model)
            assert want.keys() == got.keys()
            for name in want:
                assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-7), name
            ref_opt.step()
            opt.step()
        for a, b in zip(reference.parameters(), model.parameters(), strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        inputs, _ = corpus.batch(0, 99, 4)
        with torch.no_grad():
            assert torch.allclose(swapped.forward(inputs), reference(inputs), rtol=1e-5, atol=1e-6)
    # Within the plan, and nothing left on the device.
    assert memory.peak <= plan.peak_bytes
    assert memory.current == 0


def test_planned_multi_segment_step_is_exact(tiny_profiles):
    """The planner's own answer under a tight budget: several segments, same loss and gradients."""
    plan = plan_segments(tiny_profiles, minimum_budget(tiny_profiles))
    assert len(plan.segments) >= 3
    reference, model = build_model(TINY, 0), build_model(TINY, 0)
    inputs, targets = Corpus(0).batch(0, 0, 4)
    expected = lm_loss(reference(inputs), targets)
    expected.backward()
    with SwappedModel(model_layers(model), plan, link=HostLink("cpu")) as swapped:
        loss = swapped.train_step(inputs, targets, lm_loss)
    assert loss == pytest.approx(float(expected.detach()), rel=1e-6)
    for (name, a), b in zip(reference.named_parameters(), model.parameters(), strict=True):
        assert torch.allclose(b.grad, a.grad, rtol=1e-5, atol=1e-7), name


# ------------------------------------------------------------------------------------------------ the budget


def test_a_model_four_times_the_budget_trains():
    model, layers, profiles = _profiles(DEEP, 2)
    budget = parameter_bytes(model) // 4
    plan = plan_segments(profiles, budget)
    assert len(plan.segments) > 2 and plan.peak_bytes <= budget
    assert max(s.param_bytes for s in plan.segments) < budget < plan.model_bytes
    memory = DeviceMemory(budget)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    corpus = Corpus(0, context=DEEP.context)
    losses = []
    with SwappedModel(layers, plan, link=HostLink("cpu"), memory=memory) as swapped:
        for step in range(20):
            inputs, targets = corpus.batch(0, step, 2)
            optimizer.zero_grad(set_to_none=True)
            losses.append(swapped.train_step(inputs, targets, lm_loss))
            optimizer.step()
        summary = swapped.timeline_summary()
    assert memory.budget_bytes == budget and 0 < memory.peak <= plan.peak_bytes <= budget
    assert memory.current == 0
    assert summary["counters"]["peak_device_bytes"] == memory.peak
    assert sum(losses[-5:]) / 5 < losses[0] - 0.7, losses
    json.dumps(summary)  # the dashboard panel's input


def test_device_memory_refuses_past_the_budget():
    memory = DeviceMemory(100)
    memory.allocate(60, "parameters")
    with pytest.raises(DeviceMemoryError, match="budget"):
        memory.allocate(41, "gradients")
    assert memory.current == 60 and memory.peak == 60
    memory.allocate(40, "gradients")
    memory.free(100 - 60, "gradients")
    memory.free(60, "parameters")
    assert memory.current == 0 and memory.peak == 100
    with pytest.raises(RuntimeError):
        memory.free(1, "parameters")


def test_a_step_past_the_budget_raises_and_frees_everything(tiny_profiles):
    plan = evaluate_plan(tiny_profiles, [(0, 1), (1, 2), (2, 3), (3, 4)])
    # Half the plan's peak: whatever the prefetch thread's timing (a late prefetch lowers the real peak below the
    # plan's), the step cannot fit.
    memory = DeviceMemory(plan.peak_bytes // 2)
    model = build_model(TINY, 0)
    inputs, targets = Corpus(0).batch(0, 0, 4)
    with SwappedModel(model_layers(model), plan, link=HostLink("cpu"), memory=memory) as swapped:
        with pytest.raises(DeviceMemoryError, match="budget"):
            swapped.train_step(inputs, targets, lm_loss)
    assert memory.current == 0


# ---------------------------------------------------------------------------------------------------- planner


def _random_profiles(rng: random.Random, n: int) -> list[LayerProfile]:
    batch = rng.randint(0, 2000)
    profiles, previous = [], batch
    for i in range(n):
        output = rng.randint(100, 3000)
        saved = rng.randint(0, 5000)
        params = rng.randint(1000, 20000)
        profiles.append(LayerProfile(
            index=i, name=f"l{i}", param_bytes=params, activation_bytes=output, forward_s=rng.uniform(0.001, 0.05),
            backward_s=rng.uniform(0.001, 0.1), load_s=rng.uniform(0.0, 0.08), input_bytes=previous,
            saved_bytes=saved, largest_saved_bytes=rng.randint(0, saved)))
        previous = output
    return profiles


def test_dynamic_programme_equals_trying_every_cut():
    rng = random.Random(7)
    feasible = infeasible = 0
    for _ in range(120):
        profiles = _random_profiles(rng, rng.randint(1, 8))
        least = minimum_budget(profiles)
        whole = evaluate_plan(profiles, [(0, len(profiles))]).peak_bytes
        budget = rng.randint(int(least * 0.9), max(whole, least) + 1)
        try:
            expected = exhaustive_plan(profiles, budget)
        except SwapPlanError:
            infeasible += 1
            with pytest.raises(SwapPlanError):
                plan_segments(profiles, budget)
            continue
        feasible += 1
        plan = plan_segments(profiles, budget)
        assert plan.peak_bytes <= budget
        assert plan.step_time_s == pytest.approx(expected.step_time_s, rel=1e-9, abs=1e-12)
        # The DP's bookkeeping equals the plan's own estimate of its cuts.
        assert evaluate_plan(profiles, plan.cuts, budget).step_time_s == pytest.approx(plan.step_time_s)
    assert feasible > 50 and infeasible > 5


def test_minimum_budget_is_tight(tiny_profiles):
    least = minimum_budget(tiny_profiles)
    assert plan_segments(tiny_profiles, least).peak_bytes == least
    with pytest.raises(SwapPlanError, match=r"smallest budget any plan fits is"):
        plan_segments(tiny_profiles, least - 1)


def test_a_model_that_fits_is_one_segment(tiny_profiles):
    plan = plan_segments(tiny_profiles, 10**12)
    assert plan.cuts == ((0, len(tiny_profiles)),)
    assert plan.load_bytes_per_step == sum(p.param_bytes for p in tiny_profiles)
    assert plan.stash_bytes_per_step == 0
    assert "1 segment " in plan.description


def test_an_impossible_budget_is_a_clear_error(tiny_profiles):
    block = max(p.param_bytes for p in tiny_profiles)
    with pytest.raises(SwapPlanError, match=r"no swap plan fits a device budget of .* and its neighbour"):
        plan_segments(tiny_profiles, block)


def test_estimate_is_the_load_compute_pipeline():
    profiles = [LayerProfile(index=i, name=f"l{i}", param_bytes=10, activation_bytes=1, forward_s=f, backward_s=b,
                             load_s=load) for i, (f, b, load) in enumerate([(1, 2, 3), (4, 5, 6), (7, 8, 9)])]
    one = evaluate_plan(profiles, [(0, 3)])
    assert one.step_time_s == pytest.approx((3 + 6 + 9) + (1 + 4 + 7) + (2 + 5 + 8) + (3 + 6 + 9))
    three = evaluate_plan(profiles, [(0, 1), (1, 2), (2, 3)])
    r = [f + b + load for f, b, load in [(1, 2, 3), (4, 5, 6), (7, 8, 9)]]
    forward = 3 + max(1, 6) + max(4, 9)
    backward = r[2] + max(r[1], 3) + r[0]
    assert three.step_time_s == pytest.approx(forward + backward)
    assert three.load_bytes_per_step == 30 + 10  # every segment once, the first one again in backward


# ---------------------------------------------------------------------------------------- timeline and link


def test_loads_overlap_computation_on_a_throttled_link():
    link = HostLink("cpu", bytes_per_s=20e6)  # a block (200 KB) takes 10 ms
    model, layers, profiles = _profiles(TINY, 16, link=link)
    plan = evaluate_plan(profiles, [(0, 1), (1, 2), (2, 3), (3, 4)])
    corpus = Corpus(1)
    with SwappedModel(layers, plan, link=link, memory=DeviceMemory(plan.budget_bytes), timeline_steps=3) as swapped:
        for step in range(3):
            swapped.train_step(*corpus.batch(0, step, 16), lm_loss)
        summary = swapped.timeline_summary()
        events = swapped.timeline
    kinds = [e["kind"] for e in events]
    assert kinds.count("load") == 2 * len(plan.segments) - 2
    assert {"forward", "recompute", "backward", "offload"} <= set(kinds)
    # Causality: a segment computes only after its load has ended.
    for event in events:
        if event["kind"] in COMPUTE_KINDS:
            loads = [e for e in events if e["kind"] == "load" and e["segment"] == event["segment"]
                     and e["start"] <= event["start"]]
            assert loads and loads[-1]["end"] <= event["start"], event
    # Prefetching: some load runs while a computation does, in some recorded step.
    assert len(summary["steps"]) == 3
    assert any(overlapping(step["events"]) for step in summary["steps"])
    assert any(step["overlap_s"] > 0 for step in summary["steps"])
    json.dumps(summary)


def test_link_carries_exactly_the_planned_bytes():
    link = HostLink("cpu", bytes_per_s=400e6)
    model, layers, profiles = _profiles(TINY, 4, link=link)
    link.reset_counters()
    plan = evaluate_plan(profiles, [(0, 1), (1, 2), (2, 3), (3, 4)])
    steps = 3
    corpus = Corpus(0)
    with SwappedModel(layers, plan, link=link) as swapped:
        for step in range(steps):
            swapped.train_step(*corpus.batch(0, step, 4), lm_loss)
        counters = swapped.timeline_summary()["counters"]
    moved = link.as_dict()["bytes_by_kind"]
    assert moved["h2d:parameters"] == steps * plan.load_bytes_per_step == counters["bytes_loaded"]
    assert moved["d2h:activations"] == moved["h2d:activations"] == steps * plan.stash_bytes_per_step
    assert moved["d2h:gradients"] == steps * parameter_bytes(model)
    assert plan.load_bytes_per_step == 2 * parameter_bytes(model) - profiles[-1].param_bytes - profiles[-2].param_bytes
    # A throttled link is never faster than its bandwidth (a lower bound: safe on a loaded machine).
    assert link.seconds["h2d"] >= link.bytes["h2d"] / 400e6 * 0.999


# ------------------------------------------------------------------------- the optimizer overlapped per segment


def test_per_segment_optimizer_on_the_host_thread_equals_one_adam_step(tiny_profiles):
    """``on_gradients``: each segment's parameters are handed over once, in backward order, when their gradients
    are complete; one Adam per segment stepped there trains exactly like one Adam over the model after the step."""
    plan = evaluate_plan(tiny_profiles, [(0, 1), (1, 2), (2, 3), (3, 4)])
    reference, model = build_model(TINY, 0), build_model(TINY, 0)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    corpus = Corpus(0)
    calls = []
    with SwappedModel(model_layers(model), plan, link=HostLink("cpu")) as swapped:
        owned = [swapped.segment_parameters(index) for index in range(len(plan.segments))]
        assert sorted(id(p) for part in owned for p in part) == sorted(id(p) for p in model.parameters())
        optimizers = {index: torch.optim.Adam(part, lr=1e-2) for index, part in enumerate(owned) if part}

        def step_segment(index, parameters):
            assert all(p.grad is not None for p in parameters)
            calls.append((index, threading.current_thread().name))
            optimizers[index].step()
            optimizers[index].zero_grad(set_to_none=True)

        for step in range(3):
            inputs, targets = corpus.batch(0, step, 4)
            ref_opt.zero_grad(set_to_none=True)
            expected = lm_loss(reference(inputs), targets)
            expected.backward()
            ref_opt.step()
            loss = swapped.train_step(inputs, targets, lm_loss, on_gradients=step_segment)
            assert loss == pytest.approx(float(expected.detach()), rel=1e-6, abs=1e-6)
            assert all(p.grad is None for p in model.parameters())  # every segment stepped before the return
    assert [index for index, _ in calls] == [3, 2, 1, 0] * 3
    assert {name for _, name in calls} == {"swap-host_0"}
    for (name, a), b in zip(reference.named_parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


def test_an_error_in_the_per_segment_step_reaches_the_caller_and_frees_the_device(tiny_profiles):
    plan = evaluate_plan(tiny_profiles, [(0, 2), (2, 3), (3, 4)])
    model = build_model(TINY, 0)
    memory = DeviceMemory(plan.budget_bytes)
    inputs, targets = Corpus(0).batch(0, 0, 4)

    def fail(index, parameters):
        raise RuntimeError(f"optimizer of segment {index} failed")

    with SwappedModel(model_layers(model), plan, link=HostLink("cpu"), memory=memory) as swapped:
        with pytest.raises(RuntimeError, match="segment 2 failed"):
            swapped.train_step(inputs, targets, lm_loss, on_gradients=fail)
    assert memory.current == 0


def test_throughput_with_the_overlapped_optimizer_trains_like_in_memory():
    from components.decentral.swap import throughput

    result = throughput(("small", {"layers": 16, "context": 16}), batch=2, steps=2, overlap_optimizer=True)
    assert result["overlap_optimizer"] is True
    assert len(result["plan"]["segments"]) > 2
    assert result["max_loss_difference"] < 1e-4
    assert result["memory"]["peak_bytes"] <= result["budget_bytes"]


def test_cpu_offload_and_load_after_an_event():
    """The stash's round trip on the emulated link: ``offload`` gives a host copy (no event on CPU), and ``load``
    takes it back after the events it is given (none here)."""
    link = HostLink("cpu", bytes_per_s=None)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    host, event = link.offload(x)
    assert event is None and torch.equal(host, x) and host.data_ptr() != x.data_ptr()
    (back,), loaded = link.load([host], "activations", after=[event])
    assert loaded is None and torch.equal(back, x)
    assert link.bytes == {"h2d": 48, "d2h": 48}
    link.settle()  # nothing to wait for on CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_swapped_steps_with_overlapped_copies_equal_in_memory_training():
    """On a GPU: copies on side streams (no synchronisation between windows), gradients landing in pinned buffers,
    the per-segment Adam on the host thread: the same losses as the model trained in GPU memory."""
    from components.decentral.swap import throughput

    result = throughput(("small", {"layers": 16, "context": 16}), batch=2, steps=3, device="cuda")
    assert result["overlap_optimizer"] is True
    assert result["max_loss_difference"] < 1e-3
    assert result["link"]["seconds"]["h2d"] > 0 and result["counters"]["compute_seconds"] > 0
