"""Reads on devices and pools: each job's share of a shared GPU, as the API and the dashboard show it."""

from __future__ import annotations

from typing import Any

from strata.cluster.models import Device, DevicePool, Node, node_pool
from strata.jobs.models import Allocation, Attempt, Job
from strata.scheduling.capacity import DeviceSlot, NodeSlot, host_slot

FULL_GPU = 1.0 - 1e-9


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


def _latest_attempts(jobs: list[Job]) -> dict[Any, Attempt]:
    """Each job's latest attempt, from prefetched attempts where the caller loaded them, else in one query."""
    latest, missing = {}, []
    for job in jobs:
        cache = getattr(job, "_prefetched_objects_cache", {})
        if "attempts" in cache:
            attempts = sorted(cache["attempts"], key=lambda attempt: attempt.number)
            if attempts:
                latest[job.pk] = attempts[-1]
        else:
            missing.append(job.pk)
    if missing:
        for attempt in Attempt.objects.filter(job_id__in=missing).order_by("job_id", "-number"):
            latest.setdefault(attempt.job_id, attempt)
    return latest


def gpu_allocations(queryset):
    """``queryset`` of allocations without the CPU reservations (those on the nodes' CPU devices)."""
    return queryset.exclude(device__kind=Device.Kind.CPU)


def _allocation(attempt: Attempt) -> Allocation | None:
    """The attempt's first GPU allocation (rank 0's), from its prefetched allocations."""
    cache = getattr(attempt, "_prefetched_objects_cache", {})
    if "allocations" in cache:
        allocations = sorted((allocation for allocation in cache["allocations"] if not allocation.device.cpu),
                             key=lambda allocation: allocation.rank)
        return allocations[0] if allocations else None
    return None


def job_shares(jobs: list[Job]) -> dict[Any, dict | None]:
    """Job id -> its share of a shared GPU (None for whole-GPU or unplaced jobs), in a fixed number of
    queries for any number of jobs.

    The share is that of the job's latest attempt on its first device (rank 0): ``gpus``, ``gpu_memory``,
    ``device`` (``node:gpuN``), ``shared``, ``policy`` (the sharing policy of the device's pool) and
    ``measured_memory`` (bytes a plugin measured the attempt to use, or None). What plugins measured beyond that
    is in the attempts' ``reports``.
    """
    shares: dict[Any, dict | None] = {job.pk: None for job in jobs}
    latest = _latest_attempts(list(jobs))
    allocations: dict[Any, Allocation] = {}
    unloaded = []
    for attempt in latest.values():
        cache = getattr(attempt, "_prefetched_objects_cache", {})
        if "allocations" in cache:
            allocation = _allocation(attempt)
            if allocation is not None:
                allocations[attempt.pk] = allocation
        else:
            unloaded.append(attempt.pk)
    if unloaded:
        for allocation in (gpu_allocations(Allocation.objects.filter(attempt_id__in=unloaded))
                           .select_related("device__node").order_by("attempt_id", "rank")):
            allocations.setdefault(allocation.attempt_id, allocation)
    fractional = {job_id: allocations.get(attempt.pk) for job_id, attempt in latest.items()}
    fractional = {job_id: allocation for job_id, allocation in fractional.items()
                  if allocation is not None and allocation.share < FULL_GPU}
    if not fractional:
        return shares
    policies = pool_policies()
    for job_id, allocation in fractional.items():
        device = allocation.device
        shares[job_id] = {
            "gpus": allocation.share, "gpu_memory": allocation.memory,
            "device": f"{device.node.name}:gpu{device.index}", "shared": True,
            "policy": device_policy(device, policies), "measured_memory": latest[job_id].measured_memory,
        }
    return shares
