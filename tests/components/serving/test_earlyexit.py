"""The early-exit network of the serving zoo (components/serving/earlyexit.py): each row leaves at its first
confident exit with exactly that exit's answer, alone or in a batch; the exits are counted; corrupted digits are
drawn from the seed; and a ``model.pt`` trained from its entry point is served like a built-in model."""

from __future__ import annotations

import pytest
import torch

from components.serving.earlyexit import (
    ENTRYPOINT,
    SEVERITIES,
    EarlyExitDigits,
    EarlyExitMLP,
    corrupt,
    mean_depth,
)


def model(threshold: float = 0.5, seed: int = 0) -> EarlyExitMLP:
    torch.manual_seed(seed)
    return EarlyExitMLP(features=8, hidden=16, classes=3, blocks=4, threshold=threshold).eval()


def first_exit(every: list[torch.Tensor], threshold: float) -> tuple[torch.Tensor, list[int]]:
    """What each row should get: the logits of its first exit with confidence >= threshold (else the last)."""
    answers, depths = [], []
    for row in range(every[0].shape[0]):
        for depth, logits in enumerate(every):
            if depth == len(every) - 1 or logits[row].softmax(0).max() >= threshold:
                answers.append(logits[row])
                depths.append(depth)
                break
    return torch.stack(answers), depths


def test_each_row_gets_the_answer_of_its_first_confident_exit():
    net = model(threshold=0.45)
    inputs = torch.randn(64, 8) * 3
    with torch.inference_mode():
        expected, depths = first_exit(net.exits(inputs), 0.45)
        got = net(inputs)
    assert torch.allclose(got, expected, atol=1e-6)
    assert net.depths == [depths.count(depth) for depth in range(4)]
    assert len({depth for depth in depths}) >= 2  # this input mix leaves at more than one exit


def test_a_rows_answer_does_not_depend_on_its_batch():
    net = model(threshold=0.45)
    inputs = torch.randn(16, 8) * 3
    with torch.inference_mode():
        together = net(inputs)
        alone = torch.cat([net(inputs[row:row + 1]) for row in range(16)])
    assert torch.allclose(together, alone, atol=1e-5)


def test_the_threshold_sets_the_depth():
    inputs = torch.randn(10, 8)
    net = model(threshold=0.0)
    with torch.inference_mode():
        net(inputs)
    assert net.depths == [10, 0, 0, 0]
    net = model(threshold=1.01)  # never confident enough: the last exit answers every row
    with torch.inference_mode():
        out = net(inputs)
        last = net.exits(inputs)[-1]
    assert net.depths == [0, 0, 0, 10] and torch.allclose(out, last, atol=1e-6)
    assert mean_depth(net.depths) == 4.0
    net.reset_depths()
    assert net.depths == [0, 0, 0, 0]


def test_training_mode_gives_the_last_exit():
    net = model().train()
    inputs = torch.randn(5, 8)
    assert torch.equal(net(inputs), net.exits(inputs)[-1])


def test_corruption_is_drawn_from_the_seed_in_the_stated_shares():
    clean = torch.rand(6000, 64)
    first, severity = corrupt(clean, torch.Generator().manual_seed(3))
    again, _ = corrupt(clean, torch.Generator().manual_seed(3))
    assert torch.equal(first, again)
    for index, (share, _, _) in enumerate(SEVERITIES):
        assert (severity == index).float().mean().item() == pytest.approx(share, abs=0.03)
    assert torch.equal(first[severity == 0], clean[severity == 0])  # clean images are left as they are
    assert not torch.equal(first[severity == 2], clean[severity == 2])


def test_a_model_trained_from_the_entry_point_is_served_from_the_zoo(tmp_path):
    from components.runtime.contract.context import LocalContext
    from components.serving.model import load_served_model, servable_workloads
    from components.train.loop import TrainLoop
    from components.train.spec import TrainSpec

    spec = TrainSpec().validate({"entrypoint": ENTRYPOINT, "max_steps": 3, "seed": 1, "hidden": 16,
                                 "options": {"blocks": 3, "threshold": 0.8}})
    ctx = LocalContext(job_id="00000000-0000-4000-8000-000000000000", attempt_id="t", spec=dict(spec),
                       workdir=tmp_path)
    workload = EarlyExitDigits(blocks=3, threshold=0.8)
    TrainLoop(workload, spec, ctx, owns_process=False).run()

    served = load_served_model(ctx.artifacts["model.pt"])
    assert served.workload == ENTRYPOINT and isinstance(served.module, EarlyExitMLP)
    assert served.input_shape == (64,) and served.input_dtype == "float32" and served.output_shape == (10,)
    assert served.module.threshold == 0.8 and len(served.module.blocks) == 3
    assert served.module.depths == [0, 0, 0]  # the load's own check is not counted as a request
    rows = workload.x_test[:32].cpu()
    workload.model.eval()
    with torch.inference_mode():
        assert torch.allclose(served.module(rows), workload.model(rows), atol=1e-5)
    assert "early-exit-digits" in servable_workloads()


def test_a_model_pt_whose_weights_do_not_fit_is_refused(tmp_path):
    from components.serving.model import load_served_model
    from components.train.model_format import describe_model, save_model

    workload = EarlyExitDigits(blocks=2)
    workload.model = model()  # 4 blocks of width 16, not what the config says
    workload._config = {"features": 8, "hidden": 32, "classes": 3, "blocks": 2, "threshold": 0.9}
    path = tmp_path / "model.pt"
    save_model(path, describe_model(workload, name=ENTRYPOINT), workload.model.state_dict())
    with pytest.raises(ValueError, match="do not fit"):
        load_served_model(path)
