"""TrainLoopSession with ``host_io``: checkpoint and artifact uploads run on the job's host thread, so a slow
store does not stall the other jobs on the device, and what is stored is exactly what a solo run stores."""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field

import pytest
import torch

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.sessions import CallableSession, TrainLoopSession
from components.runtime.contract.context import LocalContext
from components.train.loop import TrainLoop
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload

pytestmark = pytest.mark.timeout(120)
UPLOAD_S = 0.3


@dataclass
class RecordingContext(LocalContext):
    """Keeps every checkpoint it stores (step -> bytes); each store or artifact upload takes ``delay`` s."""

    delay: float = 0.0
    stored: dict = field(default_factory=dict)
    uploads: list = field(default_factory=list)  # (thread name, start, end)

    def _slow(self, started: float) -> None:
        time.sleep(self.delay)
        self.uploads.append((threading.current_thread().name, started, time.perf_counter()))

    def checkpoint(self, state):
        started = time.perf_counter()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.stored[int(state["step"])] = buffer.getvalue()
        self._slow(started)
        super().checkpoint(state)

    def artifact(self, path, name=None):
        started = time.perf_counter()
        super().artifact(path, name)
        self._slow(started)


def same(left, right) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right, strict=True))
    return left == right


def load(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


SPEC = {"workload": "mlp-digits", "hidden": 32, "seed": 7, "max_steps": 30, "checkpoint_every": 10, "log_every": 5}


def make_loop(tmp_path, name, delay=0.0):
    spec = TrainSpec().validate(SPEC)
    ctx = RecordingContext(job_id=name, attempt_id=f"{name}-attempt", spec=spec, workdir=tmp_path / name,
                           delay=delay)
    return TrainLoop(builtin_workload("mlp-digits"), spec, ctx, owns_process=False), ctx


def run_beside_a_ticker(loop, host_io: bool):
    """Run ``loop`` as a session next to a job of 2 ms iterations; returns (the ticker's iteration times,
    the loop's session, seconds until the executor saw the loop end)."""
    ticks: list[float] = []
    a_done = threading.Event()

    def tick():
        ticks.append(time.perf_counter())
        time.sleep(0.002)
        return a_done.is_set() and len(ticks) > 50

    loop.prefetch()
    session = TrainLoopSession(loop, host_io=host_io)
    with DeviceExecutor("cpu", "1GiB", "fair") as executor:
        executor.submit("ticker", CallableSession(tick), MemoryRequest(2**20, 2**20))
        executor.submit("a", session, MemoryRequest(2**20, 2**20))
        status = executor.wait("a", 60)
        a_done.set()
        assert executor.wait("ticker", 60)["state"] == "succeeded"
    assert status["state"] == "succeeded", status
    return ticks, session


def max_gap(ticks: list[float], start: float, end: float) -> float:
    inside = [t for t in ticks if start - 0.2 <= t <= end + 0.2]
    return max(b - a for a, b in zip(inside, inside[1:], strict=False))


def test_slow_uploads_do_not_stall_the_device_and_store_what_a_solo_run_stores(tmp_path):
    solo, solo_ctx = make_loop(tmp_path, "solo")
    solo.run()  # the child-process path: stores synchronously
    assert sorted(solo_ctx.stored) == [10, 20, 30]

    loop, ctx = make_loop(tmp_path, "shared", delay=UPLOAD_S)
    ticks, session = run_beside_a_ticker(loop, host_io=True)
    session.wait_host_io(30)  # the executor is done with the job before its files are stored
    uploads = ctx.uploads
    assert uploads and all(not name.startswith("gpushare-") for name, _, _ in uploads), uploads
    window = (min(start for _, start, _ in uploads), max(end for _, _, end in uploads))
    gap = max_gap(ticks, *window)
    print(f"\nhost_io: {len(uploads)} uploads of {UPLOAD_S} s; the other job's max gap {1000 * gap:.1f} ms")
    assert gap < 0.1, gap
    # Stored: the last checkpoint always; an earlier one may be superseded while a slow upload runs.
    assert 30 in ctx.stored and set(ctx.stored) <= {10, 20, 30}
    for step, data in ctx.stored.items():
        assert same(load(data), load(solo_ctx.stored[step])), step
    assert same(ctx.restore(), solo_ctx.restore())
    shared_model = torch.load(ctx.artifacts["model.pt"], weights_only=True)["state_dict"]
    solo_model = torch.load(solo_ctx.artifacts["model.pt"], weights_only=True)["state_dict"]
    assert same(shared_model, solo_model)
    assert "metrics.json" in ctx.artifacts
    assert ctx.logs[-1][2].startswith("done: mlp-digits ran 30 steps")

    # The same job without host_io stalls the other job for a whole upload.
    inline, _ = make_loop(tmp_path, "inline", delay=UPLOAD_S)
    ticks, _ = run_beside_a_ticker(inline, host_io=False)
    stalled = max(b - a for a, b in zip(ticks, ticks[1:], strict=False))
    print(f"inline: the other job's max gap {1000 * stalled:.1f} ms")
    assert stalled >= UPLOAD_S


def test_a_stopped_job_resumes_from_a_prefetched_checkpoint_bit_identically(tmp_path):
    solo, solo_ctx = make_loop(tmp_path, "solo")
    solo.run()

    loop, ctx = make_loop(tmp_path, "job", delay=0.05)
    loop.prefetch()
    session = TrainLoopSession(loop, host_io=True)
    session.start(torch.device("cpu"))
    for _ in range(13):
        session.step()
    ctx.request_stop()
    session.step()  # checkpoints at step 13 and ends
    assert session.result() == {"stopped_at_step": 13}
    session.wait_host_io(10)
    assert ctx.restore()["step"] == 13

    again, ctx2 = make_loop(tmp_path, "job")  # the same workdir: the next attempt
    again.prefetch()  # downloads now; start() does no I/O
    ctx2._load_checkpoint_bytes = lambda: pytest.fail("start() downloaded the checkpoint")
    again.use_host_io()
    again.start()
    assert again.resumed_from == 13
    while not again.done:
        again.step()
    again.finish()
    again.wait_host_io(10)
    assert same(again.workload.model_state(), solo.workload.model_state())
    assert same(load(ctx2.stored[30]), load(solo_ctx.stored[30]))


def test_an_upload_error_is_raised_by_wait_host_io(tmp_path):
    loop, ctx = make_loop(tmp_path, "broken")

    def broken(data):
        raise OSError("disk full")

    ctx._save_checkpoint_bytes = broken
    loop.use_host_io()
    loop.start()
    for _ in range(10):
        loop.step()
    with pytest.raises(OSError, match="disk full"):
        loop.wait_host_io(10)
