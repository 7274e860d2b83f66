"""The ``gpushare`` plugin: GPU sharing (Salus, SwitchFlow). Not a job kind: it runs a sharing service per
device, reports what the services do, shows it on the job and cluster pages, lends what they measured to the
scheduler (a shared job reserves its measured memory), and measures itself."""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="gpushare",
    version="0.1.0",
    requires=("train",),
    description="Several jobs on one GPU: memory admission, fast switching at iteration boundaries.",
    panels=("components.gpushare.panels:GpuShareTimelinePanel", "components.gpushare.panels:GpuShareJobPanel"),
    node_services=("components.gpushare.node:DeviceSharingService",),
    reports="components.gpushare.report:GpuShareReport",
    hooks=("components.gpushare.scheduling:LendMeasuredMemory",),
    benchmarks={"gpushare": "benchmarks.gpushare.bench:main"},
)
