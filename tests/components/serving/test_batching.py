"""Batching in the gRPC endpoint: answers equal the model's alone, variable lengths, the bounded queue, and the
deadline-aware policy answering hopeless requests early."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
from support import wait_for

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.serving.client import ServingError, predict
from components.serving.endpoint import Batching, start_serving
from components.serving.model import load_served_model
from components.train.spec import TrainSpec
from components.train.workloads import builtin_workload


@pytest.fixture
def executor():
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        yield executor


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """A tiny-gpt model.pt (untrained weights are enough to compare answers exactly)."""
    path = tmp_path_factory.mktemp("gpt") / "model.pt"
    spec = TrainSpec().validate({"workload": "tiny-gpt", "hidden": 32})
    workload = builtin_workload("tiny-gpt")
    workload.setup(spec, torch.device("cpu"))
    torch.save({"workload": "tiny-gpt", "spec": spec, "state_dict": workload.model_state()}, path)
    return path


def block_the_device(executor):
    release, running = threading.Event(), threading.Event()

    def long_unit():
        running.set()
        release.wait(180)  # until the test releases it (a bound, so a failed test does not hang)
        return True

    executor.submit("long-unit", long_unit, MemoryRequest(2**10, 2**10))
    assert running.wait(60)
    return release


def alone(served, tokens):
    with torch.inference_mode():
        return served.module(torch.as_tensor(tokens)).numpy()


@pytest.mark.parametrize("policy", ["orloj", "fifo", "edf"])
def test_queued_requests_of_different_lengths_run_as_one_batch_with_their_own_answers(executor, gpt, policy):
    served = load_served_model(gpt)
    assert served.variable_length
    rng = np.random.default_rng(5)
    lengths = [3, 64, 17, 40, 1, 9]
    requests = [rng.integers(0, served.input_limit, size=(1 + index % 2, length)) for index, length in
                enumerate(lengths)]
    batching = Batching(policy=policy, max_batch=8, max_queue_delay_s=0.0)
    with start_serving(executor, "gpt", served, max_rows=64, batching=batching) as handle:
        release = block_the_device(executor)
        with ThreadPoolExecutor(len(requests)) as pool:
            try:
                # Generous deadlines: only the order and grouping are under test.
                futures = [pool.submit(predict, handle.address, tokens, timeout=60) for tokens in requests]
                # The first call may already be on the device (blocked behind the long unit); the rest queue.
                wait_for(lambda: handle.stats()["in_flight"] == len(requests), 120, "every call to reach the endpoint")
            finally:
                release.set()
            answers = [future.result() for future in futures]
        for tokens, answer in zip(requests, answers, strict=True):
            assert answer.shape == (*tokens.shape, served.input_limit)
            # Padding on the right does not change a causal model's outputs on the row's own positions.
            np.testing.assert_allclose(answer, alone(served, tokens), rtol=1e-4, atol=1e-5)
        stats = handle.stats()
    assert stats["policy"] == policy and stats["errors"] == 0 and stats["requests"] == len(requests)
    assert sum(size * count for size, count in stats["batch_sizes"].items()) == len(requests)
    assert max(stats["batch_sizes"]) >= 2, stats["batch_sizes"]  # requests that waited together ran together
    assert stats["slo_attainment"] == 1.0


def test_variable_lengths_are_checked(executor, gpt):
    served = load_served_model(gpt)
    with start_serving(executor, "gpt", served, max_rows=4) as handle:
        with pytest.raises(ServingError) as caught:
            predict(handle.address, np.zeros((1, 65), dtype=np.int64))
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "1 <= length <= 64" in caught.value.details
        assert predict(handle.address, np.zeros((2, 5), dtype=np.int64)).shape == (2, 5, served.input_limit)


def test_a_batch_never_exceeds_max_rows(executor, digits_model):
    served = load_served_model(digits_model)
    with start_serving(executor, "digits", served, max_rows=4, batching=Batching("fifo", max_batch=8)) as handle:
        release = block_the_device(executor)
        with ThreadPoolExecutor(6) as pool:
            try:
                futures = [pool.submit(predict, handle.address, np.ones((3, 64), np.float32), timeout=60)
                           for _ in range(6)]
                wait_for(lambda: handle.stats()["in_flight"] == 6, 120, "every call to reach the endpoint")
            finally:
                release.set()
            assert all(future.result().shape == (3, 10) for future in futures)
        # 3 rows each and at most 4 rows per forward pass: every batch held one request.
        assert handle.stats()["batch_sizes"] == {1: 6}


def test_a_full_queue_is_resource_exhausted_and_the_endpoint_recovers(executor, digits_model):
    served = load_served_model(digits_model)
    rows = np.ones((1, 64), np.float32)
    with start_serving(executor, "digits", served, max_rows=4,
                       batching=Batching("fifo", max_batch=1, max_queue=3)) as handle:
        release = block_the_device(executor)
        outcomes = []
        with ThreadPoolExecutor(8) as pool:
            try:
                # One goes to the (blocked) device, three wait in the queue; the rest find it full.
                first = [pool.submit(predict, handle.address, rows, timeout=60) for _ in range(4)]
                wait_for(lambda: handle.stats()["in_flight"] == 4 and handle.stats()["queue_depth"] == 3,
                         120, "one call on the device and three queued")
                for _ in range(3):
                    try:
                        predict(handle.address, rows, timeout=60)
                    except ServingError as error:
                        outcomes.append(error)
            finally:
                release.set()
            assert all(future.result().shape == (1, 10) for future in first)
        assert [error.code for error in outcomes] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
        assert "the queue is full" in outcomes[0].details
        assert predict(handle.address, rows).shape == (1, 10)  # healthy afterwards
        stats = handle.stats()
        assert stats["errors_by_status"] == {"RESOURCE_EXHAUSTED": 3} and stats["requests"] == 8
        assert stats["slo_attainment"] == pytest.approx(5 / 8)


def test_orloj_answers_a_hopeless_request_at_once_without_running_it(executor, digits_model):
    served = load_served_model(digits_model)
    rows = np.ones((1, 64), np.float32)
    with start_serving(executor, "digits", served, max_rows=4, batching=Batching("orloj", max_batch=4)) as handle:
        forwards = []  # after start_serving, which profiles the model's memory
        served.module.register_forward_hook(lambda *_: forwards.append(1))
        profile = handle.endpoint.dispatcher.policy.profile
        for _ in range(16):  # as if every batch had taken 30 s
            profile.observe(1, 0, 30.0)
        began = time.monotonic()
        with pytest.raises(ServingError) as caught:
            predict(handle.address, rows, timeout=20)
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "cannot finish by its deadline" in caught.value.details
        assert time.monotonic() - began < 15  # answered early, not at the deadline
        assert handle.stats()["dropped_early"] == 1 and not forwards
        # A request whose deadline leaves room is served.
        assert predict(handle.address, rows, timeout=60).shape == (1, 10) and len(forwards) == 1


def test_the_policy_learns_the_measured_batch_times(executor, digits_model):
    served = load_served_model(digits_model)
    with start_serving(executor, "digits", served, max_rows=4, batching=Batching("orloj", max_batch=4)) as handle:
        for _ in range(10):
            predict(handle.address, np.ones((1, 64), np.float32))
        profile = handle.endpoint.dispatcher.policy.profile
        assert profile.runs(1, 0) == 10
        assert 0 < profile.mean(1, 0) < 5  # seconds: the measured forward passes, not the prior


def test_orloj_preempts_a_long_batch_between_layers_for_a_request_that_cannot_wait(executor, gpt):
    served = load_served_model(gpt)
    rng = np.random.default_rng(1)
    long_tokens = rng.integers(0, served.input_limit, size=(1, 64))
    short_tokens = rng.integers(0, served.input_limit, size=(1, 8))
    with start_serving(executor, "gpt", served, max_rows=8, batching=Batching("orloj", max_batch=4)) as handle:
        dispatcher, session = handle.endpoint.dispatcher, handle.endpoint.session
        profile = dispatcher.policy.profile
        for _ in range(16):  # as if a long batch took 10 s, and a short one 10 ms
            profile.observe(1, dispatcher.bucket(torch.as_tensor(long_tokens)), 10.0)
            profile.observe(1, dispatcher.bucket(torch.as_tensor(short_tokens)), 0.01)
        queued = threading.Event()
        # Hold the long batch inside its second layer until the short request waits in the queue.
        session.stages[1].register_forward_pre_hook(lambda *_: queued.wait(20) and None)
        with ThreadPoolExecutor(2) as pool:
            long_call = pool.submit(predict, handle.address, long_tokens, timeout=60)
            wait_for(lambda: handle.stats()["in_flight"] == 1 and dispatcher.depth() == 0, 120, "the long batch to run")
            # 5 s: too short to wait for the rest of a 10-s batch, long enough to run now on a loaded machine.
            short_call = pool.submit(predict, handle.address, short_tokens, timeout=5)
            wait_for(lambda: dispatcher.depth() == 1, 120, "the short request to queue")
            queued.set()
            short_answer = short_call.result()
            long_answer = long_call.result()
        np.testing.assert_allclose(short_answer, alone(served, short_tokens), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(long_answer, alone(served, long_tokens), rtol=1e-4, atol=1e-5)
        stats = handle.stats()
    assert stats["preemptions"] == 1 and stats["errors"] == 0 and stats["batches"] == 2


def test_fifo_never_preempts(executor, gpt):
    served = load_served_model(gpt)
    with start_serving(executor, "gpt", served, max_rows=8, batching=Batching("fifo", max_batch=4)) as handle:
        assert handle.endpoint.session.urgent is None
        predict(handle.address, np.zeros((1, 8), np.int64))
        assert handle.stats()["preemptions"] == 0


class RecordingExecutor:
    """Just enough of a DeviceExecutor for a Dispatcher: records which thread hands it each batch, and leaves
    each batch's future to the test."""

    def __init__(self):
        self.launched: list[tuple[str, object, object]] = []  # (thread name, batch, future)
        self.changed = threading.Condition()

    def infer(self, name, batch):
        from concurrent.futures import Future

        future = Future()
        with self.changed:
            self.launched.append((threading.current_thread().name, batch, future))
            self.changed.notify_all()
        return future

    def wait_for(self, count, timeout=10.0):
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.launched) >= count, timeout), self.launched
        return self.launched[count - 1]


def dispatcher_with(batching):
    from types import SimpleNamespace

    from components.serving.endpoint import Dispatcher

    executor = RecordingExecutor()
    served = SimpleNamespace(variable_length=False, input_shape=(4,))
    endpoint = SimpleNamespace(executor=executor, name="ep", served=served, max_rows=64)
    return Dispatcher(endpoint, batching), executor


def call(deadline_s=30.0):
    from components.serving.endpoint import _Call

    return _Call(torch.zeros(1, 4), time.monotonic() + deadline_s)


@pytest.mark.parametrize("policy", ["orloj", "edf"])
def test_a_request_to_an_idle_endpoint_goes_to_the_device_from_its_own_thread(policy):
    """No hop to the dispatcher's thread: the caller's thread asks the policy and hands the batch over; the next
    batch goes from the thread that finished the last one."""
    dispatcher, executor = dispatcher_with(Batching(policy=policy, max_batch=4))
    try:
        threading.current_thread().name = "caller"
        first = call()
        dispatcher.submit(first)
        thread, batch, future = executor.wait_for(1)
        assert thread == "caller" and batch.calls == [first]
        waiting = [call(), call()]
        for item in waiting:  # the device is busy: they queue
            dispatcher.submit(item)
        assert len(executor.launched) == 1 and dispatcher.depth() == 2

        def finish():
            batch.ran, batch.seconds = batch.calls, 0.001
            future.set_result([torch.zeros(1, 4)])

        finisher = threading.Thread(target=finish, name="device")
        finisher.start()
        finisher.join()
        thread, second, _ = executor.wait_for(2)
        assert thread == "device" and second.calls == waiting  # both, as one batch
        assert first.answer.result(1).shape == (1, 4) and dispatcher.batches == 1
    finally:
        threading.current_thread().name = "MainThread"
        dispatcher.stop()


def test_fifo_queue_delay_is_the_dispatcher_threads_timer():
    dispatcher, executor = dispatcher_with(Batching(policy="fifo", max_batch=4, max_queue_delay_s=0.05))
    try:
        began = time.monotonic()
        dispatcher.submit(call())
        thread, batch, _ = executor.wait_for(1)
        assert thread == "serving-batcher-ep" and len(batch.calls) == 1
        assert time.monotonic() - began >= 0.05  # it waited for a fuller batch, then went alone
    finally:
        dispatcher.stop()
