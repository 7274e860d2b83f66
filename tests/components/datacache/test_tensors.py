"""``data: {cache: true}`` for the workloads that prepare whole tensors (mlp-digits, tiny-gpt ...): the node cache
keeps what ``prepare`` builds, so a second job on the node reads it instead of building it."""

from __future__ import annotations

import torch

from components.datacache.provider import DataCacheProvider
from components.datacache.store import CacheStore
from components.runtime.contract.data import Memo, prepare


def test_prepared_tensors_are_cached_and_read_back_identical(cache_dir):
    builds = []

    def build():
        builds.append(1)
        return torch.arange(12, dtype=torch.float32).reshape(3, 4), torch.tensor([1, 0, 2])

    recipe = {"dataset": "toy", "pipeline": "arange", "version": 1}
    first = prepare(recipe, build, {"cache": True}, providers=[DataCacheProvider()], memo=Memo(0))
    second = prepare(recipe, build, {"cache": True}, providers=[DataCacheProvider()], memo=Memo(0))
    assert builds == [1], "the second read comes from the node cache"
    assert isinstance(second, tuple) and len(second) == 2
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1]) and second[1].dtype == torch.int64
    assert CacheStore(cache_dir).stats()["entries"] == 1
    # Without the option the provider stays out of the way.
    prepare(recipe, build, {}, providers=[DataCacheProvider()], memo=Memo(0))
    assert builds == [1, 1]


def test_the_builtin_workloads_read_their_prepared_data_through_the_cache(cache_dir):
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    spec = TrainSpec().validate({"workload": "mlp-digits", "data": {"cache": True}})
    builtin_workload("mlp-digits").setup(spec, torch.device("cpu"))
    entries = CacheStore(cache_dir).entries()
    assert [entry["part"] for entry in entries] == ["prepared"] and entries[0]["dataset"] == "sklearn-digits"
