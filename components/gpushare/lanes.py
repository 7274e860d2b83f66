"""Memory requests and the lane allocator (Salus): admission of jobs onto one device's memory budget.

Pure and deterministic -- no torch, no clocks, no threads -- so the control plane can import it and the tests
can replay any sequence of arrivals and departures.

The device budget holds two kinds of reservations:

- **persistent** memory of every admitted job (parameters, gradients kept between iterations, buffers,
  optimizer state, device-resident data): it stays on the device for the job's whole life, so switching
  between jobs needs no copy;
- **lanes** for ephemeral memory (activations and temporaries of one iteration). A lane is sized for the
  largest iteration of the jobs assigned to it; jobs in one lane take turns (one iteration in flight per lane
  at a time), jobs in different lanes may have iterations in flight together (a job preempted at a stage
  boundary keeps its activations in its lane while a job of another lane runs).

The safety condition is ``persistent_total + sum(lane sizes) <= budget`` at all times, so admitted work
never runs the device out of memory. A job that does not fit waits in a queue ordered by (priority,
arrival); when jobs leave, lanes are compacted (emptied lanes dropped, the others shrunk to what their
remaining jobs need) and waiting jobs are admitted. Later jobs may be admitted past a blocked one that does
not fit yet (backfill), but at most ``max_bypass`` times, after which admission is strictly in order until the
blocked job gets in: a job that fits the device alone is admitted once enough others leave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30,
          "gib": 2**30, "ti": 2**40, "tib": 2**40}


def parse_bytes(value: int | float | str) -> int:
    """``2GiB``, ``512MiB``, ``1.5G``, ``1024`` -> bytes (binary suffixes with ``i``, decimal without)."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte size: {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value:
            raise ValueError(f"a byte size cannot be negative: {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {value!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(count: int | float) -> str:
    count = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"  # pragma: no cover


@dataclass(frozen=True)
class MemoryRequest:
    """What a job needs on a device: ``persistent`` bytes for its whole life, ``ephemeral`` bytes per iteration."""

    persistent: int
    ephemeral: int

    def __post_init__(self):
        for name in ("persistent", "ephemeral"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"MemoryRequest.{name} must be a non-negative integer, got {value!r}")

    @property
    def total(self) -> int:
        return self.persistent + self.ephemeral

    def covers(self, other: MemoryRequest) -> bool:
        return self.persistent >= other.persistent and self.ephemeral >= other.ephemeral

    def union(self, other: MemoryRequest) -> MemoryRequest:
        """The smallest request covering both."""
        return MemoryRequest(max(self.persistent, other.persistent), max(self.ephemeral, other.ephemeral))

    def with_headroom(self, fraction: float = 0.1, minimum: int = 0) -> MemoryRequest:
        """Grow both parts by ``fraction`` (at least ``minimum`` bytes each, when the part is not zero)."""

        def grow(value: int) -> int:
            return value + max(int(value * fraction), minimum) if value else 0

        return MemoryRequest(grow(self.persistent), grow(self.ephemeral))

    @classmethod
    def from_limit(cls, limit: int | str, persistent: int | None = None) -> MemoryRequest:
        """A request from a job's declared memory limit (e.g. the spec's ``gpu_memory``).

        Without a measured ``persistent`` part the whole limit is reserved as persistent: safe, but the job
        then shares no lane memory with others. Prefer a measured request (:mod:`components.gpushare.memory`).
        """
        total = parse_bytes(limit)
        if persistent is None:
            return cls(total, 0)
        if persistent > total:
            raise ValueError(f"persistent {persistent} exceeds the limit {total}")
        return cls(int(persistent), total - int(persistent))

    def to_dict(self) -> dict[str, int]:
        return {"persistent": self.persistent, "ephemeral": self.ephemeral, "total": self.total}


@dataclass(frozen=True)
class Admission:
    """The answer to a request: admitted into ``lane``, waiting (``position`` in the queue), or rejected.

    ``also_admitted`` lists other waiting jobs the same request let in (a newly arrived job of higher
    priority that does not fit becomes the blocked head, and jobs held back for the previous head may then
    be backfilled): the caller must start them too.
    """

    job_id: str
    status: str  # "admitted" | "waiting" | "rejected"
    lane: int | None = None
    position: int | None = None
    reason: str = ""
    also_admitted: tuple[Admission, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.status == "admitted"

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "status": self.status, "lane": self.lane, "position": self.position,
                "reason": self.reason}


@dataclass
class Lane:
    id: int
    size: int
    jobs: list[str] = field(default_factory=list)
    exclusive: bool = False


@dataclass
class _Entry:
    job_id: str
    request: MemoryRequest
    priority: int
    seq: int
    exclusive: bool
    bypassed: int = 0


class LaneAllocator:
    """Admission of jobs onto a memory ``budget`` of persistent reservations plus ephemeral lanes.

    Lane assignment for a job needing ``(p, e)``, with ``free = budget - persistent_total - lanes_total``:

    1. the smallest existing (non-exclusive) lane of size ``>= e`` (fewest jobs, then lowest id, on ties),
       if ``p <= free``;
    2. otherwise a new lane of size ``e``, if ``p + e <= free`` (and fewer than ``max_lanes`` lanes exist);
    3. otherwise grow the existing lane that needs the least growth, if ``p + growth <= free``;
    4. otherwise the job waits. A job with ``p + e > budget`` can never fit and is rejected.

    ``exclusive`` jobs (latency-sensitive inference endpoints) always get a lane of their own that no other
    job joins, so they never wait for another job's iteration to end.

    Every method is deterministic: the same sequence of calls gives the same lanes and the same answers.
    """

    def __init__(self, budget: int, *, max_lanes: int | None = None, max_bypass: int = 8):
        if budget < 0:
            raise ValueError(f"the budget cannot be negative, got {budget}")
        if max_lanes is not None and max_lanes < 1:
            raise ValueError(f"max_lanes must be at least 1, got {max_lanes}")
        self.budget = int(budget)
        self.max_lanes = max_lanes
        self.max_bypass = max(0, int(max_bypass))
        self._lanes: dict[int, Lane] = {}
        self._admitted: dict[str, _Entry] = {}
        self._lane_of: dict[str, int] = {}
        self._waiting: list[_Entry] = []  # kept sorted by (-priority, seq)
        self._seq = 0
        self._next_lane = 0

    # -- reads --------------------------------------------------------------------------------------------
    @property
    def persistent_total(self) -> int:
        return sum(entry.request.persistent for entry in self._admitted.values())

    @property
    def lanes_total(self) -> int:
        return sum(lane.size for lane in self._lanes.values())

    @property
    def reserved(self) -> int:
        return self.persistent_total + self.lanes_total

    @property
    def free(self) -> int:
        return self.budget - self.reserved

    @property
    def lanes(self) -> list[Lane]:
        return [Lane(lane.id, lane.size, list(lane.jobs), lane.exclusive) for lane in self._lanes.values()]

    @property
    def waiting(self) -> list[str]:
        return [entry.job_id for entry in self._waiting]

    @property
    def admitted(self) -> dict[str, MemoryRequest]:
        return {job_id: entry.request for job_id, entry in self._admitted.items()}

    def lane_of(self, job_id: str) -> int | None:
        return self._lane_of.get(job_id)

    def request_of(self, job_id: str) -> MemoryRequest | None:
        entry = self._admitted.get(job_id) or next((e for e in self._waiting if e.job_id == job_id), None)
        return entry.request if entry else None

    def lane_mates(self, job_id: str) -> list[str]:
        lane = self._lane_of.get(job_id)
        return [] if lane is None else [other for other in self._lanes[lane].jobs if other != job_id]

    def snapshot(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "persistent": self.persistent_total,
            "lanes_total": self.lanes_total,
            "free": self.free,
            "lanes": [{"id": lane.id, "size": lane.size, "jobs": list(lane.jobs), "exclusive": lane.exclusive}
                      for lane in self._lanes.values()],
            "admitted": {job_id: entry.request.to_dict() for job_id, entry in self._admitted.items()},
            "waiting": self.waiting,
        }

    def check(self) -> None:
        """Assert the allocator's invariants (for tests and debugging)."""
        assert self.reserved <= self.budget, f"reserved {self.reserved} > budget {self.budget}"
        seen: set[str] = set()
        for lane in self._lanes.values():
            assert lane.jobs, f"lane {lane.id} is empty"
            assert not (lane.exclusive and len(lane.jobs) > 1), f"exclusive lane {lane.id} is shared"
            for job_id in lane.jobs:
                assert job_id not in seen, f"{job_id} is in two lanes"
                seen.add(job_id)
                assert self._lane_of[job_id] == lane.id
                assert self._admitted[job_id].request.ephemeral <= lane.size, f"lane {lane.id} too small"
            assert lane.size == max(self._admitted[j].request.ephemeral for j in lane.jobs), "lane not compact"
        assert seen == set(self._admitted), "admitted jobs and lane members differ"
        waiting = [entry.job_id for entry in self._waiting]
        assert not set(waiting) & seen, "a job is both waiting and admitted"
        assert len(set(waiting)) == len(waiting)
        assert self._waiting == sorted(self._waiting, key=lambda e: (-e.priority, e.seq))

    # -- writes -------------------------------------------------------------------------------------------
    def request(
        self, job_id: str, request: MemoryRequest, priority: int = 0, *, exclusive: bool = False
    ) -> Admission:
        """Admit ``job_id`` now, queue it, or reject it when it could never fit the budget."""
        if job_id in self._admitted or any(entry.job_id == job_id for entry in self._waiting):
            raise ValueError(f"job {job_id!r} is already known to the allocator")
        if request.total > self.budget:
            return Admission(job_id, "rejected", reason=(
                f"needs {format_bytes(request.total)} ({format_bytes(request.persistent)} persistent + "
                f"{format_bytes(request.ephemeral)} per iteration) but the device budget is "
                f"{format_bytes(self.budget)}"))
        self._seq += 1
        entry = _Entry(job_id, request, int(priority), self._seq, bool(exclusive))
        self._waiting.append(entry)
        self._waiting.sort(key=lambda e: (-e.priority, e.seq))
        others = tuple(answer for answer in self._admit_waiting() if answer.job_id != job_id)
        answer = self.admission_of(job_id)
        return replace(answer, also_admitted=others) if others else answer

    def admission_of(self, job_id: str) -> Admission:
        if job_id in self._admitted:
            return Admission(job_id, "admitted", lane=self._lane_of[job_id])
        for position, entry in enumerate(self._waiting):
            if entry.job_id == job_id:
                return Admission(job_id, "waiting", position=position, reason=(
                    f"waiting for memory: needs {format_bytes(entry.request.persistent)} persistent + "
                    f"{format_bytes(entry.request.ephemeral)} lane, {format_bytes(self.free)} free"))
        raise KeyError(job_id)

    def release(self, job_id: str) -> list[Admission]:
        """Remove an admitted or waiting job; compact the lanes and return the jobs admitted as a result."""
        if job_id in self._admitted:
            self._remove_admitted(job_id)
        else:
            before = len(self._waiting)
            self._waiting = [entry for entry in self._waiting if entry.job_id != job_id]
            if len(self._waiting) == before:
                raise KeyError(job_id)
        return self._admit_waiting()

    def resize(self, job_id: str, request: MemoryRequest) -> tuple[bool, list[Admission]]:
        """Change an admitted job's reservation (e.g. after measuring it).

        The job keeps its lane when that lane can hold (or grow to) the new ephemeral size; otherwise it
        moves lanes. Returns ``(False, [])`` and leaves everything unchanged when the new request does not fit;
        a smaller request frees memory, and the jobs it lets in are returned.
        """
        entry = self._admitted[job_id]
        if request.total > self.budget:
            return False, []
        old_lane = self._lane_of[job_id]
        old_request = entry.request
        lane = self._lanes[old_lane]
        free = self.free + old_request.persistent
        growth = max(0, request.ephemeral - lane.size)
        if request.persistent + growth <= free:
            entry.request = request
            lane.size = max(lane.size, request.ephemeral)
            self._compact(lane)
            return True, self._admit_waiting()
        # Try another place: take the job out, place it anew, and restore everything when that fails.
        saved = ({key: Lane(lane.id, lane.size, list(lane.jobs), lane.exclusive) for key, lane in self._lanes.items()},
                 dict(self._lane_of), self._next_lane)
        self._remove_admitted(job_id)
        entry.request = request
        placement = self._placement(entry)
        if placement is None:
            entry.request = old_request
            self._lanes, self._lane_of, self._next_lane = saved
            self._admitted[job_id] = entry
            return False, []
        self._insert(entry, *placement, exclusive=entry.exclusive)
        return True, self._admit_waiting()

    def separate(self, job_id: str) -> bool:
        """Move an admitted job out of a shared lane into a lane of its own, so that it can run while a
        lane-mate has an iteration in flight (preemption at a stage boundary). False, with nothing changed,
        when there is no memory or no lane left for it."""
        lane = self._lanes[self._lane_of[job_id]]
        if len(lane.jobs) == 1:
            return True
        entry = self._admitted[job_id]
        if self.max_lanes is not None and len(self._lanes) >= self.max_lanes:
            return False
        old_size, position = lane.size, lane.jobs.index(job_id)
        lane.jobs.remove(job_id)
        self._compact(lane)
        if entry.request.ephemeral > self.free:
            lane.jobs.insert(position, job_id)
            lane.size = old_size
            return False
        lane_id = self._next_lane
        self._next_lane += 1
        self._lanes[lane_id] = Lane(lane_id, entry.request.ephemeral, [job_id], entry.exclusive)
        self._lane_of[job_id] = lane_id
        return True

    # -- internals ----------------------------------------------------------------------------------------
    def _placement(self, entry: _Entry) -> tuple[int, int] | None:
        """``(lane id, lane size after placing)`` for ``entry``, or None when it does not fit now."""
        p, e = entry.request.persistent, entry.request.ephemeral
        free = self.free
        if p > free:
            return None
        shared = [lane for lane in self._lanes.values() if not lane.exclusive]
        if not entry.exclusive:
            fitting = [lane for lane in shared if lane.size >= e]
            if fitting:
                best = min(fitting, key=lambda lane: (lane.size, len(lane.jobs), lane.id))
                return best.id, best.size
        if (self.max_lanes is None or len(self._lanes) < self.max_lanes) and p + e <= free:
            return -1, e  # a new lane
        if not entry.exclusive:
            growable = [lane for lane in shared if lane.size < e and p + (e - lane.size) <= free]
            if growable:
                best = min(growable, key=lambda lane: (e - lane.size, len(lane.jobs), lane.id))
                return best.id, e
        return None

    def _insert(self, entry: _Entry, lane_id: int, size: int, *, exclusive: bool) -> int:
        if lane_id == -1:
            lane_id = self._next_lane
            self._next_lane += 1
        if lane_id not in self._lanes:  # a new lane, or a rolled-back one coming back under its old id
            self._lanes[lane_id] = Lane(lane_id, size, [], exclusive)
        lane = self._lanes[lane_id]
        lane.size = max(lane.size, size)
        lane.jobs.append(entry.job_id)
        self._admitted[entry.job_id] = entry
        self._lane_of[entry.job_id] = lane_id
        return lane_id

    def _remove_admitted(self, job_id: str) -> None:
        self._admitted.pop(job_id)
        lane = self._lanes[self._lane_of.pop(job_id)]
        lane.jobs.remove(job_id)
        self._compact(lane)

    def _compact(self, lane: Lane) -> None:
        """Defragment: drop an emptied lane, shrink the others to their largest remaining iteration."""
        if not lane.jobs:
            del self._lanes[lane.id]
        else:
            lane.size = max(self._admitted[job_id].request.ephemeral for job_id in lane.jobs)

    def _admit_waiting(self) -> list[Admission]:
        admitted: list[Admission] = []
        blocker: _Entry | None = None
        for entry in list(self._waiting):
            if blocker is not None and blocker.bypassed >= self.max_bypass:
                break  # strictly in order until the blocked job gets in
            placement = self._placement(entry)
            if placement is None:
                if blocker is None:
                    blocker = entry
                continue
            if blocker is not None:
                blocker.bypassed += 1
            self._waiting.remove(entry)
            lane = self._insert(entry, *placement, exclusive=entry.exclusive)
            admitted.append(Admission(entry.job_id, "admitted", lane=lane))
        return admitted
