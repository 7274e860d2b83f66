"""The ``primes`` kind on a node: one sieve segment per step, metrics, checkpoints, resume, a result artifact."""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

from components.runtime.contract.component import Component
from components.runtime.contract.context import Context
from strata_primes.sieve import base_primes, count_segment


class PrimesComponent(Component):
    kind = "primes"

    def run(self, ctx: Context) -> None:
        limit, segment, every = ctx.spec["limit"], ctx.spec["segment"], ctx.spec["checkpoint_every"]
        state = ctx.restore() or {"low": 2, "count": 0, "last": 0, "step": 0}
        if state["low"] > 2:
            ctx.log(f"resuming at {state['low']:,} with {state['count']:,} primes found")
        primes = base_primes(math.isqrt(limit) + 2)
        total_steps = math.ceil((limit - 2) / segment)
        started = time.monotonic()
        while state["low"] < limit:
            if ctx.should_stop():
                ctx.checkpoint(state)
                ctx.log(f"stopped at {state['low']:,}: checkpoint saved")
                return
            high = min(state["low"] + segment, limit)
            count, last = count_segment(state["low"], high, primes)
            state = {"low": high, "count": state["count"] + count, "last": last or state["last"],
                     "step": state["step"] + 1}
            ctx.metrics({"primes_found": state["count"], "progress": state["step"] / total_steps,
                         "numbers_per_s": (high - 2) / max(time.monotonic() - started, 1e-9)}, state["step"])
            if state["step"] % every == 0:
                ctx.checkpoint(state)
        result = {"limit": limit, "count": state["count"], "largest": state["last"]}
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "result.json"
            path.write_text(json.dumps(result))
            ctx.artifact(path, "result.json")
        ctx.log(f"{state['count']:,} primes below {limit:,}; the largest is {state['last']:,}")
