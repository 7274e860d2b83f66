"""An in-memory index of free device capacity, built once per scheduling pass (and, with every device free, what
admission asks whether a job could ever fit in). Plain data, no models: in the cluster layer, the lowest that
reads it.

Shares are kept in thousandths so free capacity can be bucketed exactly; lookups are best-fit and cost
O(distinct free levels) instead of a scan over every device, which keeps a pass over thousands of devices
well under a second.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

FULL = 1000  # one whole device, in thousandths
CHOICES = 64  # the most places (best fit first) a placement hook chooses among for one worker


@dataclass
class DeviceSlot:
    id: int
    node_id: object
    index: int
    memory_total: int
    free: int = FULL  # thousandths of the device still free (of a CPU device: thousandths of CPUs still free)
    free_memory: int = 0
    # The node's CPU device (cluster.models.Device.Kind.CPU): its CPUs and host memory, which jobs that reserve
    # CPUs (``resources.cpus``) take. It is never a place for a GPU share.
    cpu: bool = False


@dataclass
class NodeSlot:
    id: object
    name: str
    labels: dict
    devices: list[DeviceSlot] = field(default_factory=list)
    host: DeviceSlot | None = None  # the node's CPU device; None when the node reported no CPUs


def share_to_milli(share: float) -> int:
    return max(1, min(FULL, round(share * FULL)))


def cpus_to_milli(cpus: float) -> int:
    """CPUs in thousandths, as a CPU device's ``free`` counts them (not capped at one)."""
    return max(1, round(cpus * FULL))


def host_slot(device_id: int, node_id, index: int, cpus: float, memory: int | None) -> DeviceSlot:
    """The slot of a node's CPU device with all of its ``cpus`` and ``memory`` (bytes) free."""
    return DeviceSlot(id=device_id, node_id=node_id, index=index, memory_total=int(memory or 0),
                      free=round(cpus * FULL), free_memory=int(memory or 0), cpu=True)


def cpu_request(resources: dict) -> tuple[int, int]:
    """What one worker of ``resources`` reserves on its node's CPU device: (milli-CPUs, bytes); (0, 0) for a
    job that states no ``cpus`` (a GPU job reserves none unless it says so)."""
    cpus = float(resources.get("cpus") or 0)
    return (cpus_to_milli(cpus) if cpus > 0 else 0), int(resources.get("memory") or 0)


def gpu_free(resources: dict) -> bool:
    """Whether ``resources`` holds no GPU at all: ``gpus: 0`` without ``gpu_memory`` (it runs on CPUs)."""
    return float(resources.get("gpus", 0)) <= 0 and resources.get("gpu_memory") is None


class CapacityIndex:
    def __init__(self, nodes: list[NodeSlot]):
        self.nodes = {node.id: node for node in nodes}
        self._order = {node.id: str(node.id) for node in nodes}  # the nodes' sort key, made once per pass
        self.devices: dict[int, DeviceSlot] = {}
        self._by_free: dict[int, set[int]] = defaultdict(set)  # free milli -> device ids
        self._levels: list[int] = []  # sorted distinct free levels with devices in them
        self._whole_free: dict[object, set[int]] = defaultdict(set)  # node -> fully free device ids
        self._nodes_by_whole: dict[int, set[object]] = defaultdict(set)  # count -> nodes
        # The nodes' CPU devices, by device id: kept apart from the GPU buckets (their ``free`` counts CPUs).
        self.hosts: dict[int, DeviceSlot] = {}
        for node in nodes:
            for device in node.devices:
                self.devices[device.id] = device
                self._insert(device)
            self._nodes_by_whole[len(self._whole_free[node.id])].add(node.id)
            if node.host is not None:
                self.hosts[node.host.id] = node.host

    # -- bookkeeping ------------------------------------------------------------------------------------
    def _insert(self, device: DeviceSlot) -> None:
        if device.free <= 0:
            return
        bucket = self._by_free[device.free]
        if not bucket:
            bisect.insort(self._levels, device.free)
        bucket.add(device.id)
        if device.free == FULL:
            self._whole_free[device.node_id].add(device.id)

    def _remove(self, device: DeviceSlot) -> None:
        if device.free <= 0:
            return
        bucket = self._by_free[device.free]
        bucket.discard(device.id)
        if not bucket:
            position = bisect.bisect_left(self._levels, device.free)
            if position < len(self._levels) and self._levels[position] == device.free:
                self._levels.pop(position)
        if device.free == FULL:
            self._whole_free[device.node_id].discard(device.id)

    def _adjust(self, device: DeviceSlot, delta_milli: int, delta_memory: int) -> None:
        node_whole_before = len(self._whole_free[device.node_id])
        self._remove(device)
        device.free += delta_milli
        device.free_memory += delta_memory
        self._insert(device)
        node_whole_after = len(self._whole_free[device.node_id])
        if node_whole_before != node_whole_after:
            self._nodes_by_whole[node_whole_before].discard(device.node_id)
            self._nodes_by_whole[node_whole_after].add(device.node_id)

    def take(self, device_id: int, milli: int, memory: int) -> None:
        if device_id in self.hosts:
            self.hosts[device_id].free -= milli
            self.hosts[device_id].free_memory -= memory
            return
        self._adjust(self.devices[device_id], -milli, -memory)

    def give(self, device_id: int, milli: int, memory: int) -> None:
        self.take(device_id, -milli, -memory)

    def slot(self, device_id: int) -> DeviceSlot | None:
        """The GPU or CPU device slot of ``device_id``; None when it is not in the index."""
        return self.devices.get(device_id) or self.hosts.get(device_id)

    # -- lookups ----------------------------------------------------------------------------------------
    def _node_ok(self, node_id, selector: dict | None, exclude) -> bool:
        if exclude and node_id in exclude:
            return False
        if not selector:
            return True
        labels = self.nodes[node_id].labels
        return all(str(labels.get(key)) == str(value) for key, value in selector.items())

    def fractions(self, share: float, memory: int | None, selector=None, exclude=None):
        """Every device that fits one worker needing ``share`` (<= 1) of a device, best fit first:
        (device, milli, memory). Consume it before changing the index."""
        milli = share_to_milli(share) if share > 0 else 0
        start = bisect.bisect_left(self._levels, max(milli, 1))
        for level in self._levels[start:]:
            for device_id in (self._whole_best_fit() if level == FULL else self._by_free[level]):
                device = self.devices[device_id]
                need_milli = milli or share_to_milli((memory or 0) / max(device.memory_total, 1))
                if need_milli > device.free:
                    continue
                need_memory = memory if memory is not None else device.memory_total * need_milli // FULL
                if need_memory <= device.free_memory and self._node_ok(device.node_id, selector, exclude):
                    yield device, need_milli, need_memory

    def _whole_best_fit(self):
        """The fully free devices, those of the node with the fewest fully free devices first (best fit, as
        :meth:`wholes`; within a node by id): a whole device taken as a fraction packs like a whole one."""
        most = max((k for k, nodes in self._nodes_by_whole.items() if nodes), default=0)
        for available in range(1, most + 1):
            for node_id in sorted(self._nodes_by_whole.get(available, ()), key=self._order.__getitem__):
                yield from sorted(self._whole_free[node_id])

    def find_fraction(self, share: float, memory: int | None, selector=None, exclude=None):
        """Best fit for one worker needing ``share`` (<= 1) of a device: (device, milli, memory) or None."""
        return next(self.fractions(share, memory, selector, exclude), None)

    def wholes(self, count: int, memory: int | None, selector=None, exclude=None):
        """Every node that fits one worker needing ``count`` whole devices, best fit (fewest whole devices
        free) first: [(device, milli, memory)] per node. Consume it before changing the index."""
        most = max((k for k, nodes in self._nodes_by_whole.items() if nodes), default=0)
        for available in range(count, most + 1):
            for node_id in list(self._nodes_by_whole.get(available, ())):
                if not self._node_ok(node_id, selector, exclude):
                    continue
                chosen = []
                for device_id in sorted(self._whole_free[node_id]):
                    device = self.devices[device_id]
                    need_memory = memory if memory is not None else device.memory_total
                    if need_memory <= device.free_memory:
                        chosen.append((device, FULL, need_memory))
                    if len(chosen) == count:
                        yield chosen
                        break

    def find_whole(self, count: int, memory: int | None, selector=None, exclude=None):
        """Best fit for one worker needing ``count`` whole devices on one node: [(device, milli, memory)]."""
        return next(self.wholes(count, memory, selector, exclude), None)

    def host_fits(self, node_id, milli: int, memory: int) -> bool:
        """Whether ``node_id``'s CPU device has ``milli`` thousandths of CPUs and ``memory`` bytes free."""
        host = self.nodes[node_id].host
        return host is not None and host.free >= milli and host.free_memory >= memory

    def cpu_places(self, milli: int, memory: int, selector=None, exclude=None):
        """Every node whose CPU device fits one worker needing ``milli`` thousandths of CPUs and ``memory``
        bytes, best fit (fewest CPUs free, then least memory free) first: (host slot, milli, memory)."""
        fitting = [node.host for node in self.nodes.values()
                   if node.host is not None and self.host_fits(node.id, milli, memory)
                   and self._node_ok(node.id, selector, exclude)]
        fitting.sort(key=lambda host: (host.free, host.free_memory, self._order[host.node_id]))
        for host in fitting:
            yield host, milli, memory

    def _options(self, resources: dict, selector, exclude):
        """The places of one worker, best fit first: lists of (device, milli, memory) of its GPUs, or of its
        node's CPU device for a job that holds no GPU. A GPU job that reserves CPUs is offered only places on
        nodes whose CPU device fits them too (``place`` adds that device)."""
        gpus = float(resources.get("gpus", 0))
        memory = resources.get("gpu_memory")
        cpu_milli, cpu_memory = cpu_request(resources)
        if gpu_free(resources):
            return ([one] for one in self.cpu_places(cpu_milli or cpus_to_milli(1.0), cpu_memory, selector, exclude))
        if gpus > 1:
            options = self.wholes(int(round(gpus)), memory, selector, exclude)
        else:
            options = ([one] for one in self.fractions(gpus, memory, selector, exclude))
        if cpu_milli or cpu_memory:
            options = (found for found in options if self.host_fits(found[0][0].node_id, cpu_milli, cpu_memory))
        return options

    def fits(self, resources: dict, selector=None, exclude=None) -> bool:
        """Whether one worker of ``resources`` fits now (outside the nodes in ``exclude``)."""
        return next(self._options(resources, selector, exclude), None) is not None

    def place(self, resources: dict, selector=None, choose=None, exclude=None):
        """Gang placement: every worker gets devices, or nothing is taken. Returns [(rank, device, milli,
        memory)] or None. A worker's CPU reservation (``resources.cpus``, ``resources.memory``) is one more
        entry, on its node's CPU device (``device.cpu``); a job that holds no GPU has only that one.

        ``choose(rank, options)``, when given, picks each worker's place among up to :data:`CHOICES` options
        (lists of (device, milli, memory), best fit first) by returning an index, or None for none of them
        (plugins' placement-score hooks); without it the best fit is taken. Nodes in ``exclude`` are not used."""
        workers = int(resources.get("workers", 1))
        cpu_milli, cpu_memory = cpu_request(resources)
        alongside = not gpu_free(resources) and bool(cpu_milli or cpu_memory)
        taken: list[tuple[int, DeviceSlot, int, int]] = []
        for rank in range(workers):
            options = self._options(resources, selector, exclude)
            if choose is None:
                found = next(options, None)
            else:
                listed = list(itertools.islice(options, CHOICES))
                index = choose(rank, listed) if listed else None
                found = listed[index] if index is not None else None
            if not found:
                for _, device, milli, used in taken:
                    self.give(device.id, milli, used)
                return None
            if alongside:
                found = [*found, (self.nodes[found[0][0].node_id].host, cpu_milli, cpu_memory)]
            for device, milli, used in found:
                self.take(device.id, milli, used)
                taken.append((rank, device, milli, used))
        return taken


def _gib(count: int) -> str:
    return f"{count / 2**30:.4g} GiB"


def placement_problem(resources: dict, nodes: list[NodeSlot]) -> str | None:
    """Why no node of ``nodes`` could ever run ``resources``, even with every device free; None if one could.

    ``nodes`` are the cluster's registered nodes at full capacity. A request that fails here is not a wait
    for room but a request for hardware the cluster does not have (more memory than any device, more devices
    than any node, labels no node carries).
    """
    gpus = float(resources.get("gpus", 0))
    memory = resources.get("gpu_memory")
    workers = int(resources.get("workers", 1))
    selector = resources.get("node_labels") or None
    matching = [node for node in nodes
                if not selector or all(str(node.labels.get(k)) == str(v) for k, v in selector.items())]
    if not matching:
        return f"no registered node has the labels {selector}"
    cpu_milli, cpu_memory = cpu_request(resources)
    if gpu_free(resources):
        return _cpu_problem(cpu_milli or cpus_to_milli(1.0), cpu_memory, workers, matching)
    if cpu_milli or cpu_memory:
        problem = _cpu_problem(cpu_milli, cpu_memory, 1, matching)
        if problem:
            return problem
        matching = [node for node in matching if node.host.free >= cpu_milli and node.host.free_memory >= cpu_memory]
    devices = [device for node in matching for device in node.devices]
    if not devices:
        return "the matching nodes have no devices"
    if memory is not None and all(device.memory_total < memory for device in devices):
        largest = max(device.memory_total for device in devices)
        return f"no device has {_gib(memory)} of memory (the largest has {_gib(largest)})"
    if gpus > 1:
        count = int(round(gpus))
        fits = [sum(1 for d in node.devices if memory is None or d.memory_total >= memory) for node in matching]
        slots = sum(n // count for n in fits)
        if slots == 0:
            return f"no node has {count} devices{f' of {_gib(memory)}' if memory else ''} (the most on one node: {max(fits)})"
    else:
        milli = share_to_milli(gpus) if gpus > 0 else 0
        slots = 0
        for device in devices:
            if memory is not None and device.memory_total < memory:
                continue
            need = milli or share_to_milli(memory / max(device.memory_total, 1))
            slots += min(FULL // need, device.memory_total // memory if memory else FULL)
    if slots < workers:
        return f"{workers} workers need room for {workers} placements; the whole cluster has room for {slots}"
    return None


def _cpu_problem(milli: int, memory: int, workers: int, nodes: list[NodeSlot]) -> str | None:
    """Why ``workers`` reservations of ``milli`` thousandths of CPUs and ``memory`` bytes each could never be
    placed on the CPU devices of ``nodes`` (all free); None if they could."""
    hosts = [node.host for node in nodes if node.host is not None]
    if not hosts:
        return "no matching node reported its CPUs"
    if all(host.free < milli for host in hosts):
        return f"no node has {milli / FULL:g} CPUs (the most on one node: {max(h.free for h in hosts) / FULL:g})"
    if memory and all(host.memory_total < memory for host in hosts):
        return (f"no node has {_gib(memory)} of host memory (the largest has "
                f"{_gib(max(h.memory_total for h in hosts))})")
    slots = sum(min(host.free // milli, host.memory_total // memory if memory else host.free) for host in hosts)
    if slots < workers:
        return f"{workers} workers need room for {workers} placements; the whole cluster has room for {slots}"
    return None
