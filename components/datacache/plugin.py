"""The ``datacache`` plugin: cached preprocessing (PerFect). A node service keeps preprocessed samples on
node-local disk, shared by every job on the node; a data provider streams epochs to train's ``cnn-dataset``
workload (``data: {dataset, cache, perfect}``); datasets are a collection at ``/api/v1/datasets/``."""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="datacache",
    version="0.1.0",
    description="Cached preprocessing (PerFect): a node-local cache of preprocessed samples shared by every job "
                "on the node, and training on reused cached epochs, then fine-tuning on fresh data.",
    panels=("components.datacache.panels:DataStagePanel", "components.datacache.panels:PhaseTimelinePanel",
            "components.datacache.panels:CacheHitRatePanel", "components.datacache.panels:CacheContentsPanel"),
    reports="components.datacache.report:DataCacheReport",
    hooks=("components.datacache.hooks:PreferCachedPipeline",),
    commands=("components.datacache.commands:DatasetsCommand",),
    node_services=("components.datacache.service:DataCacheService",),
    data_providers=("components.datacache.provider:DataCacheProvider",),
    collections={"datasets": "components.datacache.datasets:Datasets"},
    benchmarks={"datacache": "benchmarks.datacache.bench:main"},
)
