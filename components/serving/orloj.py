"""Deadline-aware batching for served models (Orloj: Yu, Qiu, Jin and Chowdhury, 2022), and the two batching
policies it is measured against.

A request waits in its endpoint's queue with a **deadline** (its gRPC deadline, or the deployment's SLO) and a
**bucket**: the feature of its input that the model's run time depends on (a length bucket for variable-length
inputs; one bucket for a model whose run time does not depend on its input). Whenever the device is free, a
batching policy (:class:`BatchPolicy`) decides which queued requests run next as one batch, which are answered at
once with ``DEADLINE_EXCEEDED`` because they cannot make it, and, if it runs nothing, when to look again.

- :class:`FifoBatcher`: Triton's dynamic batcher. Arrival order; a batch goes when it is full or when its oldest
  request has waited ``max_queue_delay_s``. Nothing is dropped: a late request still runs.
- :class:`EdfBatcher`: earliest deadline first with the *mean* execution time as its estimate (Clockwork-style):
  drops a request that cannot finish even alone by the mean, and runs the longest deadline-ordered prefix whose
  mean batch time meets the earliest deadline in it.
- :class:`OrlojBatcher`: keeps **empirical distributions** of batch execution time (:class:`ExecProfile`, per batch
  size and bucket, updated online from every batch it runs) and picks the batch that maximizes the **expected
  number of requests that finish by their deadlines**: those in the batch, plus those of the queue left behind
  served after it (see :meth:`OrlojBatcher.value`). A batch's time is that of its largest bucket: the longest input
  sets the pace of a padded batch, and the deepest exit that of an early-exit one. Hopeless requests (less than
  ``drop_below`` chance to finish even alone, now) are answered early instead of spending the device on them.

:func:`simulate` runs a policy against a request trace in simulated time (the tests and the benchmark's
model-free part use it). Pure Python and numpy: no torch, no grpc.
"""

from __future__ import annotations

import abc
import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

QUANTILES = 32  # points a distribution is kept as (equal-weight quantiles)
MIN_SAMPLES = 8  # batch runs of one (size, bucket) before its own samples are trusted over its neighbours'
EXACT_QUEUE = 4  # up to this many waiting requests, Orloj tries every subset as the next batch
REST_BATCHES = 2  # how many batches of the rest of the queue the value looks ahead


@dataclass(order=True)
class Pending:
    """A queued request: when it must be answered (``deadline``, in the policy's clock) and its bucket."""

    deadline: float
    arrival: float = field(compare=False)
    bucket: int = field(default=0, compare=False)
    id: int = field(default=0, compare=True)
    payload: Any = field(default=None, compare=False, repr=False)


@dataclass
class Decision:
    batch: list[Pending]
    drop: list[Pending] = field(default_factory=list)
    wake_at: float | None = None  # nothing to run now: look again then (or at the next arrival)


class ExecProfile:
    """Empirical distributions of batch execution time per ``(size, bucket)``, from the latest ``window`` runs
    of each, kept as :data:`QUANTILES` equal-weight quantiles.

    A key with fewer than :data:`MIN_SAMPLES` runs borrows from its neighbours in the same bucket: between two
    measured sizes, quantile by quantile, linearly; above the largest, scaled up in proportion to the size (an
    upper bound: batching is sublinear); below the smallest, the smallest's (also an upper bound). A bucket never
    measured borrows the nearest measured bucket below it (scaled by the bucket ratio) or above it; with nothing
    measured at all, ``prior_s`` for every batch.
    """

    def __init__(self, window: int = 256, prior_s: float = 0.005):
        self.window = int(window)
        self.prior_s = float(prior_s)
        self._runs: dict[tuple[int, int], deque[float]] = {}
        self._cache: dict[tuple[int, int], np.ndarray] = {}
        # The same distributions as plain lists with their means: a decision asks for thousands of CDF points, and
        # bisect on a list is far cheaper per call than a numpy call.
        self._fast: dict[tuple[int, int], tuple[list[float], float]] = {}

    def observe(self, size: int, bucket: int, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0 and size >= 1):
            return
        self._runs.setdefault((int(size), int(bucket)), deque(maxlen=self.window)).append(float(seconds))
        self._cache.clear()
        self._fast.clear()

    def _lookup(self, size: int, bucket: int) -> tuple[list[float], float]:
        key = (size, bucket)
        found = self._fast.get(key)
        if found is None:
            values = self.quantiles(size, bucket)
            found = self._fast[key] = (values.tolist(), float(values.mean()))
        return found

    def runs(self, size: int, bucket: int) -> int:
        return len(self._runs.get((size, bucket), ()))

    @property
    def measured(self) -> bool:
        """Whether any batch has been measured: before that every estimate is ``prior_s``, a guess that must not
        make a policy answer requests early (one that dropped everything would never measure anything)."""
        return bool(self._runs)

    def quantiles(self, size: int, bucket: int) -> np.ndarray:
        """The distribution of one batch's time: :data:`QUANTILES` sorted values, each of equal weight."""
        key = (int(size), int(bucket))
        if key not in self._cache:
            self._cache[key] = self._estimate(*key)
        return self._cache[key]

    def cdf(self, size: int, bucket: int, seconds: float) -> float:
        """P(a batch of ``size`` with largest bucket ``bucket`` takes at most ``seconds``)."""
        values = self._lookup(size, bucket)[0]
        return bisect.bisect_right(values, seconds) / len(values)

    def mean(self, size: int, bucket: int) -> float:
        return self._lookup(size, bucket)[1]

    # -- estimation -------------------------------------------------------------------------------------------
    @staticmethod
    def _points(runs: Iterable[float]) -> np.ndarray:
        values = np.fromiter(runs, dtype=float)
        return np.quantile(values, (np.arange(QUANTILES) + 0.5) / QUANTILES)

    def _estimate(self, size: int, bucket: int) -> np.ndarray:
        own = self._runs.get((size, bucket))
        if own is not None and len(own) >= MIN_SAMPLES:
            return self._points(own)
        sizes = sorted(s for (s, b), runs in self._runs.items() if b == bucket and len(runs) >= MIN_SAMPLES)
        if not sizes:
            sizes = sorted(s for (s, b), runs in self._runs.items() if b == bucket)
        if sizes:
            below = [s for s in sizes if s <= size]
            above = [s for s in sizes if s >= size]
            if below and above:
                low, high = below[-1], above[0]
                lo, hi = self._points(self._runs[(low, bucket)]), self._points(self._runs[(high, bucket)])
                if high == low:
                    return lo
                return lo + (hi - lo) * (size - low) / (high - low)
            if below:
                return self._points(self._runs[(below[-1], bucket)]) * size / below[-1]
            return self._points(self._runs[(above[0], bucket)])
        buckets = sorted({b for (_, b) in self._runs})
        if not buckets:
            return np.full(QUANTILES, self.prior_s)
        lower = [b for b in buckets if b < bucket]
        if lower:
            nearest = lower[-1]
            return self._estimate(size, nearest) * (bucket + 1) / (nearest + 1)
        return self._estimate(size, buckets[0])


class BatchPolicy(abc.ABC):
    """Decides the next batch of a queue; told how long each batch it chose took."""

    name = "policy"

    def __init__(self, max_batch: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.max_batch = int(max_batch)

    @abc.abstractmethod
    def decide(self, queue: Sequence[Pending], now: float) -> Decision:
        """The next batch from ``queue`` (which it must not change), the requests to answer at once with
        DEADLINE_EXCEEDED, and, when the batch is empty, when to look again."""

    def observe(self, batch: Sequence[Pending], seconds: float) -> None:  # noqa: B027 - optional
        """``batch`` ran in ``seconds``."""


class FifoBatcher(BatchPolicy):
    """Triton's dynamic batcher: arrival order, a batch goes when full or when its oldest request has waited
    ``max_queue_delay_s``; a request past its deadline still runs (Triton's queue timeouts fire only after the
    running batch ends, triton-inference-server/server#7512)."""

    name = "fifo"

    def __init__(self, max_batch: int, max_queue_delay_s: float = 0.002):
        super().__init__(max_batch)
        self.max_queue_delay_s = float(max_queue_delay_s)

    def decide(self, queue, now):
        if not queue:
            return Decision([])
        ordered = sorted(queue, key=lambda p: (p.arrival, p.id))
        oldest = ordered[0].arrival
        if len(ordered) >= self.max_batch or now >= oldest + self.max_queue_delay_s - 1e-12:
            return Decision(ordered[: self.max_batch])
        return Decision([], wake_at=oldest + self.max_queue_delay_s)


class EdfBatcher(BatchPolicy):
    """Earliest deadline first with the mean batch time as the estimate: requests that cannot finish by the mean
    even alone are dropped; the batch is the longest deadline-ordered prefix whose mean time meets the earliest
    deadline in it (at least one request)."""

    name = "edf"

    def __init__(self, max_batch: int, profile: ExecProfile | None = None):
        super().__init__(max_batch)
        self.profile = profile or ExecProfile()

    def observe(self, batch, seconds):
        if batch:
            self.profile.observe(len(batch), max(p.bucket for p in batch), seconds)

    def decide(self, queue, now):
        ordered = sorted(queue)
        drop = [p for p in ordered if self.profile.measured and now + self.profile.mean(1, p.bucket) > p.deadline]
        live = [p for p in ordered if p not in drop]
        batch: list[Pending] = []
        for request in live[: self.max_batch]:
            trial = [*batch, request]
            if batch and now + self.profile.mean(len(trial), max(p.bucket for p in trial)) > trial[0].deadline:
                break
            batch = trial
        return Decision(batch, drop)


class OrlojBatcher(BatchPolicy):
    """Orloj: the batch with the most requests expected to finish by their deadlines (:meth:`value`), from
    empirical distributions of batch time updated online.

    Candidates: with at most :data:`EXACT_QUEUE` requests waiting, every subset of at most ``max_batch``; with
    more, for every bucket ``b`` and size ``n``, the ``n`` earliest-deadline requests whose bucket is at most ``b``
    (grouping similar inputs so that one long input does not slow a batch of short ones). Ties go to the larger
    batch (more served per device second), then to the smaller expected time, then to the earlier deadlines.
    """

    name = "orloj"

    def __init__(self, max_batch: int, profile: ExecProfile | None = None, *, drop_below: float = 0.1):
        super().__init__(max_batch)
        self.profile = profile or ExecProfile()
        self.drop_below = float(drop_below)

    def observe(self, batch, seconds):
        if batch:
            self.profile.observe(len(batch), max(p.bucket for p in batch), seconds)

    def hopeless(self, request: Pending, now: float) -> bool:
        return self.profile.measured and self.profile.cdf(1, request.bucket, request.deadline - now) < self.drop_below

    def batch_time(self, batch: Sequence[Pending]) -> tuple[int, int]:
        return len(batch), max(p.bucket for p in batch)

    def on_time(self, batch: Sequence[Pending], start: float) -> float:
        """Expected requests of ``batch`` that finish by their deadlines when it starts at ``start``."""
        size, bucket = self.batch_time(batch)
        values = self.profile._lookup(size, bucket)[0]  # the profile's cdf, with one lookup for the whole batch
        return sum(bisect.bisect_right(values, p.deadline - start) for p in batch) / len(values)

    def rest(self, queue: Sequence[Pending], start: float, *, ordered: bool = False) -> float:
        """Expected on-time requests of ``queue`` served after ``start`` in deadline order, ``max_batch`` at a time,
        looking :data:`REST_BATCHES` batches ahead (each starting when the last is expected to end)."""
        ordered = list(queue) if ordered else sorted(queue)
        total = 0.0
        for index in range(REST_BATCHES):
            chunk = ordered[index * self.max_batch: (index + 1) * self.max_batch]
            if not chunk:
                break
            total += self.on_time(chunk, start)
            start += self.profile.mean(*self.batch_time(chunk))
        return total

    def value(self, batch: Sequence[Pending], queue: Sequence[Pending], now: float) -> float:
        """What running ``batch`` now is worth: its requests expected on time, plus those of the rest of
        ``queue`` served after it (:meth:`rest`), from when it is expected to end."""
        return self._value(batch, sorted(queue), now)

    def _value(self, batch: Sequence[Pending], ordered: list[Pending], now: float) -> float:
        """:meth:`value` with ``ordered`` the queue already in deadline order (members told apart by identity)."""
        taken = {id(p) for p in batch}
        left = [p for p in ordered if id(p) not in taken]
        return self.on_time(batch, now) + self.rest(left, now + self.profile.mean(*self.batch_time(batch)),
                                                    ordered=True)

    def candidates(self, queue: Sequence[Pending]) -> Iterable[tuple[Pending, ...]]:
        ordered = sorted(queue)
        if len(ordered) <= EXACT_QUEUE:
            for size in range(1, min(self.max_batch, len(ordered)) + 1):
                yield from itertools.combinations(ordered, size)
            return
        for bucket in sorted({p.bucket for p in ordered}):
            eligible = [p for p in ordered if p.bucket <= bucket]
            for size in range(1, min(self.max_batch, len(eligible)) + 1):
                yield tuple(eligible[:size])

    def decide(self, queue, now):
        drop = [p for p in queue if self.hopeless(p, now)]
        dropped = {id(p) for p in drop}
        live = sorted(p for p in queue if id(p) not in dropped)
        if len(live) <= 1:  # nothing to choose (the common case at light load): no search
            return Decision(live, drop)
        best, best_key = None, None
        for batch in self.candidates(live):
            key = (round(self._value(batch, live, now), 9), len(batch),
                   -self.profile.mean(*self.batch_time(batch)), [-p.deadline for p in batch])
            if best_key is None or key > best_key:
                best, best_key = batch, key
        return Decision(sorted(best), drop)


# -- simulation ------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    requests: int
    on_time: int
    late: int  # answered after their deadline
    dropped: int  # answered early with DEADLINE_EXCEEDED
    batches: int
    batch_sizes: list[int]

    @property
    def finish_rate(self) -> float:
        return self.on_time / self.requests if self.requests else 0.0


def simulate(policy: BatchPolicy, arrivals: Sequence[tuple[float, float, int]],
             run_time: Callable[[Sequence[Pending]], float]) -> Outcome:
    """Serve ``arrivals`` (``(arrival, deadline, bucket)``, any order) on one device in simulated time: whenever the
    device is free the policy picks a batch, which takes ``run_time(batch)`` (the true time, which the policy only
    learns afterwards through :meth:`BatchPolicy.observe`)."""
    pending = sorted((a, d, b, i) for i, (a, d, b) in enumerate(arrivals))
    queue: list[Pending] = []
    now, cursor = 0.0, 0
    on_time = late = dropped = 0
    sizes: list[int] = []
    wake: list[float] = []
    while cursor < len(pending) or queue:
        while cursor < len(pending) and pending[cursor][0] <= now + 1e-12:
            arrival, deadline, bucket, index = pending[cursor]
            queue.append(Pending(deadline=deadline, arrival=arrival, bucket=bucket, id=index))
            cursor += 1
        decision = policy.decide(list(queue), now) if queue else Decision([])
        for request in decision.drop:
            queue.remove(request)
            dropped += 1
        if decision.batch:
            for request in decision.batch:
                queue.remove(request)
            seconds = float(run_time(decision.batch))
            now += seconds
            policy.observe(decision.batch, seconds)
            sizes.append(len(decision.batch))
            for request in decision.batch:
                if now <= request.deadline + 1e-12:
                    on_time += 1
                else:
                    late += 1
            continue
        upcoming = [pending[cursor][0]] if cursor < len(pending) else []
        if decision.wake_at is not None:
            heapq.heappush(wake, decision.wake_at)
        while wake and wake[0] <= now + 1e-12:
            heapq.heappop(wake)
        targets = upcoming + ([wake[0]] if wake else [])
        if not targets:
            if queue and not decision.drop:  # a policy that neither runs nor drops nor waits: force progress
                raise RuntimeError(f"{policy.name} left {len(queue)} requests waiting with nothing to wait for")
            continue
        now = max(now, min(targets))
    return Outcome(requests=len(pending), on_time=on_time, late=late, dropped=dropped, batches=len(sizes),
                   batch_sizes=sizes)
