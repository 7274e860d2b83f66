"""decentral's report schema against the ReportSchemaConformance suite, with the reports rank 0 of a swarm
publishes (``SwarmPeer.report_payload()`` through ``ctx.report("decentral", ...)``): one early in training, one
with averaging rounds (failed and applied) and a layer-swapping timeline (reused from test_spec), and one whose
timeline comes from a real swapped model."""

from __future__ import annotations

import json

import pytest
from support import sibling_module

from components.runtime.contract.plugins import ReportError
from components.runtime.testing.conformance.reports import ReportSchemaConformance


def _sibling(name: str):
    return sibling_module(__file__, name)


REPORT = _sibling("test_spec").REPORT
DEADLINES = {"lead_s": 1.0, "allreduce_timeout_s": 3.0, "request_timeout_s": 0.5}
# Before the first averaging round: the peer's own record (no loss yet), nothing rounded, rejected or swapped.
EARLY = {"peer": "rank0", "p2p": "12D3KooA", "maddrs": ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooA"], "epoch": 0,
         "step": 3,
         "peers": [{"name": "rank0", "p2p": "12D3KooA", "volunteer": False, "step": 3, "samples": 48,
                    "samples_per_s": 0.0, "loss": None, "test_loss": None, "rounds_ok": 0, "rounds_failed": 0}],
         "rounds": [], "rejections": [], "deadlines": DEADLINES, "rounds_ok": 0, "rounds_failed": 0}
# SwarmPeer._finish_round's records: a round that gathered no group, and one applied.
ROUNDS = {**REPORT, "rounds": [
    {"round": 7, "peers": 2, "deadlines": DEADLINES, "ok": False, "error": "no group", "at": 1700000000.0},
    {"round": 8, "peers": 2, "deadlines": DEADLINES, "ok": True, "members": ["rank0", "volunteer-ann"], "size": 2,
     "group": "0123456789ab", "fingerprint": -12.625, "duration_s": 0.412, "at": 1700000002.5}],
    "rounds_ok": 1, "rounds_failed": 1}


@pytest.fixture
def one_torch_thread():
    """One intra-op thread (restored afterwards), as test_swap runs its small models."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class TestSwarmReportSchema(ReportSchemaConformance):
    report_path = "components.decentral.report:SwarmReport"
    node_payloads = ()  # nodes report nothing to decentral: node() keeps the default refusal
    attempt_payloads = (EARLY, REPORT, ROUNDS)

    def test_a_real_swap_timeline_conforms(self, one_torch_thread):
        from components.decentral.model import Corpus, ModelConfig, build_model, lm_loss, model_layers
        from components.decentral.swap import (
            DeviceMemory,
            HostLink,
            SwappedModel,
            evaluate_plan,
            profile_layers,
        )

        config = ModelConfig.named("tiny")
        model = build_model(config, 0)
        layers, corpus, link = model_layers(model), Corpus(0, context=config.context), HostLink("cpu")
        inputs, targets = corpus.batch(0, 0, 4)
        profiles = profile_layers(layers, inputs, device="cpu", link=link, repeats=1, targets=targets,
                                  loss_fn=lm_loss)
        plan = evaluate_plan(profiles, [(0, 1), (1, 2), (2, 3), (3, 4)])
        with SwappedModel(layers, plan, link=link, memory=DeviceMemory(plan.budget_bytes)) as swapped:
            for step in range(2):
                swapped.train_step(*corpus.batch(0, step, 4), lm_loss)
            summary = json.loads(json.dumps(swapped.timeline_summary()))  # as it goes over the wire
        assert summary["steps"] and summary["plan"]["segments"]
        self.attempt_payloads = ({**REPORT, "swap": summary},)
        self.test_real_payloads_are_accepted_and_normalizing_is_idempotent()
        kept = self.schema().attempt({**REPORT, "swap": summary})["swap"]
        description = summary["plan"]["description"]  # the plan's text is cut to 256 characters, as documented
        assert kept["plan"]["description"] == description[:256]
        assert {**kept, "plan": {**kept["plan"], "description": description}} == summary  # nothing else

    def test_nodes_report_nothing(self):
        with pytest.raises(ReportError, match="takes no node reports"):
            self.schema().node(REPORT)

    def test_an_integer_too_large_for_a_float_is_a_report_error(self):
        with pytest.raises(ReportError):
            self.schema().attempt({**REPORT, "step": 10**400})
