"""``strata primes JOB``: the plugin's CLI verb (light: argparse only, and the CLI's REST client)."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

from components.runtime.contract.plugins import Command


class PrimesCommand(Command):
    name: ClassVar[str] = "primes"
    help: ClassVar[str] = "show a primes job's progress (example plugin)"

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job", help="the primes job's id")

    def run(self, args: argparse.Namespace, client: Any) -> int:
        job = client.get(f"jobs/{args.job}/")
        if job["kind"] != "primes":
            raise ValueError(f"job {args.job} is a {job['kind']} job, not a primes job")
        found, after = None, 0
        while True:  # the metrics route pages by id: read to the newest point
            points = client.get(f"jobs/{args.job}/metrics/", params={"name": "primes_found", "after": after})
            if not points:
                break
            found, after = points[-1]["value"], points[-1]["id"]
        shown = "none yet" if found is None else f"{int(found):,}"
        print(f"job {job['id']} {job['state']}: primes below {job['spec']['limit']:,} found so far: {shown}")
        return 0
