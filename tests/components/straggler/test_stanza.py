"""Stanza (layer separation, components/straggler/stanza.py): the model split, the strategy's options, and real
gangs of gloo processes on 127.0.0.1 -- a Stanza step equals synchronous SGD on the conv workers' batches together,
training learns, a checkpoint resumes exactly, and far fewer bytes cross the network than with data parallelism."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from components.runtime.contract import distributed
from components.runtime.node import gang as gang_module
from components.straggler.stanza import (
    SPLIT_ERROR,
    StanzaRuntime,
    ddp_bytes,
    parameter_bytes,
    split_model,
    stanza_bytes,
)
from components.straggler.stanza_strategy import StanzaStrategy, roles
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload

ROOT = Path(__file__).resolve().parents[3]
GANG_TIMEOUT_S = 240


def make_spec(**overrides) -> dict:
    return TrainSpec().validate({"workload": "cnn-fc", **overrides})


def make_workload(spec: dict):
    workload = builtin_workload("cnn-fc")
    workload.setup(spec, torch.device("cpu"))
    return workload


# -- the split and the options ------------------------------------------------------------------------------------
def test_split_model_cuts_cnn_fc_after_its_flatten_and_shares_the_layers():
    workload = make_workload(make_spec(hidden=4))
    conv, fc = split_model(workload.model)
    assert isinstance(conv[-1], nn.Flatten)
    assert [type(layer) for layer in fc] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert len(conv) + len(fc) == len(workload.model)
    assert all(a is b for a, b in zip([*conv, *fc], workload.model, strict=True))
    x = workload.batch(0, 0)[0]
    with torch.no_grad():
        assert torch.equal(fc(conv(x)), workload.model(x))
    # Most parameters sit in the FC layers: what makes layer separation pay.
    assert parameter_bytes(fc) > 50 * parameter_bytes(conv)


@pytest.mark.parametrize("model, why", [
    (nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10)), "no nn.Flatten"),  # mlp-digits' shape
    (nn.Conv2d(1, 4, 3), "not an nn.Sequential"),
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.ReLU()), "nothing after its Flatten has parameters"),
    (nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), "nothing before its Flatten has parameters"),
])
def test_split_model_explains_what_it_cannot_split(model, why):
    with pytest.raises(ValueError) as error:
        split_model(model)
    assert SPLIT_ERROR in str(error.value) and why in str(error.value)


def test_split_model_rejects_mlp_digits():
    workload = builtin_workload("mlp-digits")
    workload.setup(TrainSpec().validate({"workload": "mlp-digits"}), torch.device("cpu"))
    with pytest.raises(ValueError, match="stanza needs a CNN with fully connected layers after a Flatten"):
        split_model(workload.model)


@pytest.mark.parametrize("value", [0, -1, True, "2", 1.5, None, 513])
def test_strategy_rejects_bad_fc_workers(value):
    problems = StanzaStrategy().validate({"fc_workers": value})
    assert set(problems) == {"fc_workers"}
    assert "whole number from 1 to 512" in problems["fc_workers"]


def test_strategy_options_and_defaults():
    strategy = StanzaStrategy()
    assert strategy.name == "stanza" and strategy.min_workers == 2
    assert strategy.options == frozenset({"fc_workers"})
    assert strategy.runtime == "components.straggler.stanza:StanzaRuntime"
    assert strategy.validate({}) == {} and strategy.validate({"fc_workers": 3}) == {}
    assert strategy.defaults({}) == {"fc_workers": 1}
    assert strategy.defaults({"fc_workers": 2}) == {"fc_workers": 2}


def test_distributed_errors_name_the_stanza_option(monkeypatch):
    monkeypatch.setattr(distributed, "strategies", lambda: {"stanza": StanzaStrategy()})
    assert distributed.distributed_errors({"strategy": "stanza", "fc_workers": 2}) == {}
    errors = distributed.distributed_errors({"strategy": "stanza", "fc_workers": 0, "ratio": 3})
    assert set(errors) == {"spec.distributed.fc_workers", "spec.distributed.ratio"}
    assert errors["spec.distributed.ratio"] == "unknown option of stanza"
    normalized = distributed.normalize({"strategy": "stanza"})
    assert normalized["fc_workers"] == 1


def test_roles_put_rank_0_among_conv_workers_and_serve_them_round_robin():
    assert roles(3, 1) == ([0, 1], [2], {0: 2, 1: 2})
    assert roles(2, 1) == ([0], [1], {0: 1})
    assert roles(7, 2) == ([0, 1, 2, 3, 4], [5, 6], {0: 5, 1: 6, 2: 5, 3: 6, 4: 5})
    for world, fc in ((2, 2), (3, 2), (1, 1)):
        with pytest.raises(ValueError, match="at least as many conv workers as FC workers"):
            roles(world, fc)


def test_runtime_refuses_a_gang_without_enough_conv_workers(tmp_path):
    from components.runtime.contract.context import LocalContext

    ctx = LocalContext(job_id="j", attempt_id="a", spec=make_spec(), rank=0, world_size=3, workdir=tmp_path)
    gang = gang_module.Gang(0, 3, "gloo", "cpu", "127.0.0.1:1")
    with pytest.raises(ValueError, match="fc_workers=2 of 3 workers leaves 1 conv worker"):
        StanzaRuntime(ctx, {"strategy": "stanza", "fc_workers": 2}, gang)


def test_stanza_sends_far_fewer_bytes_than_ddp_for_cnn_fc():
    workload = make_workload(make_spec(batch_size=32))
    conv, fc = split_model(workload.model)
    width = fc[0].in_features
    for world, fc_workers in ((3, 1), (4, 1), (5, 2)):
        ours = stanza_bytes(batch_size=32, width=width, conv_bytes=parameter_bytes(conv),
                            fc_bytes=parameter_bytes(fc), world_size=world, fc_workers=fc_workers)
        full = ddp_bytes(parameter_bytes(workload.model), world)
        assert full >= 3 * ours, (world, fc_workers, ours, full)


# -- real gangs -----------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_gang(tmp_path: Path, world: int, args: dict) -> list[dict]:
    """Run a gang of ``world`` processes (this file as a script), joined with a generous timeout; returns
    what each rank saved."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    out = tmp_path / "gang"
    out.mkdir(parents=True, exist_ok=True)
    processes = [subprocess.Popen([sys.executable, __file__, str(rank), str(world), str(port), str(out), json.dumps(args)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for rank in range(world)]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=GANG_TIMEOUT_S)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=30)
    failed = [(rank, process.returncode, text) for rank, (process, text) in enumerate(zip(processes, outputs,
                                                                                            strict=True))
              if process.returncode != 0]
    assert not failed, "\n".join(f"rank {rank} exited {code}:\n{text[-3000:]}" for rank, code, text in failed)
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


def reference_steps(spec: dict, conv_count: int, steps: int) -> tuple[dict, dict, list[float]]:
    """Single-process training on the union of the conv workers' batches: the model, optimizer state, losses."""
    workload = make_workload(spec)
    losses = []
    for index in range(steps):
        batches = [workload.batch(0, index * conv_count + rank) for rank in range(conv_count)]
        union = tuple(torch.cat(parts) for parts in zip(*batches, strict=True))
        losses.append(float(workload.train_step(union)["loss"]))
    return workload.model.state_dict(), workload.optimizer.state_dict(), losses


def assert_models_close(ours: dict, theirs: dict, tolerance: float) -> None:
    assert ours.keys() == theirs.keys()
    for key in ours:
        difference = (ours[key] - theirs[key]).abs().max().item()
        assert difference <= tolerance, (key, difference)


def check_union_equivalence(saved: dict, spec: dict, conv_count: int, fc_workers: int, tolerance: float) -> None:
    """Rank 0's model and optimizer state after ``saved["snapshot"]`` steps (and a synchronize) equal single-process
    training on the union of the conv workers' batches."""
    snapshot = saved["snapshot"]
    steps = len(snapshot["values"])
    model, optimizer_state, losses = reference_steps(spec, conv_count, steps)
    assert_models_close(snapshot["model"], model, tolerance)
    # Rank 0 reports the union batch's loss and size, as single-process training on it would.
    assert [values["samples"] for values in snapshot["values"]] == [spec["batch_size"] * conv_count] * steps
    assert [values["loss"] for values in snapshot["values"]] == pytest.approx(losses, abs=1e-5)
    # synchronize merged both parts' optimizer state into the workload's optimizer: a complete checkpoint.
    ours = snapshot["optimizer"]["state"]
    assert sorted(ours) == sorted(optimizer_state["state"])
    for index, state in optimizer_state["state"].items():
        for name, value in state.items():
            assert torch.allclose(torch.as_tensor(ours[index][name]), torch.as_tensor(value), atol=tolerance), \
                (index, name)


def test_two_conv_workers_and_two_fc_workers_step_as_synchronous_adam(tmp_path):
    spec = make_spec(optimizer="adam", lr=0.003, batch_size=16, hidden=8)
    ranks = run_gang(tmp_path, 4, {"fc_workers": 2, "spec": spec, "snapshot": 3, "stop": 3})
    check_union_equivalence(ranks[0], spec, conv_count=2, fc_workers=2, tolerance=1e-5)
    # Every rank's step figures; the FC workers report their role.
    assert [rank["metrics"]["role"] for rank in ranks] == [0.0, 0.0, 1.0, 1.0]
    assert all(rank["metrics"]["step_ms"] > 0 and rank["metrics"]["wall_ms"] >= rank["metrics"]["step_ms"]
               for rank in ranks)
    assert all(rank["report"] is None for rank in ranks[1:])
    assert ranks[0]["report"]["bytes_sent"] == ranks[0]["analytic_bytes"]


def test_stanza_equals_synchronous_sgd_trains_cnn_fc_reports_and_resumes_exactly(tmp_path):
    # 3 ranks: 2 conv workers, 1 FC worker; SGD with momentum 0.9 (make_optimizer's).
    spec = make_spec(optimizer="sgd", lr=0.02, batch_size=32, epochs=2)
    first = run_gang(tmp_path, 3, {"fc_workers": 1, "spec": spec, "snapshot": 3, "checkpoint_after": 0})[0]
    check_union_equivalence(first, spec, conv_count=2, fc_workers=1, tolerance=1e-5)

    accuracies = [evaluation["test_accuracy"] for evaluation in first["evaluations"]]
    losses = [values["loss"] for values in first["values"]]
    # 6 classes: chance is 1/6. The loss falls clearly within the first epoch.
    assert accuracies[-1] > 0.45, accuracies  # 0.77 observed
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10, losses
    assert first["steps_per_epoch"] == 4096 // 32 // 2

    report = first["report"]
    assert set(report) == {"strategy", "world_size", "step", "ranks", "heatmap", "stragglers", "dropped_samples",
                           "bytes_sent", "bytes_skipped", "bytes_full", "phases"}
    assert report["strategy"] == "stanza" and report["world_size"] == 3 and report["step"] == 2 * 64
    assert [rank["rank"] for rank in report["ranks"]] == [0, 1, 2]
    assert all(rank["keep"] == 1.0 and rank["step_ms"] > 0 and isinstance(rank["node"], str)
               for rank in report["ranks"])
    heatmap = report["heatmap"]
    assert heatmap["steps"] == list(range(127))  # step s's row arrives with step s + 1: the last is pending
    assert all(len(row) == 3 and all(value > 0 for value in row) for row in heatmap["ms"])
    assert report["stragglers"] == {"predicted": [], "actual": [], "precision": None, "recall": None}
    assert report["dropped_samples"] == 0 and report["bytes_skipped"] == 0
    assert set(report["phases"]) == {"conv_ms", "fc_ms", "exchange_ms"}
    assert all(value >= 0 for value in report["phases"].values()) and report["phases"]["conv_ms"] > 0
    # The measured bytes of every rank are what stanza_bytes predicts, >= 3x fewer than DDP's.
    assert report["bytes_sent"] == first["analytic_bytes"]
    workload = make_workload(spec)
    assert report["bytes_full"] == ddp_bytes(parameter_bytes(workload.model), 3)
    assert report["bytes_full"] >= 3 * report["bytes_sent"]

    # A second attempt resumed from the checkpoint after epoch 0, rank 0 alone reading it: the same model.
    resumed = first["resumed"]
    assert len(resumed["values"]) == 64 and resumed["report"]["step"] == 2 * 64
    assert resumed["evaluations"][-1]["test_accuracy"] == pytest.approx(accuracies[-1], abs=1e-6)
    assert_models_close(resumed["model"], first["model"], 1e-6)


# -- a rank of a gang (this file run as a script) -------------------------------------------------------------------
def rank_main(rank: int, world: int, port: int, out: Path, args: dict) -> None:
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    gang = gang_module.Gang(rank, world, "gloo", "cpu", f"127.0.0.1:{port}")
    saved = attempt(gang, out, args, "a1")
    if args.get("checkpoint_after") is not None:
        # A second attempt in the same gang, as after a restart: fresh workload and runtime on every rank, and only
        # rank 0 loads the checkpoint (the runtime hands the other ranks their parts at the first step).
        saved["resumed"] = attempt(gang, out, {**args, "resume": str(out / "checkpoint.pt"), "snapshot": None}, "a2")
    torch.save(saved, out / f"rank{rank}.pt")
    dist.barrier()
    gang.close()


def attempt(gang, out: Path, args: dict, name: str) -> dict:
    """One attempt of a training loop's life on this rank: what the loop does with a strategy runtime."""
    from components.runtime.contract.context import LocalContext

    rank, world, spec = gang.rank, gang.world_size, args["spec"]
    ctx = LocalContext(job_id="stanza-test", attempt_id=name, spec=spec, rank=rank, world_size=world,
                       workdir=out / f"{name}-rank{rank}")
    workload = make_workload(spec)
    runtime = StanzaRuntime(ctx, {"strategy": "stanza", "fc_workers": args["fc_workers"]}, gang)
    runtime.setup(workload)
    saved: dict = {"values": [], "evaluations": []}
    first_epoch = 0
    if args.get("resume"):
        state = torch.load(args["resume"], weights_only=False)
        if rank == 0:
            workload.load_state_dict(state["workload"])
            runtime.load_state_dict(state["runtime"])
        first_epoch = state["epoch"] + 1
    steps = runtime.steps_per_epoch(workload.steps_per_epoch())
    saved["steps_per_epoch"] = steps
    done = 0
    for epoch in range(first_epoch, spec["epochs"]):
        for index in range(steps):
            values = runtime.train_step(workload, runtime.batch(workload, epoch, index))
            saved["values"].append({"loss": float(values["loss"]), "samples": values["samples"]})
            done += 1
            if done == args.get("snapshot"):  # the loop synchronizes before a checkpoint, mid-epoch too
                runtime.synchronize(workload)
                saved["snapshot"] = copy.deepcopy({"values": saved["values"], "model": workload.model.state_dict(),
                                                   "optimizer": workload.optimizer.state_dict()})
            if done == args.get("stop"):
                break
        else:
            runtime.synchronize(workload)
            if rank == 0:
                saved["evaluations"].append(workload.evaluate())
                if epoch == args.get("checkpoint_after") and not args.get("resume"):
                    torch.save({"workload": workload.state_dict(), "runtime": runtime.state_dict(), "epoch": epoch},
                               out / "checkpoint.pt")
            continue
        break
    saved["analytic_bytes"] = stanza_bytes(batch_size=spec["batch_size"], width=runtime.fc[0].in_features,
                                           conv_bytes=parameter_bytes(runtime.conv),
                                           fc_bytes=parameter_bytes(runtime.fc), world_size=world,
                                           fc_workers=args["fc_workers"])
    saved["model"] = copy.deepcopy(workload.model.state_dict())
    saved["optimizer"] = copy.deepcopy(workload.optimizer.state_dict())
    saved["metrics"] = runtime.rank_metrics()
    saved["report"] = runtime.report()
    runtime.close()
    return saved


if __name__ == "__main__":
    rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), json.loads(sys.argv[5]))
