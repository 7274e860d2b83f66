"""Train's distributed strategies end to end on one machine: two gloo ranks (processes) of the train loop meet
through LocalContexts sharing one workdir (components.runtime.node.gang.init_gang), train mlp-digits with
``ddp`` and ``post-local-sgd``, stop together when one rank is asked to, and resume on a new pair of processes
from rank 0's checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from components.runtime.contract.context import LocalContext
from components.train.component import TrainComponent
from components.train.loop import GANG_STOP_EVERY

ROOT = Path(__file__).resolve().parents[3]
EPOCHS = 3
STOP_STEP = 10  # rank 1 alone is asked to stop once it reported this step
# The gang agrees on stopping every GANG_STOP_EVERY steps: it stops at the first such step after the request.
STOPPED_AT = -(-STOP_STEP // GANG_STOP_EVERY) * GANG_STOP_EVERY
BASE = {"workload": "mlp-digits", "epochs": EPOCHS, "batch_size": 32, "log_every": 5, "seed": 0}

RANK = r"""
import json, sys
import torch
torch.set_num_threads(1)
from components.runtime.contract.context import LocalContext
from components.train.component import TrainComponent

rank, world, attempt, workdir, spec, stop_rank, stop_step, out = sys.argv[1:9]
rank, world, stop_rank, stop_step = int(rank), int(world), int(stop_rank), int(stop_step)


class StopAt(LocalContext):
    # As a cancel or preemption reaching one rank's node only: this rank alone is asked to stop.
    def metrics(self, values, step):
        super().metrics(values, step)
        if self.rank == stop_rank and step >= stop_step:
            self.request_stop()


ctx = StopAt(job_id="j", attempt_id=attempt, spec=json.loads(spec), rank=rank, world_size=world, workdir=workdir)
TrainComponent().run(ctx)
with open(out, "w") as handle:
    json.dump({"logs": [message for _, _, message in ctx.logs], "metrics": ctx.metric_points,
               "artifacts": sorted(ctx.artifacts), "spec": ctx.spec}, handle)
"""


def gang_run(workdir: Path, spec: dict[str, Any], attempt: str, *, stop_rank: int = -1,
             world: int = 2, timeout: float = 240.0) -> list[dict[str, Any]]:
    """Run ``world`` ranks of one attempt in processes; each rank's logs, metric points and artifact names."""
    env = {**os.environ, "STRATA_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    outs = [workdir / f"{attempt}-rank{rank}.json" for rank in range(world)]
    children = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(world), attempt, str(workdir),
                                  json.dumps(spec), str(stop_rank), str(STOP_STEP), str(outs[rank])],
                                 cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(world)]
    try:
        for rank, child in enumerate(children):
            output, _ = child.communicate(timeout=timeout)
            assert child.returncode == 0, f"rank {rank} exited {child.returncode}:\n{output[-4000:]}"
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)
    return [json.loads(out.read_text()) for out in outs]


def series(result: dict[str, Any], name: str) -> list[tuple[int, float]]:
    return [(step, value) for metric, value, step in result["metrics"] if metric == name]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def assert_same_weights(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], atol: float) -> None:
    assert first.keys() == second.keys()
    for name in first:
        assert torch.allclose(first[name], second[name], atol=atol), (name, (first[name] - second[name]).abs().max())


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ddp")
    ranks = gang_run(workdir, {**BASE, "distributed": {"strategy": "ddp"}}, "a1")
    return {"ranks": ranks, "model": weights(workdir / "artifacts" / "model.pt"),
            "summary": json.loads((workdir / "artifacts" / "metrics.json").read_text())}


def check_gang(ranks: list[dict[str, Any]], strategy: str, accuracy: float) -> None:
    """Rank 0 evaluates, logs the epochs and uploads; every rank reports its own step times."""
    rank0, rank1 = ranks
    steps = 22 * EPOCHS  # 45 batches of 32 an epoch, one per rank a gang step: 22 gang steps
    assert rank0["spec"]["distributed"]["strategy"] == strategy
    assert rank0["artifacts"] == ["metrics.json", "model.pt"] and rank1["artifacts"] == []
    final = series(rank0, "test_accuracy")
    assert [step for step, _ in final] == [22, 44, 66]
    assert final[-1][1] >= accuracy, final
    assert not series(rank1, "test_accuracy") and not series(rank1, "loss")
    epochs0 = [line for line in rank0["logs"] if line.startswith("epoch ")]
    assert len(epochs0) == EPOCHS, rank0["logs"]
    assert not [line for line in rank1["logs"] if line.startswith(("epoch ", "done:", "training "))], rank1["logs"]
    assert any(f"on 2 workers ({strategy}, gloo; batch 32 per worker)" in line for line in rank0["logs"])
    assert f"done: mlp-digits ran {steps} steps" in rank0["logs"][-1]
    for rank, result in enumerate(ranks):
        step_ms = series(result, f"rank{rank}.step_ms")
        assert step_ms and all(value > 0 for _, value in step_ms), result["metrics"][-10:]
        assert step_ms[-1][0] == steps
        assert series(result, f"rank{rank}.loss")
        assert not series(result, f"rank{1 - rank}.step_ms")  # a rank reports only its own
    assert any("joined the gloo group at 127.0.0.1:" in line for line in rank1["logs"])


def test_ddp_trains_one_model_on_two_ranks(ddp):
    check_gang(ddp["ranks"], "ddp", accuracy=0.85)
    assert ddp["summary"]["distributed"] == {"strategy": "ddp", "world_size": 2, "backend": "gloo"}
    assert ddp["summary"]["steps"] == 66


def test_post_local_sgd_trains_one_model_on_two_ranks(tmp_path):
    spec = {**BASE, "distributed": {"strategy": "post-local-sgd", "period": 4, "warmup": 5}}
    ranks = gang_run(tmp_path, spec, "a1")
    check_gang(ranks, "post-local-sgd", accuracy=0.8)
    assert ranks[0]["spec"]["distributed"] == {"strategy": "post-local-sgd", "backend": "auto",
                                               "timeout_s": 120.0, "period": 4, "warmup": 5}


def test_a_stop_on_one_rank_stops_both_and_rank_0s_checkpoint_resumes(tmp_path, ddp, monkeypatch):
    spec = {**BASE, "distributed": {"strategy": "ddp"}}
    stopped = gang_run(tmp_path, spec, "a1", stop_rank=1)
    for result in stopped:  # both ranks stopped after the same step
        assert result["logs"][-1] == f"stopping mlp-digits at step {STOPPED_AT}/66: checkpoint saved", result["logs"]
        assert result["artifacts"] == []
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert checkpoint["step"] == STOPPED_AT and "parallel" in checkpoint
    shutil.copy(tmp_path / "checkpoint.pt", tmp_path / "stopped.pt")

    # A new attempt: a new pair of processes resumes at that step and trains to the end.
    resumed = gang_run(tmp_path, spec, "a2")
    assert any(line.startswith(f"resumed mlp-digits from the checkpoint at step {STOPPED_AT}/66")
               for line in resumed[0]["logs"]), resumed[0]["logs"]
    assert series(resumed[0], "loss")[0][0] == 20  # the first report after the checkpoint (log_every 5)
    assert series(resumed[0], "test_accuracy")[-1][1] >= 0.85
    assert resumed[0]["artifacts"] == ["metrics.json", "model.pt"] and resumed[1]["artifacts"] == []
    # An interrupted gang ends where an uninterrupted one does.
    assert_same_weights(weights(tmp_path / "artifacts" / "model.pt"), ddp["model"], atol=1e-5)

    # DDP averages the two ranks' gradients: the model at the stop is single-process training on the union of
    # their batches (rank r's batch of gang step i is batch 2i + r of 32; together, batch i of 64).
    monkeypatch.setenv("STRATA_TORCH_THREADS", "1")
    single = LocalContext(job_id="j", attempt_id="s", spec={**BASE, "batch_size": 64, "max_steps": STOPPED_AT},
                          workdir=tmp_path / "single")
    TrainComponent().run(single)
    stopped_model = torch.load(tmp_path / "stopped.pt", weights_only=False)["state"]["model"]
    assert_same_weights(weights(single.artifacts["model.pt"]), stopped_model, atol=1e-5)
