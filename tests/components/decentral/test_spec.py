"""The decentralized-train kind's spec, its panels and report schema, its failure policy and its participant
payload (all light: what the control plane imports)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from components.decentral.hooks import SwarmCarriesOn
from components.decentral.report import SwarmReport
from components.decentral.spec import DecentralizedTrainSpec
from components.runtime.contract.panels import StaticPanelData
from components.runtime.contract.plugins import ReportError
from components.runtime.contract.policies import LostAttempt, NodeLoss
from components.runtime.contract.spec import SpecError
from components.runtime.testing.conformance.kinds import KindSpecConformance
from components.runtime.testing.conformance.panels import PanelConformance


class TestDecentralizedTrainSpec(KindSpecConformance):
    spec_path = "components.decentral.spec:DecentralizedTrainSpec"
    valid_examples = ({}, {"model": "tiny", "peers": {"min": 3, "max": 8}, "averaging": {"period_s": 3}},
                      {"swap": {"budget_mb": 2.5}, "faults": {"corrupt": {"ranks": [1], "mode": "scale"}}})
    invalid_examples = (
        ({"model": "huge", "steps": 0, "peers": {"min": 5, "max": 2}, "averaging": {"period_s": 0.1}},
         {"spec.model", "spec.steps", "spec.peers.min", "spec.averaging.period_s"}),
        ({"faults": {"corrupt": {"ranks": ["x"], "mode": "evil"}}, "colour": 1},
         {"spec.faults.corrupt.ranks", "spec.faults.corrupt.mode", "spec.colour"}),
    )


def test_workers_above_the_swarm_maximum_are_refused():
    kind = DecentralizedTrainSpec()
    spec = kind.validate({"peers": {"min": 1, "max": 2}})
    assert "resources.workers" in kind.resource_problems(spec, {"workers": 3})
    assert kind.resource_problems(spec, {"workers": 2}) == {}
    assert kind.accepts_tokens and kind.accepts_participants and kind.elastic_ranks
    with pytest.raises(SpecError):
        kind.validate({"model": None})
    with pytest.raises(SpecError) as refused:
        kind.validate({"peers": {"max": None}, "averaging": {"period_s": None}, "swap": {"pcie_gbps": None},
                       "faults": {"corrupt": {"mode": None}}})
    assert {"spec.peers.max", "spec.averaging.period_s", "spec.swap.pcie_gbps",
            "spec.faults.corrupt.mode"} <= set(refused.value.errors)


JOB = {"id": "j1", "kind": "decentralized-train", "state": "RUNNING",
       "spec": {"model": "tiny", "swap": {"budget_mb": 1.0}}}
REPORT = {"peer": "rank0", "p2p": "12D3KooA", "maddrs": ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooA"], "epoch": 4,
          "step": 120,
          "peers": [{"name": "rank0", "p2p": "12D3KooA", "volunteer": False, "step": 120, "samples": 1920,
                     "samples_per_s": 250.0, "loss": 2.4, "test_loss": 2.5, "rounds_ok": 4, "rounds_failed": 0,
                     "maddrs": ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooA"]},
                    {"name": "volunteer-ann", "p2p": "12D3KooB", "volunteer": True, "step": 80, "samples": 1280,
                     "samples_per_s": 120.0, "loss": 2.6, "test_loss": 2.7, "rounds_ok": 3, "rounds_failed": 1,
                     "maddrs": ["/ip4/127.0.0.1/tcp/4002/p2p/12D3KooB"]}],
          "rounds": [{"round": 1, "ok": True, "members": ["rank0", "volunteer-ann"], "fingerprint": 1.5}],
          "rejections": [{"peer": "12D3KooC", "name": "rank2", "role": "sender", "problem": "3 non-finite values",
                          "at": 5.0}],
          "deadlines": {"lead_s": 1.0, "allreduce_timeout_s": 3.0, "request_timeout_s": 0.5},
          "rounds_ok": 4, "rounds_failed": 0,
          "swap": {"segments": 3, "bytes_loaded": 1000, "events": [
              {"segment": 0, "kind": "load", "start": 0.0, "end": 0.01},
              {"segment": 0, "kind": "forward", "start": 0.01, "end": 0.02},
              {"segment": 1, "kind": "load", "start": 0.012, "end": 0.025}]}}
METRICS = {"peers": [(10, 2.0, 1.0), (20, 3.0, 2.0)], "loss": [(10, 3.0, 1.0), (20, 2.5, 2.0)],
           "test_loss": [(20, 2.6, 2.0)], "peer0.samples_per_s": [(10, 240.0, 1.0), (20, 250.0, 2.0)],
           "peer1.samples_per_s": [(10, 200.0, 1.0)], "peer1.test_loss": [(20, 2.7, 2.0)]}


def data() -> StaticPanelData:
    attempts = [{"attempt": "a1", "number": 1, "job_id": "j1", "job_name": "swarm", "foreign": False,
                 "device": None, "time": 3.0, "current": True, "payload": REPORT}]
    return StaticPanelData(job=JOB, metrics=METRICS,
                           reports={"decentral": {"nodes": [], "devices": [], "attempts": attempts, "series": []}})


class _Panel(PanelConformance):
    job_view: ClassVar[dict] = JOB

    def data(self):
        return data()


class TestSwarmPeersPanel(_Panel):
    panel_path = "components.decentral.panels:SwarmPeersPanel"


class TestPeerThroughputPanel(_Panel):
    panel_path = "components.decentral.panels:PeerThroughputPanel"


class TestSwarmLossPanel(_Panel):
    panel_path = "components.decentral.panels:SwarmLossPanel"


class TestSwapTimelinePanel(_Panel):
    panel_path = "components.decentral.panels:SwapTimelinePanel"


def test_the_peers_panel_lists_volunteers_and_dropped_updates():
    from components.decentral.panels import SwarmPeersPanel

    rendered = SwarmPeersPanel().render(data())
    rows = rendered["table"]["rows"]
    assert ["volunteer-ann", "volunteer"] == rows[1][:2]
    assert any(str(row[0]).startswith("dropped: rank2") for row in rows)


def test_a_volunteer_gets_every_live_peers_address():
    payload = DecentralizedTrainSpec().participant_payload(DecentralizedTrainSpec().validate({}), data())
    assert payload["initial_peers"][0] == "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooA"
    assert "/ip4/127.0.0.1/tcp/4002/p2p/12D3KooB" in payload["initial_peers"]
    assert payload["peers"] == 2
    assert DecentralizedTrainSpec().participant_payload({"peers": {"max": 4}},
                                                        StaticPanelData(job=JOB))["initial_peers"] == []


def test_the_report_schema_refuses_nan_and_oversized_lists():
    assert SwarmReport().attempt(REPORT)["epoch"] == 4
    with pytest.raises(ReportError):
        SwarmReport().attempt({**REPORT, "epoch": float("nan")})
    with pytest.raises(ReportError):
        SwarmReport().attempt({**REPORT, "peers": [{}] * 300})
    with pytest.raises(ReportError):
        SwarmReport().attempt({"peers": []})


def test_a_lost_node_with_some_peers_is_not_retried():
    hook = SwarmCarriesOn()
    lost = LostAttempt(job_id="j", attempt_id="a", team_id=1, kind="decentralized-train", number=1, node="n2",
                       primary=False, nodes_left=1)
    assert hook.on_node_loss(lost) == NodeLoss.CARRY_ON
    assert hook.on_node_loss(LostAttempt(**{**lost.__dict__, "primary": True})) == NodeLoss.REQUEUE
