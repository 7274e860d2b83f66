"""train's distributed strategies against the strategies conformance suite."""

from __future__ import annotations

from components.runtime.testing.conformance.strategies import StrategyConformance


class TestDDP(StrategyConformance):
    strategy_path = "components.train.strategies:DDP"
    valid_options = ({}, {"bucket_mb": 4}, {"bucket_mb": 1024})
    invalid_options = ({"bucket_mb": 0}, {"bucket_mb": "big"}, {"bucket_mb": True})


class TestPostLocalSGD(StrategyConformance):
    strategy_path = "components.train.strategies:PostLocalSGD"
    valid_options = ({}, {"period": 1, "warmup": 0}, {"period": 16, "warmup": 100})
    invalid_options = ({"period": 0}, {"warmup": -1}, {"period": 2.5})
