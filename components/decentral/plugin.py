"""The ``decentral`` plugin: decentralized training on hivemind (Atom).

- Job kind ``decentralized-train``: a swarm of peers (ranks on cluster nodes, and volunteers who join with
  ``strata peer join JOB_ID --token T``) train one model; each holds a full copy (swapping layers in from host
  memory under a device-memory budget) and they average it asynchronously through hivemind, with credentials
  from the control plane, guarded averaging and adaptive deadlines.
- A failure policy: a lost node's peers are not retried (the swarm carries on).
- Panels (peers, throughput per peer, loss, swapping timeline), a report schema, the ``peer`` CLI verb and
  ``strata bench decentral``.
"""

from components.runtime.contract.plugins import Plugin

PLUGIN = Plugin(
    name="decentral",
    version="0.1.0",
    requires=("train",),
    description="Decentralized training on hivemind (Atom): elastic swarms of peers on cluster nodes and volunteer "
                "machines, layer swapping, guarded asynchronous averaging, job-token membership.",
    kinds=("components.decentral.spec:DecentralizedTrainSpec",),
    panels=("components.decentral.panels:SwarmPeersPanel", "components.decentral.panels:PeerThroughputPanel",
            "components.decentral.panels:SwarmLossPanel", "components.decentral.panels:SwapTimelinePanel"),
    reports="components.decentral.report:SwarmReport",
    hooks=("components.decentral.hooks:SwarmCarriesOn",),
    commands=("components.decentral.commands:PeerCommand",),
    benchmarks={"decentral": "benchmarks.decentral.bench:main"},
)
