"""Malformed requests to the gRPC endpoint (a real server on 127.0.0.1, a real channel): every one is answered
INVALID_ARGUMENT with a one-line message naming the problem, the endpoint keeps serving, and it refuses to
bind anything but a loopback interface."""

from __future__ import annotations

import math
import struct

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from components.gpushare.executor import DeviceExecutor
from components.gpushare.lanes import MemoryRequest
from components.serving import endpoint as endpoint_module
from components.serving import serving_pb2
from components.serving.bind import InsecureBindError
from components.serving.client import ServingError, predict
from components.serving.endpoint import MAX_DETAILS, MAX_DIMS, ServingEndpoint, start_serving
from components.serving.model import ServedModel, load_served_model

INVALID = grpc.StatusCode.INVALID_ARGUMENT
PREDICT = "/strata.serving.v1.Inference/Predict"
DESCRIBE = "/strata.serving.v1.Inference/Describe"
GOOD_ROWS = np.zeros((2, 64), dtype=np.float32)


@pytest.fixture
def executor():
    with DeviceExecutor("cpu", "1GiB", "pack") as executor:
        yield executor


@pytest.fixture
def handle(executor, digits_model):
    handle = start_serving(executor, "digits", load_served_model(digits_model), max_rows=32, request_timeout_s=5)
    yield handle
    handle.stop(grace=0.5)


@pytest.fixture
def channel(handle):
    with grpc.insecure_channel(handle.address) as channel:
        yield channel


def raw_call(channel, method: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
    """Send ``payload`` as the request's bytes, whatever they are; returns (status, details)."""
    call = channel.unary_unary(method, request_serializer=lambda data: data, response_deserializer=lambda data: data)
    try:
        call(payload, timeout=10)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def send(channel, tensor: serving_pb2.Tensor | None) -> tuple[grpc.StatusCode, str]:
    request = serving_pb2.PredictRequest() if tensor is None else serving_pb2.PredictRequest(input=tensor)
    return raw_call(channel, PREDICT, request.SerializeToString())


def floats(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def tensor(shape, dtype="float32", data=b"") -> serving_pb2.Tensor:
    return serving_pb2.Tensor(shape=list(shape), dtype=dtype, data=data)


ROW = b"\0" * 256  # one row of 64 float32 zeros
BAD_UTF8 = serving_pb2.PredictRequest(input=tensor([1, 64], "fl0at32", ROW)).SerializeToString().replace(b"0", b"\xff")

# (what is sent, a piece of the message that names the problem)
MALFORMED = [
    # the shape: rank, sign, size
    (tensor([1] * 100, data=floats(0.0)), "the shape has 100 dimensions; at most 8"),
    (tensor([1] * (MAX_DIMS + 1), data=floats(0.0)), f"{MAX_DIMS + 1} dimensions"),
    (tensor([2**62, 2**62, 0]), "has a dimension of 0"),
    (tensor([0, 64]), "the batch is empty"),
    (tensor([5, 0]), "has a dimension of 0"),
    (tensor([], data=floats(1.0)), "no shape"),
    (tensor([-1, 64], data=ROW), "negative dimension"),
    (tensor([1, -(2**63)]), "negative dimension"),
    (tensor([2**62, 2**62], data=ROW), "more than a 64 MiB message can carry"),
    (tensor([2**63 - 1, 2**63 - 1, 2**63 - 1]), "more than a 64 MiB message can carry"),
    (tensor([2**32, 2**32, 4]), "more than a 64 MiB message can carry"),  # the product overflows int64
    (tensor([4096, 4096, 2], "int64"), "more than a 64 MiB message can carry"),
    # the dtype
    (tensor([1, 64], "float16", b"\0" * 128), "dtype 'float16' is not supported: use one of float32, int64"),
    (tensor([1, 64], "FLOAT32", ROW), "dtype 'FLOAT32' is not supported"),
    (tensor([1, 64], "", ROW), "the tensor has no dtype"),
    (tensor([1, 64], "x" * 5000, ROW), "is not supported"),
    # the data
    (tensor([1, 64], data=b"\0" * 7), "7 bytes, not a whole number of float32 elements (4 bytes each)"),
    (tensor([1, 64], data=b"\0" * 252), "data holds 252 bytes (63 elements); shape [1, 64] of float32 needs 256"),
    (tensor([1, 64], data=b"\0" * 512), "needs 256 bytes"),
    (tensor([1, 64], "int64", b"\0" * 511), "not a whole number of int64 elements (8 bytes each)"),
    # well-formed, but not what this model takes
    (tensor([1, 64], "int64", b"\0" * 512), "dtype int64 is not accepted: this model takes float32"),
    (tensor([2, 32], data=ROW), "each row must be [64], so send [rows, 64]"),
    (tensor([64], data=ROW), "each row must be [64]"),
    (tensor([1, 64, 1, 1, 1, 1, 1, 1], data=ROW), "each row must be [64]"),
    (tensor([33, 64], data=ROW * 33), "33 rows is more than this endpoint's max_rows 32"),
    (tensor([2, 64], data=ROW + floats(*[0.0] * 10, math.nan, *[0.0] * 53)), "row 1 holds NaN or infinity"),
    (tensor([2, 64], data=floats(math.inf, *[0.0] * 63) + ROW), "row 0 holds NaN or infinity"),
    (tensor([1, 64], data=floats(-math.inf, *[0.0] * 63)), "inputs must be finite numbers"),
    # no tensor at all
    (None, "the request has no input tensor"),
]


def test_every_malformed_tensor_is_an_invalid_argument_naming_the_problem(handle, channel):
    for sent, problem in MALFORMED:
        code, details = send(channel, sent)
        assert code == INVALID, (sent, code, details)
        assert problem in details, (problem, details)
        assert "\n" not in details and len(details) <= MAX_DETAILS
    stats = handle.stats()
    assert stats["errors_by_status"] == {"INVALID_ARGUMENT": len(MALFORMED)}
    assert predict(handle.address, GOOD_ROWS).shape == (2, 10)  # the endpoint is unharmed
    assert handle.stats()["state"] == "admitted"


def test_bytes_that_are_not_a_message_are_invalid_arguments(handle, channel):
    # gRPC itself would answer INTERNAL "Exception deserializing request!".
    for payload in (b"\xff\xff\xff", b"\x0a\x05\x0a", BAD_UTF8):
        code, details = raw_call(channel, PREDICT, payload)
        assert code == INVALID and "is not a valid strata.serving.v1.PredictRequest message" in details, details
    code, details = raw_call(channel, DESCRIBE, b"\xff\xff")
    assert code == INVALID and "not a valid strata.serving.v1.DescribeRequest message" in details
    assert raw_call(channel, DESCRIBE, b"")[0] == grpc.StatusCode.OK
    assert predict(handle.address, GOOD_ROWS).shape == (2, 10)


def test_an_unforeseen_error_while_decoding_or_checking_is_still_an_invalid_argument(handle, monkeypatch):
    def broken_decode(message):
        raise OverflowError("something nobody\nthought of")

    monkeypatch.setattr(endpoint_module, "decode_tensor", broken_decode)
    with pytest.raises(ServingError) as caught:
        predict(handle.address, GOOD_ROWS)
    assert caught.value.code == INVALID
    assert caught.value.details == "the input tensor could not be decoded: OverflowError: something nobody thought of"
    monkeypatch.undo()

    def broken_check(self, inputs):
        raise TypeError("an unexpected\ncheck failure")

    monkeypatch.setattr(ServingEndpoint, "check", broken_check)
    with pytest.raises(ServingError) as caught:
        predict(handle.address, GOOD_ROWS)
    assert caught.value.code == INVALID
    assert caught.value.details == "the request could not be checked: TypeError: an unexpected check failure"
    monkeypatch.undo()
    assert predict(handle.address, GOOD_ROWS).shape == (2, 10)
    assert handle.stats()["errors_by_status"] == {"INVALID_ARGUMENT": 2}


def test_a_model_failure_stays_internal_on_one_line(executor):
    class Fragile(nn.Module):
        def forward(self, x):
            raise RuntimeError("the kernel failed\n  at line 3\n  of the model")

    import torch

    served = ServedModel("fragile", {}, Fragile().eval(), torch.zeros(1, 3), (3,), "float32", (3,))
    with start_serving(executor, "fragile", served, memory_request=MemoryRequest(2**10, 2**10)) as handle:
        with pytest.raises(ServingError) as caught:
            predict(handle.address, [[1.0, 2.0, 3.0]])
        assert caught.value.code == grpc.StatusCode.INTERNAL
        assert caught.value.details == "the model raised RuntimeError: the kernel failed at line 3 of the model"
        assert str(caught.value) == f"INTERNAL: {caught.value.details}"


def test_the_client_refuses_ragged_rows_on_one_line():
    from components.serving.client import encode

    with pytest.raises(ValueError, match="^the rows are not a rectangular array of numbers: ") as caught:
        encode([[1.0, 2.0], [3.0]])
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="cannot be sent as int64"):
        encode(np.array([[2**70]], dtype=object), dtype="int64")


def test_strata_infer_prints_the_reason_on_one_line(handle, monkeypatch, capsys, tmp_path):
    from strata.cli import client_commands
    from strata.cli.main import main

    class FakeControlPlane:
        def get(self, path):
            return {"id": "job", "kind": "serve", "state": "RUNNING", "endpoint": handle.address,
                    "spec": {"auth": "none"}}  # the handle has no token gate

    monkeypatch.setattr(client_commands, "connect", lambda args: FakeControlPlane())
    rows = tmp_path / "rows.json"
    rows.write_text("[[1.0, 2.0, 3.0]]")
    assert main(["infer", "job", "--input", str(rows)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == ("strata: error: INVALID_ARGUMENT: shape [1, 3] does not match: each row must be [64], "
                    "so send [rows, 64]")
    rows.write_text("[[NaN" + ", 0" * 63 + "]]")
    assert main(["infer", "job", "--input", str(rows)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == "strata: error: INVALID_ARGUMENT: inputs must be finite numbers: row 0 holds NaN or infinity"


# -- arbitrary requests ---------------------------------------------------------------------------------------
DIMENSIONS = st.one_of(st.integers(-3, 70), st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, -(2**63)]))
DTYPES = st.one_of(st.sampled_from(["float32", "int64"]), st.sampled_from(["float16", "", "FLOAT32"]), st.text(max_size=8))
VALUES = st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def requests(draw) -> bytes:
    """Mostly structured requests, some consistent (they may be answered OK), some arbitrary bytes."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.binary(max_size=64))
    if choice <= 3:  # a consistent float32 batch, possibly of the model's row shape, possibly with NaN/inf
        rows = draw(st.integers(1, 40))
        width = draw(st.sampled_from([64, 64, 63, 1]))
        values = draw(st.lists(VALUES, min_size=width, max_size=width))
        message = tensor([rows, width], data=floats(*values) * rows)
    else:
        shape = draw(st.lists(DIMENSIONS, max_size=MAX_DIMS + 4))
        dtype = draw(DTYPES)
        data = draw(st.one_of(st.binary(max_size=300), st.just(b"\0" * 256), st.just(b"\0" * 512)))
        message = tensor(shape, dtype, data)
    return serving_pb2.PredictRequest(input=message).SerializeToString()


def test_arbitrary_requests_are_answered_or_refused_as_invalid(handle, channel):
    seen = set()

    @settings(max_examples=50, deadline=None, database=None)
    @given(requests())
    def check(payload):
        code, details = raw_call(channel, PREDICT, payload)
        assert code in (grpc.StatusCode.OK, INVALID), (payload[:100], code, details)
        assert "\n" not in details
        seen.add(code)

    check()
    assert INVALID in seen
    assert set(handle.stats()["errors_by_status"]) <= {"INVALID_ARGUMENT"}
    assert predict(handle.address, GOOD_ROWS).shape == (2, 10)


# -- the bind -------------------------------------------------------------------------------------------------
def test_start_serving_refuses_a_non_loopback_host_and_leaves_nothing_running(executor, digits_model, monkeypatch):
    monkeypatch.delenv("STRATA_SERVING_INSECURE_BIND", raising=False)
    served = load_served_model(digits_model)
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        with pytest.raises(InsecureBindError, match="no authentication"):
            start_serving(executor, "wide", served, host=host)
        with pytest.raises(KeyError):
            executor.job_status("wide")  # never registered
    # With the explicit opt-in the check lets it through to the bind (192.0.2.1 is TEST-NET: not ours to bind).
    with pytest.raises(OSError, match="cannot bind 192.0.2.1"):
        start_serving(executor, "wide", served, host="192.0.2.1", insecure_bind=True)
    monkeypatch.setenv("STRATA_SERVING_INSECURE_BIND", "1")
    with pytest.raises(OSError, match="cannot bind 192.0.2.1"):
        start_serving(executor, "wide-too", served, host="192.0.2.1")
    with start_serving(executor, "local", served, host="127.0.0.1", insecure_bind=False) as handle:
        assert handle.address.startswith("127.0.0.1:")
        assert predict(handle.address, GOOD_ROWS).shape == (2, 10)
