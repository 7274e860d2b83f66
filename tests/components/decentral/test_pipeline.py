"""The pipeline-parallel baseline: partition, frames, and real stage processes over throttled links.

The pipeline must train exactly as one process does on the same micro-batches (losses and parameters after the
Adam steps), carry exactly the activations and gradients over its links, and leave no child process or proxy
thread behind, even when a stage dies. Timings are never asserted (a loaded 2-core machine)."""

from __future__ import annotations

import math
import multiprocessing as mp
import socket
import struct
import threading
import time

import pytest
import torch

from benchmarks.decentral.pipeline import (
    HEADER,
    HELLO_BYTES,
    KIND_ACTIVATION,
    KIND_GRADIENT,
    PipelineError,
    encode_frame,
    frame_bytes,
    partition,
    read_frame,
    run_pipeline,
    single_process_reference,
)
from components.decentral.model import ModelConfig, build_model

TINY = ModelConfig.named("tiny")


def _no_leftovers():
    stages = [child for child in mp.active_children() if child.name.startswith("pipeline-stage")]
    assert stages == [], f"stage processes left running: {stages}"
    threads = [thread.name for thread in threading.enumerate() if thread.name.startswith("throttled-proxy")]
    assert threads == [], f"proxy threads left running: {threads}"


# -- pure parts ---------------------------------------------------------------------------------------------

def test_partition_is_contiguous_and_balanced():
    assert partition([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert partition([5, 1, 1, 1, 1, 5], 3) == [(0, 1), (1, 5), (5, 6)]
    assert partition([1, 10, 10, 10, 10, 1], 4) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert partition([3, 3, 3], 3) == [(0, 1), (1, 2), (2, 3)]
    assert partition([7], 1) == [(0, 1)]
    for stages in (0, 4):
        with pytest.raises(ValueError, match="cannot split"):
            partition([1, 2, 3], stages)


def _frame_through(sock_pair, kind, step, micro, tensor):
    left, right = sock_pair
    header, payload = encode_frame(kind, step, micro, tensor)
    left.sendall(header)
    left.sendall(payload)
    return read_frame(right)


def test_frames_round_trip_every_dtype():
    pair = socket.socketpair()
    try:
        for tensor in (torch.randn(2, 3, 4), torch.randn(5).to(torch.bfloat16), torch.randn(3, 2).half(),
                       torch.arange(7), torch.randn(2, 2).double(), torch.zeros(0, 3), torch.randn(4, 4).t()):
            kind, step, micro, got, nbytes = _frame_through(pair, KIND_GRADIENT, 12, 3, tensor)
            assert (kind, step, micro) == (KIND_GRADIENT, 12, 3)
            assert got.dtype == tensor.dtype and got.shape == tensor.shape
            assert torch.equal(got, tensor)
            assert nbytes == HEADER.size + 8 * tensor.dim() + tensor.numel() * tensor.element_size()
        assert frame_bytes([4, 64, 128]) == HEADER.size + 24 + 4 * 64 * 128 * 4
        pair[0].close()
        assert read_frame(pair[1]) is None  # a clean end of stream
    finally:
        for sock in pair:
            sock.close()


@pytest.mark.parametrize("header", [
    HEADER.pack(9, 1, 1, 0, 0) + struct.pack("<Q", 4),  # unknown kind
    HEADER.pack(KIND_ACTIVATION, 42, 1, 0, 0) + struct.pack("<Q", 4),  # unknown dtype
    HEADER.pack(KIND_ACTIVATION, 1, 9, 0, 0),  # too many dimensions
    HEADER.pack(KIND_ACTIVATION, 1, 2, 0, 0) + struct.pack("<2Q", 1 << 20, 1 << 20),  # 4 TiB
])
def test_bad_frame_headers_are_refused_before_any_payload(header):
    left, right = socket.socketpair()
    try:
        left.sendall(header)
        with pytest.raises(ValueError):
            read_frame(right)
    finally:
        left.close()
        right.close()


def test_a_truncated_frame_is_an_error():
    left, right = socket.socketpair()
    try:
        header, payload = encode_frame(KIND_ACTIVATION, 0, 0, torch.ones(100))
        left.sendall(header + bytes(payload)[:10])
        left.close()
        with pytest.raises(ConnectionError, match="middle of a frame"):
            read_frame(right)
    finally:
        right.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="schedule"):
        run_pipeline(TINY, stages=2, micro_batches=2, micro_batch_size=2, steps=1, mbit=None, schedule="zigzag")
    with pytest.raises(ValueError, match="micro_batches"):
        run_pipeline(TINY, stages=2, micro_batches=0, micro_batch_size=2, steps=1, mbit=None)
    with pytest.raises(ValueError, match="cannot split"):
        run_pipeline(TINY, stages=5, micro_batches=2, micro_batch_size=2, steps=1, mbit=None)


# -- real stages --------------------------------------------------------------------------------------------

def _check_against_one_process(result, *, micro_batches, micro_batch_size, steps, lr):
    losses, model = single_process_reference(TINY, micro_batches=micro_batches,
                                             micro_batch_size=micro_batch_size, steps=steps, lr=lr)
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert result["losses"] == pytest.approx(losses, rel=1e-5)
    return losses, model


def test_the_pipeline_trains_exactly_like_one_process():
    """Three stages, the default (eager) schedule, throttled links: the same losses and, after three Adam steps,
    the same parameters as one process training on the same batches."""
    M, size, steps, lr = 4, 2, 3, 3e-3
    result = run_pipeline(TINY, stages=3, micro_batches=M, micro_batch_size=size, steps=steps, mbit=200,
                          lr=lr, return_parameters=True, timeout_s=120)
    _no_leftovers()
    assert result["schedule"] == "eager"
    losses, model = _check_against_one_process(result, micro_batches=M, micro_batch_size=size, steps=steps, lr=lr)
    assert losses[-1] < losses[0]
    state = result["state"]
    names = [name for name, _ in model.named_parameters()]
    assert sorted(state) == sorted(names)  # the stages hold every parameter once
    initial = dict(build_model(TINY, 0).named_parameters())
    for name, parameter in model.named_parameters():
        got = torch.from_numpy(state[name])
        assert torch.allclose(got, parameter.detach(), rtol=1e-4, atol=1e-4), name
        assert not torch.equal(got, initial[name].detach()), f"{name} never moved"
    # Two links, each carrying the activations forward and their gradients back, one frame per micro-batch.
    frame = frame_bytes([size, TINY.context, TINY.width])
    assert result["frame_bytes"] == frame
    assert result["bytes_forward"] == 2 * (HELLO_BYTES + steps * M * frame)  # the token opens each link
    assert result["bytes_backward"] == 2 * steps * M * frame
    assert result["tokens"] == steps * M * size * TINY.context
    assert result["tokens_per_s"] > 0 and len(result["step_s"]) == steps
    bounds = result["partition"]
    assert bounds[0][0] == 0 and bounds[-1][1] == TINY.layers + 2
    assert all(left[1] == right[0] for left, right in zip(bounds, bounds[1:], strict=False))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_static_schedules_match_one_process(schedule):
    M, size, steps = 3, 2, 2
    result = run_pipeline(TINY, stages=2, micro_batches=M, micro_batch_size=size, steps=steps, mbit=None,
                          latency_ms=5, schedule=schedule, timeout_s=120)
    _no_leftovers()
    assert result["schedule"] == schedule
    _check_against_one_process(result, micro_batches=M, micro_batch_size=size, steps=steps, lr=1e-3)
    frame = frame_bytes([size, TINY.context, TINY.width])
    assert result["bytes_forward"] == HELLO_BYTES + steps * M * frame
    assert result["bytes_backward"] == steps * M * frame
    assert result["partition"] == [(0, 2), (2, 4)]


def test_a_stage_that_dies_is_named_and_every_child_is_reaped():
    with pytest.raises(PipelineError, match=r"stage 1 failed: the process died \(exit code 3\)"):
        run_pipeline(TINY, stages=3, micro_batches=2, micro_batch_size=2, steps=3, mbit=None,
                     timeout_s=120, _fault=(1, 1, "exit"))
    _no_leftovers()


def test_a_stage_that_fails_is_named():
    with pytest.raises(PipelineError, match="stage 1 failed: RuntimeError: injected fault at step 1"):
        run_pipeline(TINY, stages=2, micro_batches=2, micro_batch_size=2, steps=2, mbit=None,
                     timeout_s=120, _fault=(1, 1, "raise"))
    _no_leftovers()


def test_the_timeout_kills_the_stages():
    # Starting a stage process (spawn, import torch) takes far longer than this.
    with pytest.raises(TimeoutError, match="before the deadline"):
        run_pipeline(TINY, stages=2, micro_batches=2, micro_batch_size=2, steps=1, mbit=None, timeout_s=0.2)
    _no_leftovers()


def test_a_stage_trusts_only_the_connection_with_the_token():
    from benchmarks.decentral.pipeline import _accept_stage

    token = bytes(range(HELLO_BYTES))
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stray = socket.create_connection(("127.0.0.1", port))
    stray.sendall(b"GET / HTTP/1.0\r\n\r\n")
    good = socket.create_connection(("127.0.0.1", port))
    good.sendall(token + b"after")
    try:
        accepted = _accept_stage(server, token, deadline=time.monotonic() + 30)
        with accepted:
            assert accepted.recv(5) == b"after"
        try:  # the stray one was closed (a reset: it had sent bytes nobody read)
            assert stray.recv(10) == b""
        except ConnectionResetError:
            pass
    finally:
        for sock in (stray, good, server):
            sock.close()
