"""The datacache plugin's parts against the conformance suites shipped with the contracts."""

from __future__ import annotations

from typing import ClassVar

from components.datacache.datasets import DEFAULT_AUGMENT, Datasets, definition, pipeline_id
from components.datacache.hooks import PreferCachedPipeline
from components.runtime.contract.panels import StaticPanelData
from components.runtime.contract.policies import Candidate, QueuedJob
from components.runtime.testing.conformance.collections import CollectionConformance
from components.runtime.testing.conformance.data import DataProviderConformance
from components.runtime.testing.conformance.panels import PanelConformance
from components.runtime.testing.conformance.policies import PlacementScoreConformance
from components.runtime.testing.conformance.services import NodeServiceConformance

PETS = {"name": "pets", "source": {"path": "/data/pets"}, "format": "image-folder"}


class TestDatasets(CollectionConformance):
    collection_path = "components.datacache.datasets:Datasets"
    good = (PETS, {**PETS, "name": "grey", "channels": 1, "size": 48, "augment": None, "test_fraction": 0.1},
            {**PETS, "name": "arrays", "format": "npz", "source": {"path": "/data/arrays.npz"},
             "augment": {**DEFAULT_AUGMENT, "rotate": 0.0}})
    # An explicit null for a number (found by the API fuzzer: a null augment.blur was a 500) is refused too.
    bad = ({"name": "x"}, {**PETS, "size": 2}, {**PETS, "source": {"path": "data"}}, {**PETS, "task": "ranking"},
           {**PETS, "augment": {"blur": None}}, {**PETS, "size": None}, {**PETS, "test_fraction": None})
    path_fields = ("source.path",)  # a dataset's path must lie under a data root granted to the team


class TestDataCacheProvider(DataProviderConformance):
    provider_path = "components.datacache.provider:DataCacheProvider"
    good = ({"cache": True}, {"cache": False, "workers": 0}, {"dataset": "shapes-jpeg", "perfect": {}},
            {"dataset": "digits", "cache": True, "perfect": {"reuse": 3, "switch": 0.5, "target": 0.9}})
    bad = ({"cache": "yes"}, {"workers": 99}, {"perfect": {}}, {"dataset": "corpus"},
           {"dataset": "d", "perfect": {"reuse": 0}}, {"dataset": 5})


class TestDataCacheService(NodeServiceConformance):
    service_path = "components.datacache.service:DataCacheService"
    plugin = "datacache"


PIPELINE = pipeline_id(definition({"name": "pets", **Datasets().validate(PETS)}))


class TestPreferCachedPipeline(PlacementScoreConformance):
    hook_path = "components.datacache.hooks:PreferCachedPipeline"

    def job(self) -> QueuedJob:
        record = Datasets().validate(PETS)
        return QueuedJob(id="job", team_id=1, kind="train", priority=0, queued_at=1.0,
                         spec={"data": {"dataset": {"name": "pets", "definition": definition(record)}}})

    def candidates(self) -> list[Candidate]:
        entries = [{"pipeline": PIPELINE, "bytes": 10}] * 3
        return [Candidate(rank=0, node_id=f"node-{n}", node=f"n{n}", labels={}, devices=(0,), share=1.0,
                          memory=1, free_share=1.0, free_memory=1, memory_total=1,
                          reports={"datacache": {"entries": entries if n == 1 else [{"pipeline": "other"}]}})
                for n in range(3)]


def test_nodes_holding_the_pipeline_score_better_and_others_are_not_excluded():
    hook, case = PreferCachedPipeline(), TestPreferCachedPipeline()
    scores = [hook.score(case.job(), candidate) for candidate in case.candidates()]
    assert scores[1] < scores[0] == scores[2] == 0.0
    plain = QueuedJob(id="j", team_id=1, kind="train", priority=0, queued_at=1.0, spec={"workload": "mlp-digits"})
    assert {hook.score(plain, candidate) for candidate in case.candidates()} == {0.0}


class _Panel(PanelConformance):
    def data(self):
        return StaticPanelData(job=self.job_view, metrics=self.series, reports=self.reports)

    job_view: ClassVar[dict] = {"id": "j", "kind": "train", "state": "RUNNING",
                           "spec": {"workload": "cnn-dataset", "data": {"dataset": "shapes-jpeg", "perfect": {}}}}
    series: ClassVar[dict] = {
        "data_phase": [(10, 1.0, 1.0), (20, 1.0, 2.0), (30, 2.0, 3.0)],
        "data_reuse": [(10, 2.0, 1.0), (20, 2.0, 2.0), (30, 2.0, 3.0)],
        "data_variant": [(10, 0.0, 1.0), (20, 0.0, 2.0), (30, 2.0, 3.0)],
        "data_cache_hit": [(10, 0.0, 1.0), (20, 1.0, 2.0), (30, 0.0, 3.0)],
        "data_wait_s": [(10, 1.5, 1.0), (20, 0.0, 2.0), (30, 0.4, 3.0)],
        "data_samples_per_s": [(10, 900.0, 1.0), (20, 950.0, 2.0), (30, 880.0, 3.0)],
        "compute_samples_per_s": [(10, 2100.0, 1.0), (20, 2000.0, 2.0), (30, 2050.0, 3.0)],
        "test_accuracy": [(10, 0.4, 1.0), (20, 0.6, 2.0), (30, 0.7, 3.0)],
    }
    node_report: ClassVar[dict] = {"time": 5.0, "bytes": 2 << 20, "budget": 1 << 30, "hits": 3, "misses": 1,
                                   "evictions": 0, "corrupt": 0, "uncached": 0,
                                   "entries": [{"key": "k", "dataset": "pets", "pipeline": PIPELINE,
                                                "part": "variant-0", "bytes": 2 << 20, "hits": 3,
                                                "last_used": 5.0, "build_seconds": 1.0}]}
    reports: ClassVar[dict] = {"datacache": {"nodes": [{"node": "n1", "node_id": "1", "time": 5.0,
                                                        "payload": node_report}],
                                             "devices": [], "attempts": [], "series": []}}


class TestDataStagePanel(_Panel):
    panel_path = "components.datacache.panels:DataStagePanel"


class TestPhaseTimelinePanel(_Panel):
    panel_path = "components.datacache.panels:PhaseTimelinePanel"


class TestCacheHitRatePanel(_Panel):
    panel_path = "components.datacache.panels:CacheHitRatePanel"


class TestCacheContentsPanel(_Panel):
    panel_path = "components.datacache.panels:CacheContentsPanel"
