"""The straggler plugin's strategies (SMS, Stanza) against the strategies conformance suite."""

from __future__ import annotations

from components.runtime.testing.conformance.strategies import StrategyConformance


class TestSMS(StrategyConformance):
    strategy_path = "components.straggler.strategies:SMSStrategy"
    valid_options = ({}, {"threshold": 0.5, "min_keep": 0.5}, {"dedup": False, "transfer_control": False},
                     {"eps": 0.0, "chunk": 16})
    invalid_options = ({"threshold": 0}, {"min_keep": 2}, {"eps": -1}, {"chunk": 3})


class TestStanza(StrategyConformance):
    strategy_path = "components.straggler.stanza_strategy:StanzaStrategy"
    valid_options = ({}, {"fc_workers": 2})
    invalid_options = ({"fc_workers": 0}, {"fc_workers": "one"})
