"""Reads on nodes, devices and pools: what the cluster could ever run, and each pool's sharing policy. Each
job's share of a shared GPU is the jobs app's (``strata.jobs.selectors.job_shares``)."""

from __future__ import annotations

from strata.cluster.capacity import DeviceSlot, NodeSlot, host_slot
from strata.cluster.models import Device, DevicePool, Node, node_pool


def registered_nodes() -> list[NodeSlot]:
    """Every registered node (up, down or draining) with all its devices free: what the cluster could ever
    run, as opposed to what is free now (``scheduling.services.load_capacity``)."""
    nodes, offers = {}, {}
    for node_id, name, labels, cpus, memory in Node.objects.values_list("id", "name", "labels", "cpus", "memory"):
        nodes[node_id] = NodeSlot(id=node_id, name=name, labels=labels or {})
        offers[node_id] = (cpus, memory)
    for device_id, node_id, index, kind, memory_total in Device.objects.values_list(
            "id", "node_id", "index", "kind", "memory_total"):
        if node_id not in nodes:
            continue
        if kind == Device.Kind.CPU:
            cpus, memory = offers[node_id]
            if cpus:
                nodes[node_id].host = host_slot(device_id, node_id, index, cpus, memory)
        else:
            nodes[node_id].devices.append(DeviceSlot(id=device_id, node_id=node_id, index=index,
                                                     memory_total=memory_total, free_memory=memory_total))
    return list(nodes.values())


def pool_policies() -> dict[str, str]:
    """Pool name -> policy, for the pools an admin has set (the others use the default)."""
    return dict(DevicePool.objects.values_list("name", "sharing_policy"))


def default_policy() -> str:
    return DevicePool._meta.get_field("sharing_policy").default


def device_policy(device: Device, policies: dict[str, str]) -> str:
    """The sharing policy of the device's pool."""
    return policies.get(node_pool(device.node.labels), default_policy())
