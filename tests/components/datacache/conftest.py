"""Every datacache test gets a cache directory of its own (``STRATA_DATACACHE_DIR``), so no test reads another's."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    root = tmp_path / "datacache"
    monkeypatch.setenv("STRATA_DATACACHE_DIR", str(root))
    monkeypatch.setenv("STRATA_DATACACHE_BYTES", str(1 << 30))
    return root


@pytest.fixture
def npz_dataset(tmp_path):
    """A small colour image dataset as an .npz (x uint8 [n, 20, 20, 3], y in 3 classes): quick to preprocess."""
    rng = np.random.default_rng(5)
    count = 120
    y = rng.integers(0, 3, count)
    x = rng.integers(0, 60, (count, 20, 20, 3)).astype(np.uint8)
    for index, label in enumerate(y):  # a class-coloured square: learnable
        x[index, 5:15, 5:15, label] = 230
    path = tmp_path / "small.npz"
    np.savez(path, x=x, y=y)
    return path


def _definition_of(path, **extra):
    from components.datacache.datasets import Datasets, definition

    record = Datasets().validate({"name": "small", "source": {"path": str(path)}, "format": "npz", "size": 16,
                                  **extra})
    return definition(record)


@pytest.fixture
def definition_of():
    """``definition_of(path, **fields)``: the pipeline definition of a dataset registered at ``path``."""
    return _definition_of
