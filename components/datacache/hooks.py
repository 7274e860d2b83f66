"""The scheduler's locality preference: place a job where the node's cache already holds its pipeline.

A :class:`~components.runtime.contract.policies.PlacementScore` hook: among the places that fit a job *now*, nodes whose
datacache report lists entries of the job's pipeline score lower (better), more entries lower still. It only
orders places that fit; it never keeps a job waiting for a particular node, so locality is a preference and
never a reason to wait.
"""

from __future__ import annotations

from components.datacache.datasets import PLUGIN, dataset_pipeline
from components.runtime.contract.policies import Candidate, PlacementScore, QueuedJob


class PreferCachedPipeline(PlacementScore):
    kinds = None  # any job whose spec's data names a dataset (train, tune ...)
    reads = PLUGIN  # no node reports this plugin: no opinion, the pass builds no candidates for it

    def wants(self, job: QueuedJob) -> bool:
        return dataset_pipeline(job.spec) is not None  # a job naming no dataset gets the core's best fit

    def score(self, job: QueuedJob, candidate: Candidate) -> float:
        pipeline = dataset_pipeline(job.spec)
        if pipeline is None:
            return 0.0
        report = candidate.reports.get(PLUGIN) or {}
        held = sum(1 for entry in report.get("entries", []) if entry.get("pipeline") == pipeline)
        return -(1.0 + min(held, 100) / 100.0) if held else 0.0
