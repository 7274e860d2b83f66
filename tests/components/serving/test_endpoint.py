"""The gRPC endpoint on 127.0.0.1: exact answers, its error statuses, stopping, and serving next to training."""

import threading
import time

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.gpushare.stages import StagedWorkloadSession
from components.serving import serving_pb2, serving_pb2_grpc
from components.serving.client import ServingError, describe, encode, predict, predict_timed
from components.serving.endpoint import AdmissionRejected, endpoint_memory, start_serving
from components.serving.model import ServedModel, load_served_model
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload

SOURCE_JOB = "5b0c3f7e-2a51-4c1e-9d0e-3f6b8f1a2c44"


@pytest.fixture
def executor():
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        yield executor


@pytest.fixture
def served(digits_model):
    return load_served_model(digits_model)


@pytest.fixture
def handle(executor, served):
    handle = start_serving(executor, "digits", served, max_rows=32, source_job=SOURCE_JOB, request_timeout_s=0.5)
    yield handle
    handle.stop(grace=0.5)


def local_output(served, rows) -> np.ndarray:
    with torch.inference_mode():
        return served.module(torch.as_tensor(rows)).numpy()


def expect_status(code, call, *args, **kwargs) -> ServingError:
    with pytest.raises(ServingError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value
    return caught.value


def block_the_device(executor):
    """Occupy the execution thread with one long unit of training work until the returned event is set."""
    release, running = threading.Event(), threading.Event()

    def long_unit():
        running.set()
        release.wait(10)
        return True  # done after this one unit

    executor.submit("long-unit", long_unit, MemoryRequest(2**10, 2**10))
    assert running.wait(5)
    return release


def test_predictions_equal_the_local_model_exactly(handle, served, digits_test_set):
    features, labels = digits_test_set
    assert handle.address.startswith("127.0.0.1:") and handle.port > 0
    answers = [predict(handle.address, features[start:start + 32]) for start in range(0, len(features), 32)]
    for start, answer in zip(range(0, len(features), 32), answers, strict=True):
        assert answer.dtype == np.float32
        # Equal to float32 rounding: a matmul's summation order may differ between threads and batch shapes.
        np.testing.assert_allclose(answer, local_output(served, features[start:start + 32]), rtol=1e-5, atol=1e-5)
    accuracy = (np.concatenate(answers).argmax(axis=1) == labels).mean()
    assert accuracy > 0.85

    one, server_ms = predict_timed(handle.address, features[:1].astype(np.float64))  # float64 is sent as float32
    np.testing.assert_allclose(one, local_output(served, features[:1]), rtol=1e-5, atol=1e-5)
    assert server_ms > 0
    stats = handle.stats()
    assert stats["requests"] == len(answers) + 1 and stats["errors"] == 0 and stats["rows"] == len(features) + 1
    assert 0 < stats["p50_ms"] <= stats["p99_ms"]
    assert stats["state"] == "admitted" and stats["served"] == len(answers) + 1


def test_describe(handle):
    assert describe(handle.address) == {
        "workload": "mlp-digits",
        "source_job": SOURCE_JOB,
        "input_shape": [64],
        "input_dtype": "float32",
        "output_shape": [10],
        "output_dtype": "float32",
        "max_rows": 32,
        "input_limit": 0,
    }


def test_bad_requests_are_invalid_arguments(handle):
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    rows = np.zeros((2, 64), dtype=np.float32)
    assert "takes float32" in expect_status(invalid, predict, handle.address, rows.astype(np.int64)).details
    assert "each row must be [64]" in expect_status(invalid, predict, handle.address, rows[:, :63]).details
    assert "each row must be [64]" in expect_status(invalid, predict, handle.address, rows[0]).details
    too_many = expect_status(invalid, predict, handle.address, np.zeros((33, 64), dtype=np.float32))
    assert "33 rows is more than this endpoint's max_rows 32" in too_many.details
    assert "empty" in expect_status(invalid, predict, handle.address, rows[:0]).details

    # Malformed messages a foreign client could send.
    with grpc.insecure_channel(handle.address) as channel:
        stub = serving_pb2_grpc.InferenceStub(channel)
        for tensor, problem in [
            (serving_pb2.Tensor(shape=[1, 64], dtype="float16", data=b"\0" * 128), "dtype 'float16'"),
            (serving_pb2.Tensor(shape=[1, 64], dtype="float32", data=b"\0" * 100), "needs 256"),
            (serving_pb2.Tensor(shape=[1, -64], dtype="float32"), "negative"),
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(serving_pb2.PredictRequest(input=tensor), timeout=5)
            assert caught.value.code() == invalid and problem in caught.value.details()
    stats = handle.stats()
    assert stats["errors"] == stats["requests"] == 8
    assert stats["errors_by_status"] == {"INVALID_ARGUMENT": 8}
    assert predict(handle.address, rows).shape == (2, 10)  # the endpoint is unharmed


def test_deadlines_while_the_device_is_busy(executor, handle, served):
    rows = np.ones((1, 64), dtype=np.float32)
    expected = local_output(served, rows)
    forwards = []
    served.module.register_forward_hook(lambda *_: forwards.append(1))
    release = block_the_device(executor)
    try:
        # The client's deadline, and without one the endpoint's request_timeout_s (0.5 s). The device stays
        # blocked until ``release``, so any deadline expires; 2 s (not a few ms) so that on a loaded machine the
        # call still reaches the server before its deadline and is counted there.
        expect_status(grpc.StatusCode.DEADLINE_EXCEEDED, predict, handle.address, rows, timeout=2.0)
        late = expect_status(grpc.StatusCode.DEADLINE_EXCEEDED, predict, handle.address, rows, timeout=None)
        assert "no answer within 0.5 s" in late.details
        # A call its client cancels is answered (and counted) at once, not when the device comes back.
        with grpc.insecure_channel(handle.address) as channel:
            request = serving_pb2.PredictRequest(input=encode(rows))
            pending = serving_pb2_grpc.InferenceStub(channel).Predict.future(request, timeout=30)
            while handle.stats()["in_flight"] == 0:
                time.sleep(0.005)
            pending.cancel()
            while handle.stats()["requests"] < 3:
                time.sleep(0.005)
    finally:
        release.set()
    assert np.array_equal(predict(handle.address, rows), expected)
    stats = handle.stats()
    assert stats["errors_by_status"] == {"DEADLINE_EXCEEDED": 2, "CANCELLED": 1} and stats["requests"] == 4
    # The three requests' callers had gone before the device came back: skipped (left out of the queue, or
    # out of the batch on the device), not computed. One batch ran: the last request's.
    assert stats["batches"] == 1 and stats["batch_sizes"] == {1: 1} and len(forwards) == 1


def test_a_model_error_is_internal(executor):
    class Picky(nn.Module):
        def forward(self, x):
            if bool((x < 0).any()):
                raise ValueError("negative inputs are not allowed")
            return x * 2

    served = ServedModel("picky", {}, Picky().eval(), torch.zeros(1, 3), (3,), "float32", (3,))
    with start_serving(executor, "picky", served, memory_request=MemoryRequest(2**10, 2**10)) as handle:
        failure = expect_status(grpc.StatusCode.INTERNAL, predict, handle.address, [[1.0, -1.0, 0.0]])
        assert failure.details == "the model raised ValueError: negative inputs are not allowed"
        assert predict(handle.address, [[1.0, 2.0, 3.0]]).tolist() == [[2.0, 4.0, 6.0]]


def test_token_ids_outside_the_vocabulary_are_invalid(tmp_path, executor):
    spec = TrainSpec().validate({"workload": "tiny-gpt", "hidden": 32})
    workload = builtin_workload("tiny-gpt")
    workload.setup(spec, torch.device("cpu"))
    torch.save({"workload": "tiny-gpt", "spec": spec, "state_dict": workload.model_state()}, tmp_path / "model.pt")
    served = load_served_model(tmp_path / "model.pt")
    with start_serving(executor, "gpt", served, max_rows=4) as handle:
        tokens = np.arange(128).reshape(2, 64) % served.input_limit
        logits = predict(handle.address, tokens)
        assert logits.shape == (2, 64, served.input_limit)
        assert np.array_equal(logits, local_output(served, tokens))
        tokens[1, 5] = served.input_limit
        out_of_range = expect_status(grpc.StatusCode.INVALID_ARGUMENT, predict, handle.address, tokens)
        assert f"[0, {served.input_limit})" in out_of_range.details
        expect_status(grpc.StatusCode.INVALID_ARGUMENT, predict, handle.address, tokens.astype(np.float32))


def test_after_stop_calls_are_refused_and_the_executor_released_the_endpoint(executor, handle):
    rows = np.zeros((1, 64), dtype=np.float32)
    predict(handle.address, rows)
    handle.stop(grace=0.5)
    handle.stop()  # idempotent
    expect_status(grpc.StatusCode.UNAVAILABLE, predict, handle.address, rows, timeout=2)
    expect_status(grpc.StatusCode.UNAVAILABLE, describe, handle.address, timeout=2)
    assert executor.job_status("digits")["state"] == "cancelled"
    memory = executor.status()["memory"]
    assert memory["free"] == memory["budget"] and not memory["admitted"]


def test_a_stop_answers_the_calls_still_waiting_for_the_device(executor, handle):
    rows = np.zeros((1, 64), dtype=np.float32)
    release = block_the_device(executor)
    outcome = []

    def waiting_call():
        try:
            outcome.append(predict(handle.address, rows, timeout=30))
        except ServingError as error:
            outcome.append(error)

    caller = threading.Thread(target=waiting_call)
    caller.start()
    while handle.stats()["in_flight"] == 0:
        time.sleep(0.01)
    began = time.monotonic()
    handle.stop(grace=0.2)
    caller.join(10)
    release.set()
    assert not caller.is_alive() and time.monotonic() - began < 5
    [error] = outcome
    assert isinstance(error, ServingError) and error.code == grpc.StatusCode.UNAVAILABLE
    assert "stopped before the request's turn" in error.details
    executor.wait("digits", timeout=5)


def test_an_endpoint_that_can_never_fit_is_rejected_and_nothing_is_left_running(served):
    with DeviceExecutor("cpu", 64 * 2**10, "pack") as executor:
        with pytest.raises(AdmissionRejected, match="cannot fit the device"):
            start_serving(executor, "digits", served)
        assert executor.job_status("digits")["state"] == "rejected"


def test_a_busy_port_fails_cleanly(executor, handle, served):
    with pytest.raises(OSError, match="cannot bind"):
        start_serving(executor, "second", served, port=handle.port)
    executor.wait("second", timeout=5)  # cancelled in the executor
    assert predict(handle.address, np.zeros((1, 64), dtype=np.float32)).shape == (1, 10)


def test_the_memory_request_covers_a_full_batch(served):
    from components.gpushare.memory import profile_module

    full = profile_module(served.module, torch.zeros(256, 64))  # measured, with the same headroom
    estimate = endpoint_memory(served, 256)
    assert estimate.persistent == full.persistent > sum(p.numel() * 4 for p in served.module.parameters())
    assert full.ephemeral <= estimate.ephemeral <= 1.05 * full.ephemeral  # extrapolated from 1 and 16 rows
    assert endpoint_memory(served, 1).ephemeral < estimate.ephemeral


def test_serving_next_to_staged_training_keeps_training_bit_identical(executor, handle, served, digits_test_set):
    features, _ = digits_test_set
    expected = local_output(served, features[:8])
    fields = {"seed": 7, "hidden": 32, "batch_size": 8}
    steps = 12
    training = StagedWorkloadSession.builtin("tiny-gpt", stages=4, steps=steps, **fields)
    answers, failures = [], []
    done = threading.Event()

    def client():
        while not done.is_set():
            try:
                answers.append(predict(handle.address, features[:8]))
            except ServingError as error:  # pragma: no cover - reported by the assertion below
                failures.append(error)

    caller = threading.Thread(target=client)
    caller.start()
    try:
        while handle.stats()["requests"] < 3:  # requests already flowing when training starts
            time.sleep(0.005)
        executor.submit("train", training, MemoryRequest(64 * 2**20, 64 * 2**20))
        status = executor.wait("train", timeout=60)
    finally:
        done.set()
        caller.join(10)
    assert status["state"] == "succeeded" and status["steps"] == steps
    assert not failures and len(answers) > 3
    assert all(np.array_equal(answer, expected) for answer in answers)

    timeline = executor.timeline()
    train_units = [unit for unit in timeline if unit["job"] == "train" and unit["kind"] != "setup"]
    run_start, run_end = train_units[0]["start"], train_units[-1]["end"]
    inside = [unit for unit in timeline if unit["job"] == "digits" and unit["kind"] == "inference"
              and run_start <= unit["start"] and unit["end"] <= run_end]
    assert inside, "no request was served while the training job ran"

    alone = StagedWorkloadSession.builtin("tiny-gpt", stages=4, steps=steps, **fields)
    with DeviceExecutor("cpu", "1GiB", "pack") as solo:
        solo.submit("train", alone, MemoryRequest(64 * 2**20, 64 * 2**20))
        assert solo.wait("train", timeout=60)["state"] == "succeeded"
    for (name, shared), solo_tensor in zip(training.workload.model.state_dict().items(),
                                           alone.workload.model.state_dict().values(), strict=True):
        assert torch.equal(shared, solo_tensor), name


def test_a_new_server_on_a_port_an_old_one_left_is_reached_at_once(executor, served, digits_test_set):
    """The client caches one channel per address; when its server goes away the channel backs off before it
    reconnects. A new endpoint on the same port is still reached by the very next call."""
    features, _ = digits_test_set
    first = start_serving(executor, "first", served, max_rows=32, source_job=SOURCE_JOB)
    port = first.port
    assert predict(first.address, features[:2]).shape == (2, 10)
    first.stop(grace=0.5)
    expect_status(grpc.StatusCode.UNAVAILABLE, predict, first.address, features[:2], timeout=2)
    second = start_serving(executor, "second", served, max_rows=32, source_job=SOURCE_JOB, port=port)
    try:
        assert second.address == first.address
        np.testing.assert_allclose(predict(second.address, features[:2], timeout=5), local_output(served, features[:2]),
                                   rtol=1e-5, atol=1e-5)
    finally:
        second.stop(grace=0.5)
