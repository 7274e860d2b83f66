"""ServeComponent: the child-process path of a serve job, driven through a LocalContext."""

import threading

import grpc
import numpy as np
import pytest
from support import wait_for

from components.runtime.contract.context import DeviceHandle, LocalContext
from components.runtime.contract.spec import SpecError
from components.runtime.shared.tokens import token_digest
from components.serving.bind import InsecureBindError
from components.serving.client import ServingError, describe, predict
from components.serving.component import ServeComponent, serving_hosts
from components.serving.model import load_served_model

SOURCE_JOB = "0d4f3c1a-8b7e-4f60-a2d9-6c5b4e3f2a10"
TOKEN = "sj_test_0123456789"


class QuickServe(ServeComponent):
    metrics_every_s = 0.1
    stop_poll_s = 0.02
    stop_grace_s = 0.5


def start(ctx):
    errors = []

    def run():
        try:
            QuickServe().run(ctx)
        except BaseException as error:  # reported by the caller's assertions
            errors.append(error)

    thread = threading.Thread(target=run, name="serve-attempt")
    thread.start()
    return thread, errors


def test_serve_run_publishes_an_endpoint_serves_and_stops_on_request(tmp_path, digits_model, digits_test_set):
    ctx = LocalContext(job_id="serve-job", attempt_id="a1", spec={"model": {"job": SOURCE_JOB}}, workdir=tmp_path,
                       devices=[DeviceHandle("virtual", 0, 2**30)], sources={"model.pt": digits_model},
                       tokens=[token_digest(TOKEN)])
    thread, errors = start(ctx)
    try:
        wait_for(lambda: ctx.endpoint.address is not None or errors)
        assert not errors
        assert ctx.endpoint.address.startswith("127.0.0.1:")
        assert ctx.spec == {"model": {"job": SOURCE_JOB, "entrypoint": None}, "port": 0, "request_timeout_s": 10.0, "max_rows": 1024,
                            "slo_ms": None, "auth": "token", "replicas": 1, "autoscale": None, "emoe": None,
                            "batching": {"policy": "orloj", "max_batch": 8, "max_queue_delay_ms": 2.0,
                                         "max_queue": 128, "preempt": True}}
        info = describe(ctx.endpoint.address, token=TOKEN)
        assert (info["workload"], info["source_job"], info["max_rows"]) == ("mlp-digits", SOURCE_JOB, 1024)
        features, labels = digits_test_set
        # A missing or wrong token is UNAUTHENTICATED, on both methods, and runs nothing.
        for token in (None, "", "sj_wrong", "x" * 5000):
            for call in (lambda t: predict(ctx.endpoint.address, features[:1], token=t), lambda t: describe(ctx.endpoint.address, token=t)):
                with pytest.raises(ServingError) as refused:
                    call(token)
                assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED, token
        assert "strata job-token create" in str(refused.value) or "not valid" in str(refused.value)
        answer = predict(ctx.endpoint.address, features, token=TOKEN)
        served = load_served_model(digits_model)
        import torch

        with torch.inference_mode():
            assert np.array_equal(answer, served.module(torch.from_numpy(features)).numpy())
        assert (answer.argmax(axis=1) == labels).mean() > 0.85
        wait_for(lambda: any(name == "requests" and value >= 1 for name, value, _ in ctx.metric_points))
        # Revoked (the job's working digests no longer hold it): refused after the next refresh.
        ctx.tokens = []

        def refused_now():
            try:
                predict(ctx.endpoint.address, features[:1], token=TOKEN)
            except ServingError as error:
                return error.code == grpc.StatusCode.UNAUTHENTICATED
            return False

        wait_for(refused_now, timeout=30)
    finally:
        ctx.request_stop()
        thread.join(10)
    assert not thread.is_alive() and not errors
    with pytest.raises(ServingError) as caught:
        predict(ctx.endpoint.address, features[:1], timeout=2, token=TOKEN)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE

    names = {name for name, _, _ in ctx.metric_points}
    assert {"requests", "errors", "p50_ms", "p99_ms"} <= names
    steps = [step for name, _, step in ctx.metric_points if name == "requests"]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    messages = [message for _, _, message in ctx.logs]
    assert any(message.startswith(f"listening on {ctx.endpoint.address}") for message in messages)
    assert any(message.startswith(f"serving mlp-digits of job {SOURCE_JOB} on {ctx.endpoint.address}") for message in messages)
    assert messages[-1].startswith("stopped serving after ") and "errors)" in messages[-1]


def test_serve_run_fails_without_a_model(tmp_path):
    ctx = LocalContext(job_id="serve-job", attempt_id="a2", spec={"model": {"job": SOURCE_JOB}}, workdir=tmp_path)
    with pytest.raises(FileNotFoundError, match="model.pt"):
        QuickServe().run(ctx)
    ctx.spec = {"model": {"job": "not-a-uuid"}}
    with pytest.raises(SpecError):
        QuickServe().run(ctx)


def test_serving_hosts_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("STRATA_SERVING_HOST", raising=False)
    monkeypatch.delenv("STRATA_SERVING_ADVERTISE_HOST", raising=False)
    monkeypatch.delenv("STRATA_SERVING_INSECURE_BIND", raising=False)
    assert serving_hosts() == ("127.0.0.1", "127.0.0.1")
    for loopback in ("127.0.0.2", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"):
        monkeypatch.setenv("STRATA_SERVING_HOST", loopback)
        assert serving_hosts() == (loopback, loopback)
    # No authentication yet: any other interface is refused, with the reason and the opt-in.
    for wider in ("0.0.0.0", "::", "10.1.2.3", "node-7.example", "127.0.0.1.example"):
        monkeypatch.setenv("STRATA_SERVING_HOST", wider)
        with pytest.raises(InsecureBindError) as refused:
            serving_hosts()
        message = str(refused.value)
        assert f"will not bind {wider!r} (from STRATA_SERVING_HOST)" in message and "\n" not in message
        assert "no authentication" in message and "STRATA_SERVING_INSECURE_BIND=1" in message
    monkeypatch.setenv("STRATA_SERVING_INSECURE_BIND", "0")
    monkeypatch.setenv("STRATA_SERVING_HOST", "0.0.0.0")
    with pytest.raises(InsecureBindError):
        serving_hosts()
    monkeypatch.setenv("STRATA_SERVING_INSECURE_BIND", "1")  # the operator's explicit opt-in
    host, advertised = serving_hosts()
    assert host == "0.0.0.0" and advertised not in ("0.0.0.0", "")
    monkeypatch.setenv("STRATA_SERVING_ADVERTISE_HOST", "node-7.example")
    assert serving_hosts() == ("0.0.0.0", "node-7.example")


def test_a_refused_bind_fails_the_attempt_before_the_model_is_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_SERVING_HOST", "0.0.0.0")
    monkeypatch.delenv("STRATA_SERVING_INSECURE_BIND", raising=False)
    # No model.pt at all: the bind is refused first, with its own reason (auth: none; with tokens any bind goes).
    ctx = LocalContext(job_id="serve-job", attempt_id="a3", spec={"model": {"job": SOURCE_JOB}, "auth": "none"},
                       workdir=tmp_path)
    with pytest.raises(InsecureBindError, match="no authentication"):
        QuickServe().run(ctx)
    assert ctx.endpoint.address is None


# -- the serve session against the session conformance suite -------------------------------------------------

from components.runtime.testing.conformance.sessions import SessionConformance  # noqa: E402


class TestServeSession(SessionConformance):
    kind = "serve"
    attached = True

    @pytest.fixture(autouse=True)
    def _model(self, digits_model):
        self.model = digits_model

    def spec(self):
        return {"model": {"job": SOURCE_JOB}}

    def sources(self, tmp_path):
        return {"model.pt": self.model}

    def make_session(self, ctx, hosted):
        return QuickServe().session(ctx, hosted=hosted)

    def make_executor(self):
        from components.gpushare.executor import DeviceExecutor

        return DeviceExecutor("cpu", memory_budget=2**30, policy="fifo", name="virtual:0")
