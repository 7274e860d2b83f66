"""Conformance suite for a distributed-training strategy (the manifest's ``strategies`` seam,
:class:`components.runtime.contract.distributed.Strategy`).

Subclass it with the strategy's path and real option sets::

    class TestMyStrategy(StrategyConformance):
        strategy_path = "my_plugin.strategies:MyStrategy"
        valid_options = ({}, {"interval": 4})
        invalid_options = ({"interval": 0},)

It checks that the strategy's module is light (the control plane checks specs with it) and its node-side
``runtime`` path names a :class:`~components.runtime.contract.distributed.StrategyRuntime` subclass; that its name, options
and ``min_workers`` are well formed; that every valid option set gives no problem and defaults that are valid and
idempotent, and the ``distributed`` value they make passes the spec check with the strategy installed; that every
invalid set gives problems naming only the strategy's own options; and that :meth:`check_workers` answers a string
or None for one rank up to many, with no exception (a spec check must never be a 500).
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar

from components.runtime.contract.plugins import NAME_RE
from components.runtime.contract.registry import import_path
from components.runtime.testing.conformance.kinds import light_import_problem


class StrategyConformance:
    strategy_path: ClassVar[str] = ""
    valid_options: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    invalid_options: ClassVar[tuple[dict[str, Any], ...]] = ()

    def strategy(self):
        from components.runtime.contract.distributed import Strategy

        strategy_class = import_path(self.strategy_path)
        assert isinstance(strategy_class, type) and issubclass(strategy_class, Strategy)
        return strategy_class()

    def test_it_is_light_and_names_a_runtime(self):
        from components.runtime.contract.distributed import StrategyRuntime

        assert light_import_problem(self.strategy_path.split(":")[0]) is None
        runtime = import_path(self.strategy().runtime)
        assert isinstance(runtime, type) and issubclass(runtime, StrategyRuntime)

    def test_it_is_well_formed(self):
        from components.runtime.contract.distributed import COMMON_OPTIONS

        strategy = self.strategy()
        assert isinstance(strategy.name, str) and NAME_RE.match(strategy.name)
        assert isinstance(strategy.description, str) and strategy.description
        assert isinstance(strategy.options, frozenset) and all(isinstance(o, str) for o in strategy.options)
        assert not strategy.options & COMMON_OPTIONS, "a strategy's own options may not shadow the common ones"
        assert isinstance(strategy.min_workers, int) and strategy.min_workers >= 1

    def test_valid_options_give_valid_idempotent_defaults(self):
        strategy = self.strategy()
        for options in self.valid_options:
            kept = copy.deepcopy(options)
            assert strategy.validate(copy.deepcopy(options)) == {}, options
            filled = strategy.defaults(copy.deepcopy(options))
            assert options == kept, "defaults() changed its argument"
            assert json.loads(json.dumps(filled)) == filled
            assert set(filled) <= strategy.options
            assert strategy.validate(copy.deepcopy(filled)) == {}
            assert strategy.defaults(copy.deepcopy(filled)) == filled

    def test_the_spec_check_accepts_the_valid_options(self):
        from components.runtime.contract.distributed import distributed_errors, normalize, strategies

        strategy = self.strategy()
        if strategy.name not in strategies():
            return  # not installed in this environment: the registry's own tests cover installed ones
        for options in self.valid_options:
            value = {"strategy": strategy.name, **options}
            assert distributed_errors(value) == {}, value
            normalized = normalize(value)
            assert distributed_errors(normalized) == {}
            assert normalize(normalized) == normalized

    def test_invalid_options_give_problems_named_by_option(self):
        strategy = self.strategy()
        for options in self.invalid_options:
            problems = strategy.validate(copy.deepcopy(options))
            assert problems, f"{options} should be refused"
            assert all(isinstance(key, str) and isinstance(message, str) and message
                       for key, message in problems.items())

    def test_check_workers_answers_for_any_gang_size(self):
        strategy = self.strategy()
        for options in self.valid_options:
            filled = strategy.defaults(copy.deepcopy(options))
            for workers in (1, 2, 3, 8, 64):
                answer = strategy.check_workers(filled, workers)
                assert answer is None or (isinstance(answer, str) and answer)
