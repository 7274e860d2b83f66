"""The arithmetic: a segmented sieve of Eratosthenes (pure Python, bytearray slices) and trial division."""

from __future__ import annotations

import math


def base_primes(limit: int) -> list[int]:
    """The primes below ``limit`` (a plain sieve; used for the square root of the range)."""
    if limit < 3:
        return []
    sieve = bytearray([1]) * limit
    sieve[0:2] = b"\x00\x00"
    for number in range(2, math.isqrt(limit - 1) + 1):
        if sieve[number]:
            sieve[number * number :: number] = bytes(len(range(number * number, limit, number)))
    return [number for number in range(limit) if sieve[number]]


def count_segment(low: int, high: int, primes: list[int]) -> tuple[int, int]:
    """``(how many primes in [low, high), the largest one or 0)``; ``primes`` must cover up to sqrt(high)."""
    low = max(low, 2)
    if high <= low:
        return 0, 0
    sieve = bytearray([1]) * (high - low)
    for prime in primes:
        if prime * prime >= high:
            break
        start = max(prime * prime, (low + prime - 1) // prime * prime)
        sieve[start - low :: prime] = bytes(len(range(start, high, prime)))
    count = sieve.count(1)
    last = low + sieve.rindex(1) if count else 0
    return count, last


def count_trial_division(limit: int) -> int:
    """The baseline: test each number below ``limit`` by trial division with the primes found so far."""
    found: list[int] = []
    for number in range(2, limit):
        root = math.isqrt(number)
        for prime in found:
            if prime > root:
                found.append(number)
                break
            if number % prime == 0:
                break
        else:
            found.append(number)
    return len(found)
