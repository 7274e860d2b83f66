"""Fluid's allocation rule: water-filling a tune job's GPUs among the trials of one TrialGroup.

Fluid (Yu, Liu and Chowdhury, MLSys 2021) runs a tuning job as a sequence of TrialGroups (one rung of successive
halving, say) and gives each trial of a group a share of the job's GPUs in proportion to how much work it has
left, so that the group's trials finish together and the group's makespan is as short as the GPUs allow. Its
code (``fluid_executor.py``) first runs every trial at one GPU to measure ``h_i``, its height at width 1, then sets
``w_i = min(max(floor(h_i * n / sum_j h_j), 1/c), d)`` and rescales the ``w`` to the GPUs available.

Ours is the same rule without the floor-then-rescale step, which breaks both the bounds and the budget once it
rescales (Fluid's own code leaves ``c`` and ``d`` as TODOs). Exactly:

- ``budget`` B: the tune job's GPUs. ``work`` h_i > 0: trial i's remaining work at width 1 (its measured seconds per
  iteration at one whole GPU times its iterations left in the group). A trial not measured yet is given the
  group's mean (or 1.0 when none is measured): it runs, is measured, and the next allocation uses its speed.
- ``low`` = 1/c, with c the most trials packed onto one GPU; ``high`` = d, the most GPUs one trial may use (data
  parallelism across whole GPUs), never more than B.
- **Admission.** At most k = floor(B / low) trials run at once; when the group has more, the k with the most work
  run (ties: the order given) and the rest get 0 and wait for capacity to be freed.
- **Level.** For the admitted trials, the water level L is the one number for which
  ``sum_i clip(L * h_i, low, high) = B``; ``w_i = clip(L * h_i, low, high)``. When even ``high`` for every admitted
  trial sums to less than B, every trial gets ``high`` and the rest of the budget stays free.

So, for the continuous shares (:func:`waterfill`): every admitted share lies in [low, high]; they sum to B exactly
when ``k * high >= B`` (else to ``k * high``); a trial with more work never gets less than one with less work
(shares are a monotone function of work); with equal work, shares are equal.

Shares on a device are then made placeable (:func:`quantize`): a share below one GPU is rounded down to a multiple
of ``1 / c`` (a slot of the GPU-sharing service), a share of one GPU or more to whole GPUs; what rounding frees
is handed back, a grain at a time, to the trials with the most work per GPU they hold, never above ``high`` and
never letting a trial with less work overtake one with more. Quantized shares keep the bounds and the order
and never sum to more than B.

Light: standard library only (tests check the properties with hypothesis; the engine and the simulator use it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

EPSILON = 1e-9


@dataclass(frozen=True)
class Bounds:
    """``low``: the smallest share a running trial gets (1 / the most trials per GPU); ``high``: the most GPUs
    one trial may use."""

    low: float = 0.25
    high: float = 4.0

    def __post_init__(self):
        if not (0 < self.low <= 1):
            raise ValueError(f"low must be in (0, 1], got {self.low!r}")
        if not self.high >= self.low:
            raise ValueError(f"high ({self.high!r}) must be at least low ({self.low!r})")

    @property
    def per_gpu(self) -> int:
        """The most trials packed onto one GPU (c)."""
        return max(1, int(round(1 / self.low)))


def _work(work: Mapping[str, float | None]) -> dict[str, float]:
    """Unknown or non-positive work becomes the mean of the known (1.0 when none is known)."""
    known = [float(value) for value in work.values() if value is not None and math.isfinite(value) and value > 0]
    default = sum(known) / len(known) if known else 1.0
    return {trial: (float(value) if value is not None and math.isfinite(value) and value > 0 else default)
            for trial, value in work.items()}


def admitted(work: Mapping[str, float | None], budget: float, bounds: Bounds) -> list[str]:
    """The trials that run now: all of them, or the floor(budget / low) with the most work (ties: given order)."""
    if budget < bounds.low - EPSILON:
        return []
    known = _work(work)
    room = int(math.floor(budget / bounds.low + EPSILON))
    order = sorted(known, key=lambda trial: -known[trial])  # stable: ties keep the given order
    chosen = set(order[:room])
    return [trial for trial in known if trial in chosen]


def waterfill(work: Mapping[str, float | None], budget: float, bounds: Bounds = Bounds()) -> dict[str, float]:
    """Continuous shares of ``budget`` GPUs for the trials in ``work`` (trial -> remaining work at width 1); a
    trial that is not admitted gets 0. See the module's docstring for the exact rule and its bounds."""
    if budget < 0 or not math.isfinite(budget):
        raise ValueError(f"budget must be a finite number >= 0, got {budget!r}")
    high = min(bounds.high, budget) if budget >= bounds.low else bounds.low
    known = _work(work)
    running = admitted(work, budget, bounds)
    shares = {trial: 0.0 for trial in known}
    if not running:
        return shares
    if high * len(running) <= budget + EPSILON:
        shares.update({trial: high for trial in running})
        return shares

    def total(level: float) -> float:
        return sum(min(max(level * known[trial], bounds.low), high) for trial in running)

    # total() is continuous and non-decreasing in the level, from len * low (<= budget) up to len * high (>
    # budget): bisect on it, then pin the last bit with the trials strictly between the bounds.
    lo, hi = 0.0, 1.0
    while total(hi) < budget:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if total(mid) < budget:
            lo = mid
        else:
            hi = mid
    level = hi
    for trial in running:
        shares[trial] = min(max(level * known[trial], bounds.low), high)
    free = [trial for trial in running if bounds.low < shares[trial] < high]
    if free:  # spread the bisection's last rounding error over the unclamped trials (proportional to work)
        error = budget - sum(shares[trial] for trial in running)
        weight = sum(known[trial] for trial in free)
        for trial in free:
            shares[trial] = min(max(shares[trial] + error * known[trial] / weight, bounds.low), high)
    return shares


def quantize(shares: Mapping[str, float], work: Mapping[str, float | None], budget: float,
             bounds: Bounds = Bounds()) -> dict[str, float]:
    """Placeable shares: below one GPU, multiples of ``low``; one GPU or more, whole GPUs. Keeps the bounds and the
    order by work, and never sums to more than ``budget``."""
    known = _work(work)
    grain = bounds.low
    high = min(bounds.high, budget) if budget >= bounds.low else bounds.low

    def down(share: float) -> float:
        if share <= 0:
            return 0.0
        if share >= 1 - EPSILON:
            return float(math.floor(share + EPSILON))
        return max(grain, math.floor(share / grain + EPSILON) * grain)

    def up(share: float) -> float:
        """The next placeable share above ``share``."""
        if share >= 1 - EPSILON:
            return share + 1
        step = share + grain
        return 1.0 if step > 1 - EPSILON else step

    out = {trial: round(down(share), 9) for trial, share in shares.items()}
    running = [trial for trial in out if out[trial] > 0]
    left = budget - sum(out.values())
    while running:
        # The trial with the most work per GPU held that can grow without passing a trial with more work.
        candidates = []
        for trial in running:
            target = up(out[trial])
            if target > high + EPSILON or target - out[trial] > left + EPSILON:
                continue
            if any(known[other] > known[trial] and out[other] < target - EPSILON for other in running):
                continue
            candidates.append(trial)
        if not candidates:
            break
        trial = max(candidates, key=lambda trial: (known[trial] / out[trial], -running.index(trial)))
        target = up(out[trial])
        left -= target - out[trial]
        out[trial] = round(target, 9)
    return out


def allocate(work: Mapping[str, float | None], budget: float, bounds: Bounds = Bounds()) -> dict[str, float]:
    """The shares the engine runs: :func:`waterfill`, then :func:`quantize`."""
    return quantize(waterfill(work, budget, bounds), work, budget, bounds)


def grow(current: Mapping[str, float], work: Mapping[str, float | None], budget: float,
         bounds: Bounds = Bounds()) -> dict[str, float]:
    """Hand the budget that running trials do not hold to the trials :func:`allocate` would give more, without
    taking anything from anyone: a trial's share only grows, to its water-filled share, when what is free covers
    the step (largest shortfall first). Returns the trials whose share changes, with their new shares.

    Growing restarts a trial (it checkpoints and is placed again), and shrinking one to grow another would restart
    two; so freed capacity goes first to trials waiting to start (the engine's job) and only then, through here,
    to the running trials that are furthest behind, which is where the group's makespan is decided."""
    if not current:
        return {}
    target = allocate(work, budget, bounds)
    free = budget - sum(current.values())
    known = _work(work)
    changed: dict[str, float] = {}
    for trial in sorted(current, key=lambda t: (-(target.get(t, 0.0) - current[t]), -known.get(t, 0.0))):
        step = target.get(trial, 0.0) - current[trial]
        if step > EPSILON and step <= free + EPSILON:
            changed[trial] = target[trial]
            free -= step
    return changed


def start_share(free: float, starting: int, bounds: Bounds = Bounds()) -> float:
    """The share a trial starts with when ``starting`` trials share ``free`` GPUs: an equal placeable share, at
    least ``low`` and at most one GPU and ``high``."""
    if starting <= 0:
        return 0.0
    each = min(free / starting, 1.0, bounds.high)
    if each >= 1 - EPSILON:
        return 1.0
    return max(bounds.low, math.floor(each / bounds.low + EPSILON) * bounds.low)
