"""An in-memory index of free device capacity, built once per scheduling pass.

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
    free: int = FULL  # thousandths of the device still free
    free_memory: int = 0


@dataclass
class NodeSlot:
    id: object
    name: str
    labels: dict
    devices: list[DeviceSlot] = field(default_factory=list)


def share_to_milli(share: float) -> int:
    return max(1, min(FULL, round(share * FULL)))


class CapacityIndex:
    def __init__(self, nodes: list[NodeSlot]):
        self.nodes = {node.id: node for node in nodes}
        self._order = {node.id: str(node.id) for node in nodes}  # the nodes' sort key, made once per pass
        self.devices: dict[int, DeviceSlot] = {}
        self._by_free: dict[int, set[int]] = defaultdict(set)  # free milli -> device ids
        self._levels: list[int] = []  # sorted distinct free levels with devices in them
        self._whole_free: dict[object, set[int]] = defaultdict(set)  # node -> fully free device ids
        self._nodes_by_whole: dict[int, set[object]] = defaultdict(set)  # count -> nodes
        for node in nodes:
            for device in node.devices:
                self.devices[device.id] = device
                self._insert(device)
            self._nodes_by_whole[len(self._whole_free[node.id])].add(node.id)

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
        self._adjust(self.devices[device_id], -milli, -memory)

    def give(self, device_id: int, milli: int, memory: int) -> None:
        self._adjust(self.devices[device_id], milli, memory)

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

    def place(self, resources: dict, selector=None, choose=None):
        """Gang placement: every worker gets devices, or nothing is taken. Returns [(rank, device, milli,
        memory)] or None.

        ``choose(rank, options)``, when given, picks each worker's place among up to :data:`CHOICES` options
        (lists of (device, milli, memory), best fit first) by returning an index, or None for none of them
        (plugins' placement-score hooks); without it the best fit is taken."""
        gpus = float(resources.get("gpus", 0))
        memory = resources.get("gpu_memory")
        workers = int(resources.get("workers", 1))
        taken: list[tuple[int, DeviceSlot, int, int]] = []
        for rank in range(workers):
            if gpus > 1:
                options = self.wholes(int(round(gpus)), memory, selector)
            else:
                options = ([one] for one in self.fractions(gpus, memory, selector))
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
