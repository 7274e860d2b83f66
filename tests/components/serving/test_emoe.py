"""eMoE: resident expert bytes stay under the budget, outputs equal the full model's whenever the resident experts
cover the routing (always, with on-demand loads), and the endpoint reports residency, hit rate and perplexity."""

import copy
import math

import numpy as np
import pytest
import torch

from components.gpushare.executor import DeviceExecutor
from components.serving.client import predict
from components.serving.emoe import ExpertPlacement, Perplexity, moe_layers
from components.serving.endpoint import start_serving
from components.serving.model import load_served_model
from components.train.loop import TrainLoop
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload, encode


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    """A moe-gpt model.pt trained for a few steps (routing that is not uniform)."""
    from components.runtime.contract.context import LocalContext

    spec = TrainSpec().validate({"workload": "moe-gpt", "hidden": 32, "max_steps": 30, "batch_size": 8, "seed": 2})
    ctx = LocalContext(job_id="moe", attempt_id="a", spec=dict(spec), workdir=tmp_path_factory.mktemp("moe"))
    TrainLoop(builtin_workload("moe-gpt"), spec, ctx, owns_process=False).run()
    return ctx.artifacts["model.pt"]


def text_batch(rows=3, length=48, offset=0):
    text = ("def predict(batch):\n    return model(batch)\n" * 20)[offset:]
    return torch.stack([encode(text[i * 7: i * 7 + length]) for i in range(rows)])


def full_outputs(path, tokens):
    served = load_served_model(path)
    with torch.inference_mode():
        return served.module(tokens)


def test_loads_keep_outputs_exact_and_residency_within_budget(moe_model):
    served = load_served_model(moe_model)
    layers = moe_layers(served.module)
    assert len(layers) == 2 and all(layer.count == 8 for layer in layers)
    total = sum(p.numel() * p.element_size() for layer in layers for p in layer.experts.parameters())
    placement = ExpertPlacement(served.module, int(0.25 * total), miss="load")
    assert placement.total_bytes == total and all(len(layer.experts) == 0 for layer in layers)
    placement.to_device("cpu")
    for offset in range(0, 60, 7):
        tokens = text_batch(offset=offset)
        placement.prepare()
        assert placement.resident_bytes <= placement.budget_bytes
        with torch.inference_mode():
            got = served.module(tokens)
        assert placement.resident_bytes <= placement.budget_bytes
        torch.testing.assert_close(got, full_outputs(moe_model, tokens), rtol=1e-5, atol=1e-5)
    stats = placement.stats()
    assert stats["resident_fraction"] <= 0.25 + 1e-9 and stats["hits"] + stats["misses"] > 0
    assert stats["loads"] > 0  # a quarter of the experts cannot cover every batch: misses were loaded


def test_reroute_equals_the_full_model_when_the_predicted_experts_cover_the_routing(moe_model):
    tokens = text_batch()
    reference = load_served_model(moe_model)
    with torch.inference_mode():
        expected = reference.module(tokens)
    used = {(layer.layer, int(index)) for layer in moe_layers(reference.module)
            for index in torch.unique(layer.last_choice)}
    served = load_served_model(moe_model)
    expert_bytes = {}
    probe = copy.deepcopy(served.module)
    for layer in moe_layers(probe):
        for index, expert in enumerate(layer.experts):
            expert_bytes[(layer.layer, index)] = sum(p.numel() * p.element_size() for p in expert.parameters())
    budget = sum(expert_bytes[key] for key in used)
    placement = ExpertPlacement(served.module, budget, miss="reroute", decay=0.5)
    placement.to_device("cpu")
    # Teach the predictor with the same traffic: its routing history then names exactly the experts used.
    for _ in range(6):
        placement.prepare()
        with torch.inference_mode():
            served.module(tokens)
    placement.prepare()
    assert set(placement.resident) == used
    rerouted = placement.rerouted
    with torch.inference_mode():
        got = served.module(tokens)
    assert placement.rerouted == rerouted  # nothing to reroute: the prediction covered the routing
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert placement.resident_bytes <= placement.budget_bytes


def test_a_budget_below_one_expert_and_a_model_without_experts_are_refused(moe_model, digits_model):
    with pytest.raises(ValueError, match="cannot hold one expert"):
        ExpertPlacement(load_served_model(moe_model).module, 10)
    with pytest.raises(ValueError, match="no mixture-of-experts layers"):
        ExpertPlacement(load_served_model(digits_model).module, 10**9)


def test_perplexity_of_the_requests():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))
    tokens = torch.tensor([[0, 1, 0]])
    running = Perplexity()
    running.add(tokens, logits)
    assert running.value == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.25)) / 2))


def test_the_endpoint_reports_residency_hit_rate_and_perplexity(moe_model):
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        served = load_served_model(moe_model)
        with start_serving(executor, "moe", served, max_rows=8, emoe={"budget": 0.5, "miss": "load"}) as handle:
            answers = []
            for offset in (0, 5, 11):
                tokens = text_batch(rows=2, offset=offset).numpy()
                answers.append((tokens, predict(handle.address, tokens)))
            for tokens, answer in answers:
                np.testing.assert_allclose(answer, full_outputs(moe_model, torch.as_tensor(tokens)).numpy(),
                                           rtol=1e-4, atol=1e-5)
            emoe = handle.stats()["emoe"]
    assert emoe["resident_bytes"] <= emoe["budget_bytes"] <= 0.5 * emoe["total_bytes"] + 1
    assert 0 <= emoe["hit_rate"] <= 1 and emoe["perplexity"] > 1
    expected = Perplexity()
    for tokens, answer in answers:
        expected.add(torch.as_tensor(tokens), torch.as_tensor(answer))
    assert emoe["perplexity"] == pytest.approx(expected.value, rel=1e-4)
