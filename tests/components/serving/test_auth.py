"""Deployment tokens and TLS on the gRPC endpoint: missing, wrong or revoked tokens are UNAUTHENTICATED."""

import subprocess

import grpc
import numpy as np
import pytest
from support import wait_for

from components.gpushare.executor import DeviceExecutor
from components.runtime.shared.tokens import TokenGate, token_digest
from components.serving.client import ServingError, describe, predict
from components.serving.endpoint import start_serving
from components.serving.model import load_served_model

ROWS = np.ones((1, 64), np.float32)


@pytest.fixture
def executor():
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        yield executor


def code_of(call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except ServingError as error:
        return error.code, error.details
    return grpc.StatusCode.OK, ""


def test_missing_wrong_and_revoked_tokens_are_unauthenticated(executor, digits_model):
    working = {token_digest("sj_good"), token_digest("sj_other")}
    gate = TokenGate(lambda: set(working), refresh_s=0.05, name="auth").start()
    try:
        with start_serving(executor, "digits", load_served_model(digits_model), max_rows=4, gate=gate) as handle:
            assert code_of(predict, handle.address, ROWS, token="sj_good")[0] == grpc.StatusCode.OK
            assert describe(handle.address, token="sj_other")["workload"] == "mlp-digits"
            code, details = code_of(predict, handle.address, ROWS)
            assert code == grpc.StatusCode.UNAUTHENTICATED and "strata job-token create" in details
            assert code_of(predict, handle.address, ROWS, token="sj_bad")[0] == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(describe, handle.address, token="sj_bad")[0] == grpc.StatusCode.UNAUTHENTICATED
            # Even a malformed request is refused for its token first: nothing of it is looked at.
            with grpc.insecure_channel(handle.address) as channel:
                with pytest.raises(grpc.RpcError) as raw:
                    channel.unary_unary("/strata.serving.v1.Inference/Predict")(b"\xff\xff", timeout=5)
                assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
            working.discard(token_digest("sj_good"))  # revoked
            wait_for(lambda: code_of(predict, handle.address, ROWS, token="sj_good")[0]
                     == grpc.StatusCode.UNAUTHENTICATED, 10, "the revoked token to be refused")
            assert code_of(predict, handle.address, ROWS, token="sj_other")[0] == grpc.StatusCode.OK
            stats = handle.stats()
            assert stats["errors_by_status"]["UNAUTHENTICATED"] >= 4
    finally:
        gate.stop()


def test_with_tokens_a_wider_bind_needs_no_opt_in(executor, digits_model, monkeypatch):
    monkeypatch.delenv("STRATA_SERVING_INSECURE_BIND", raising=False)
    gate = TokenGate(lambda: [token_digest("sj_good")], refresh_s=60).start()
    try:
        with start_serving(executor, "wide", load_served_model(digits_model), host="0.0.0.0", max_rows=4,
                           gate=gate, advertise_host="127.0.0.1") as handle:
            assert predict(handle.address, ROWS, token="sj_good").shape == (1, 10)
    finally:
        gate.stop()


def self_signed(directory):
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    return cert.read_bytes(), key.read_bytes()


def test_tls(executor, digits_model, tmp_path):
    cert, key = self_signed(tmp_path)
    gate = TokenGate(lambda: [token_digest("sj_good")], refresh_s=60).start()
    try:
        with start_serving(executor, "tls", load_served_model(digits_model), host="localhost", max_rows=4,
                           gate=gate, tls=(cert, key)) as handle:
            assert handle.address.startswith("localhost:")
            assert predict(handle.address, ROWS, token="sj_good", tls_ca=cert).shape == (1, 10)
            (tmp_path / "ca.pem").write_bytes(cert)
            assert describe(handle.address, token="sj_good", tls_ca=str(tmp_path / "ca.pem"))["max_rows"] == 4
            # A plaintext client cannot talk to it.
            assert code_of(predict, handle.address, ROWS, token="sj_good", timeout=3)[0] in (
                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        gate.stop()
