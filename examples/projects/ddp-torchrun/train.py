"""A plain PyTorch DDP training script, written for torchrun and run unchanged on Strata.

    torchrun --nproc-per-node 2 train.py --epochs 5          # on a workstation
    strata submit job.yaml --wait                            # on Strata: the same file (job.yaml: code: .)

It reads only what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): Strata sets the same on
every rank of a `workers: N` job. Data: scikit-learn's bundled handwritten digits (1,797 8x8 images), sharded by
rank. It resumes from ./checkpoint (or STRATA_CHECKPOINT_DIR, which Strata saves and restores across attempts),
and prints one `strata: ...` line per epoch, which Strata records as metrics (elsewhere it is just a line).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from tabulate import tabulate  # the one requirement (requirements.txt): installed into the job's environment
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def data(rank: int, world: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, test = order[:1500], order[1500:]
    mine = train[rank::world]  # each rank its own shard, as a DistributedSampler would give it
    return x[mine], y[mine], x[test], y[test]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epoch-seconds", type=float, default=0.0, help="sleep per epoch (a longer demo)")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y, x_test, y_test = data(rank, world)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if backend == "nccl" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    checkpoints = Path(os.environ.get("STRATA_CHECKPOINT_DIR", "checkpoint"))
    checkpoints.mkdir(parents=True, exist_ok=True)
    start = 0
    if (checkpoints / "state.pt").exists():
        state = torch.load(checkpoints / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
        if rank == 0:
            print(f"resumed at epoch {start}", flush=True)

    rows = []
    for epoch in range(start, args.epochs):
        started = time.perf_counter()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        total = 0.0
        steps = max(1, len(x) // args.batch_size)
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x[batch].to(device)), y[batch].to(device))
            loss.backward()
            optimizer.step()
            total += loss.item()
        seconds = time.perf_counter() - started
        time.sleep(args.epoch_seconds)
        with torch.no_grad():
            accuracy = (model(x_test.to(device)).argmax(1).cpu() == y_test).float().mean().item()
        if rank == 0:
            print(f"strata: step={epoch + 1} loss={total / steps:.4f} accuracy={accuracy:.4f} "
                  f"step_seconds={seconds / steps:.6f}", flush=True)
            rows.append([epoch + 1, f"{total / steps:.4f}", f"{accuracy:.4f}"])
            temporary = checkpoints / "state.pt.tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                       temporary)
            temporary.replace(checkpoints / "state.pt")
    if rank == 0:
        print(tabulate(rows, headers=["epoch", "loss", "accuracy"]), flush=True)
        output = Path(os.environ.get("STRATA_OUTPUT_DIR", "output"))
        output.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), output / "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
