"""``strata bench primes``: the segmented sieve the ``primes`` kind runs, against trial division, in one run.

Both count the primes below the same limit, three times each; the figure is the median time, with the range.
Written with Strata's bench harness, so ``--output F`` gives the common JSON.
"""

from __future__ import annotations

import math
import time

from benchmarks.benchkit import Figure, document, figures_table, progress, repeat, write
from strata_primes.sieve import base_primes, count_segment, count_trial_division

TARGET = 5.0  # the sieve should be at least 5x faster than trial division
RUNS = 3


def sieve_count(limit: int, segment: int = 100_000) -> int:
    """What the component does, without a context: count segment by segment."""
    primes = base_primes(math.isqrt(limit) + 2)
    total, low = 0, 2
    while low < limit:
        high = min(low + segment, limit)
        total += count_segment(low, high, primes)[0]
        low = high
    return total


def _timed(function, *args) -> float:
    began = time.perf_counter()
    function(*args)
    return time.perf_counter() - began


def main(quick: bool = False, output: str | None = None) -> int:
    limit = 20_000 if quick else 300_000
    say = progress("")
    say(f"strata bench primes{' --quick' if quick else ''}: primes below {limit:,}, {RUNS} runs each")
    expected = count_trial_division(limit)
    if sieve_count(limit) != expected:
        raise RuntimeError("the sieve and trial division disagree")
    sieve = repeat(lambda: _timed(sieve_count, limit), RUNS)
    say(f"  segmented sieve: median {sieve['median'] * 1000:.1f} ms")
    trial = repeat(lambda: _timed(count_trial_division, limit), RUNS)
    say(f"  trial division:  median {trial['median'] * 1000:.1f} ms")
    figure = Figure(
        "count_time", f"time to count the {expected:,} primes below {limit:,} (median of {RUNS} runs)",
        sieve["median"], trial["median"], "s", target=TARGET,
        mechanism_text=f"segmented sieve {sieve['median'] * 1000:.1f} ms "
                       f"(range {sieve['range'][0] * 1000:.1f}-{sieve['range'][1] * 1000:.1f})",
        baseline_text=f"trial division {trial['median'] * 1000:.1f} ms "
                      f"(range {trial['range'][0] * 1000:.1f}-{trial['range'][1] * 1000:.1f})",
        extra={"runs": {"mechanism": sieve["runs"], "baseline": trial["runs"]},
               "range": {"mechanism": sieve["range"], "baseline": trial["range"]}})
    results = document("primes", quick, [figure], details={"limit": limit, "primes": expected})
    say("")
    say(figures_table(results))
    write(results, output)
    return 0
