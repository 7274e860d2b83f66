"""An example user model for ``serve`` jobs given ``model.entrypoint`` (the contract: a class with ``load(path)``,
``predict(batch)``, ``input_shape``, ``input_dtype`` and ``output_shape``; see docs/components/serving.md).

``LinearModel`` serves the ``model.pt`` of a train job that ran ``components.train.examples:linear_workload``: it
reads the weights of its ``nn.Linear`` from the file and answers ``x @ w.T + b`` with numpy alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class LinearModel:
    input_shape = (8,)
    input_dtype = "float32"
    output_shape = (1,)
    output_dtype = "float32"

    def load(self, path: Path) -> None:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        self.weight = state["weight"].numpy().astype(np.float32)  # [1, 8]
        self.bias = state["bias"].numpy().astype(np.float32)  # [1]
        self.input_shape = (int(self.weight.shape[1]),)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        return batch.astype(np.float32) @ self.weight.T + self.bias
