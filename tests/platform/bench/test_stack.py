"""benchmarks.stack: a benchmark told to stop (SIGTERM) takes its whole ``strata up`` with it -- the server, the
scheduler, the node and its workers -- instead of leaving them running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from support import free_port, group_processes, reaper, wait_for

pytestmark = pytest.mark.e2e


def test_a_sigterm_to_a_benchmark_stops_its_whole_stack(tmp_path):
    program = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from benchmarks.stack import Stack
        stack = Stack(Path({str(tmp_path / "home")!r}), {free_port()}, 1, {{}})
        print("GROUP", stack.process.pid, flush=True)
        stack.wait_ready()
        print("READY", flush=True)
        time.sleep(600)
    """)
    group = None
    with reaper() as start:
        bench = start([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
        try:
            first = bench.stdout.readline()
            assert first.startswith("GROUP"), first
            group = int(first.split()[1])
            ready = bench.stdout.readline()
            assert ready.startswith("READY"), (ready, (tmp_path / "home" / "up.log").read_text()[-3000:])
            assert len(group_processes(group)) >= 2  # strata up and what it started

            bench.send_signal(signal.SIGTERM)
            assert bench.wait(timeout=60) == 128 + signal.SIGTERM
            wait_for(lambda: not group_processes(group), 60, message="the stack's process group to be gone")
        finally:
            if group is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
