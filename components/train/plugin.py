"""The ``train`` plugin: the built-in training job kind (workloads, the step-at-a-time loop, its summary panel)."""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="train",
    version="0.1.0",
    description="Training jobs: built-in workloads or a user entrypoint, checkpointed and resumable.",
    kinds=("components.train.spec:TrainSpec",),
    panels=("components.train.panels:TrainSummaryPanel",),
    strategies=("components.train.strategies:DDP", "components.train.strategies:PostLocalSGD"),
    benchmarks={"byo": "benchmarks.train.bench_byo:main"},
)
