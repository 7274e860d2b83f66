"""A training script that reports its accuracy to a Strata tune sweep, one value per epoch.

    python train.py --lr 0.05                                # anywhere: prints `strata: ...` lines
    strata submit sweep.yaml --wait                          # a sweep of it on Strata ({{lr}} in the command)

strata_report is importable in every command job (outside Strata the script prints the same line itself).
Data: scikit-learn's bundled handwritten digits.
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn

try:
    import strata_report
except ImportError:  # not on Strata
    strata_report = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        for start in range(0, len(x_train), 50):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x_train[start:start + 50]), y_train[start:start + 50])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if strata_report is not None:
            strata_report.report(step=epoch, accuracy=accuracy, loss=loss.item())
        else:
            print(f"strata: step={epoch} accuracy={accuracy:.4f} loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
