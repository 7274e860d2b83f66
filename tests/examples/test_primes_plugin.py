"""The example plugin (examples/plugins/strata-primes): its parts work, and it registers with no problem."""

from __future__ import annotations

import json

import pytest

from components.runtime.contract import registry
from components.runtime.contract.context import LocalContext
from components.runtime.contract.plugins import ReportError
from components.runtime.contract.spec import SpecError


def test_the_segmented_sieve_agrees_with_trial_division():
    from strata_primes.sieve import base_primes, count_segment, count_trial_division

    assert base_primes(30) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
    primes = base_primes(400)
    total, low = 0, 2
    while low < 100_000:  # 100,000 = 2..99,999 in uneven segments
        high = min(low + 7_919, 100_000)
        total += count_segment(low, high, primes)[0]
        low = high
    assert total == count_trial_division(100_000) == 9592
    assert count_segment(90, 100, primes) == (1, 97)
    assert count_segment(24, 29, primes) == (0, 0)


def test_the_spec_names_every_bad_field():
    from strata_primes.spec import PrimesSpec

    assert PrimesSpec().validate({"limit": 1000}) == {"limit": 1000, "segment": 100_000, "checkpoint_every": 5}
    with pytest.raises(SpecError) as caught:
        PrimesSpec().validate({"segment": 10, "checkpoint_every": None, "colour": "red"})
    assert set(caught.value.errors) == {"spec.limit", "spec.segment", "spec.checkpoint_every", "spec.colour"}


def test_the_job_counts_checkpoints_stops_and_resumes(tmp_path):
    from strata_primes.component import PrimesComponent
    from strata_primes.spec import PrimesSpec

    spec = PrimesSpec().validate({"limit": 200_000, "segment": 10_000, "checkpoint_every": 2})
    first = LocalContext(job_id="j", attempt_id="a1", spec=spec, workdir=tmp_path)
    stops = iter([False] * 7 + [True])
    first.should_stop = lambda: next(stops)  # stop before the 8th segment
    PrimesComponent().run(first)
    assert "result.json" not in first.artifacts
    assert [step for name, _, step in first.metric_points if name == "primes_found"] == list(range(1, 8))
    second = LocalContext(job_id="j", attempt_id="a2", spec=spec, workdir=tmp_path)
    PrimesComponent().run(second)  # resumes from the checkpoint taken at the stop
    assert json.loads(second.artifacts["result.json"].read_text()) == {"limit": 200_000, "count": 17984,
                                                                       "largest": 199_999}
    steps = [step for name, _, step in second.metric_points if name == "primes_found"]
    assert steps == list(range(8, 21))


def test_the_report_schema_refuses_bad_payloads():
    from strata_primes.report import ScratchDiskReport

    schema = ScratchDiskReport()
    assert schema.node({"disk_free": 5, "disk_total": 10, "load1": 0.5}) == {"disk_free": 5, "disk_total": 10,
                                                                            "load1": 0.5}
    with pytest.raises(ReportError) as caught:
        schema.node({"disk_free": -1, "disk_total": 1.5, "load1": float("nan"), "extra": 1})
    assert set(caught.value.errors) == {"disk_free", "disk_total", "load1", "extra"}
    with pytest.raises(ReportError):
        schema.attempt({})


def test_the_plugin_registers_every_seam_without_a_problem(install_plugins):
    install_plugins("strata_primes.plugin:PLUGIN")
    assert "primes" not in registry.problems(), registry.problems()
    loaded = registry.plugins()["primes"]
    assert set(loaded.kinds) == {"primes"}
    assert "primes" in registry.commands() and registry.benchmarks()["primes"] == "strata_primes.bench:main"
    assert ("primes", "strata_primes.service:ScratchDiskService") in registry.node_services()
    assert registry.report_schema("primes") is not None


# -- the conformance suites shipped beside the contracts ----------------------------------------------------

from components.runtime.testing.conformance.services import NodeServiceConformance  # noqa: E402


class TestScratchDiskServiceConformance(NodeServiceConformance):
    service_path = "strata_primes.service:ScratchDiskService"
    plugin = "primes"

    def kill(self, service) -> bool:
        import shutil

        shutil.rmtree(service.state_dir)  # its directory vanishes: check() turns false, start() recreates it
        return True


def test_the_benchmark_writes_the_common_document(tmp_path, capsys):
    import json

    from strata_primes.bench import main

    from benchmarks.benchkit import validate_document

    output = tmp_path / "primes.json"
    assert main(quick=True, output=str(output)) == 0
    document = json.loads(output.read_text())
    assert validate_document(document) == []
    figure = document["figures"]["count_time"]
    assert document["details"] == {"limit": 20_000, "primes": 2262}
    assert figure["ratio"] == figure["baseline"] / figure["mechanism"] and len(figure["runs"]["mechanism"]) == 3
    assert "count_time" not in capsys.readouterr().err


from components.runtime.testing.conformance.kinds import KindSpecConformance  # noqa: E402
from components.runtime.testing.conformance.panels import PanelConformance, StaticData  # noqa: E402


class TestPrimesSpecConformance(KindSpecConformance):
    spec_path = "strata_primes.spec:PrimesSpec"
    valid_examples = ({"limit": 1000}, {"limit": 10**9, "segment": 1000, "checkpoint_every": 1})
    invalid_examples = (({"limit": 5, "segment": 0}, {"spec.limit", "spec.segment"}), ({}, {"spec.limit"}))


class TestPrimesPanelConformance(PanelConformance):
    panel_path = "strata_primes.panels:PrimesPanel"

    def data(self):
        return StaticData(job={"kind": "primes", "spec": {"limit": 200_000}},
                          metrics={"primes_found": [(1, 1229.0, 0.0), (2, 2262.0, 1.0)],
                                   "progress": [(2, 0.1, 1.0)], "numbers_per_s": [(2, 1e6, 1.0)]})


class TestScratchDiskPanelConformance(PanelConformance):
    panel_path = "strata_primes.panels:ScratchDiskPanel"

    def data(self):
        return StaticData(reports={"primes": {"nodes": [{"node": "n1", "time": 0.0, "payload": {
            "disk_free": 2**30, "disk_total": 2**32, "load1": 0.5}}]}})


from components.runtime.testing.conformance.policies import QueueOrderConformance  # noqa: E402


class TestSmallestLimitFirstConformance(QueueOrderConformance):
    hook_path = "strata_primes.hooks:SmallestLimitFirst"
    specs = ({"limit": 500}, {"limit": 20}, {"limit": 100})

    def test_smaller_sieves_go_first(self):
        from components.runtime.contract.policies import reorder

        order = [job.spec["limit"] for job in reorder(self.jobs(), [self.hook()]) if job.kind == "primes"]
        assert order == [20, 100, 500, 20, 100, 500]


def test_the_subscriber_logs_primes_transitions_only(caplog):
    import logging

    from strata_primes.events import on_event

    from components.runtime.contract.events import AttemptEnded, JobTransitioned

    with caplog.at_level(logging.INFO, logger="strata_primes"):
        on_event(JobTransitioned(job_id="j1", team_id=1, kind="primes", source="QUEUED", target="SCHEDULED",
                                 reason="placed"))
        on_event(JobTransitioned(job_id="j2", team_id=1, kind="train", source=None, target="PENDING"))
        on_event(AttemptEnded(attempt_id="a", job_id="j1", kind="primes", number=1, outcome="succeeded"))
    assert [record.getMessage() for record in caplog.records] == ["primes job j1: QUEUED -> SCHEDULED (placed)"]
