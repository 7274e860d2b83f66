"""The ``straggler`` plugin: data-parallel training that shrugs off stragglers.

- SMS (``distributed: {strategy: sms}``): stragglers predicted each step from step-time history and load; a
  predicted straggler's batch shrinks to one weighted sample per near-duplicate cluster; gradient chunks that
  barely changed are not sent, with error feedback.
- Stanza (``distributed: {strategy: stanza}``): layer separation for CNNs with large fully connected layers.
- SAS: a node service predicts each node's near-future availability; a placement hook groups nodes by it
  (KMeans) and sends a gang to the group most likely to keep up.

Training itself is train's distributed runtime (``spec.distributed``); this plugin adds strategies, the
availability service and hook, panels, a report schema and ``strata bench straggler``.
"""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="straggler",
    version="0.1.0",
    requires=("train",),
    description="Straggler mitigation for data-parallel training: SMS (predicted stragglers shed near-duplicate "
                "samples; gradient transfer control), Stanza (layer separation) and SAS (availability-aware "
                "gang placement).",
    strategies=("components.straggler.strategies:SMSStrategy", "components.straggler.stanza_strategy:StanzaStrategy"),
    panels=("components.straggler.panels:StepTimeHeatmapPanel", "components.straggler.panels:PredictedStragglersPanel",
            "components.straggler.panels:SavingsPanel", "components.straggler.panels:NodeGroupsPanel"),
    reports="components.straggler.report:StragglerReport",
    hooks=("components.straggler.hooks:AvailabilityAwarePlacement",),
    node_services=("components.straggler.availability:AvailabilityService",),
    benchmarks={"straggler": "benchmarks.straggler.bench:main"},
)
