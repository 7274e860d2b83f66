"""A serve attempt inside the real GPU-sharing service process (``--local-root``: LocalContexts, the source
model given as a local file), next to a train attempt: answers, ends as ``stopped`` on cancel, and stops when
its caller goes away."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from support import DeviceService, free_port, start_device_service, wait_for

from components.serving.client import ServingError, predict

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def service(tmp_path):
    """The real device service (tests/support.py), under the fair policy, as ``(ask, open_connection)``."""
    handle = start_device_service(tmp_path, policy="fair")
    try:
        yield handle.call, handle.connect
    finally:
        handle.process.kill()
        handle.process.wait(timeout=10)


def submit(open_connection, kind: str, spec: dict, **extra):
    attempt = str(uuid.uuid4())
    payload = {"attempt": attempt, "job": str(uuid.uuid4()), "number": 1, "kind": kind, "spec": spec,
               "world_size": 1, "rank": 0, "device": {"kind": "virtual", "index": 0, "memory": 2**28,
                                                      "share": 0.25}, **extra}
    conn = open_connection()
    conn.send({"op": "run", "payload": payload})
    assert conn.poll(60), "no answer to run"
    return attempt, conn, conn.recv()


done_event = DeviceService.done


def test_a_serve_attempt_answers_next_to_training_and_stops_on_cancel(service, digits_model, digits_test_set):
    ask, open_connection = service
    features, labels = digits_test_set
    port = free_port()
    spec = {"model": {"job": str(uuid.uuid4())}, "port": port, "auth": "none"}  # tokens: test_auth.py
    serve, serve_conn, reply = submit(open_connection, "serve", spec, sources={"model.pt": str(digits_model)})
    assert reply["ok"] and reply["admission"]["status"] == "admitted", reply
    train, train_conn, reply = submit(open_connection, "train",
                                      {"workload": "tiny-gpt", "hidden": 64, "batch_size": 32, "epochs": 50})
    assert reply["ok"], reply
    wait_for(lambda: ask({"op": "status"})["status"]["jobs"].get(train, {}).get("steps", 0) >= 2, 60,
             "training to step")
    import torch

    from components.serving.model import load_served_model

    scores = predict(f"127.0.0.1:{port}", features[:100])
    with torch.inference_mode():  # the trained weights, exactly, computed in the service process
        expected = load_served_model(digits_model).module(torch.from_numpy(features[:100])).numpy()
    assert np.array_equal(scores, expected)
    assert (scores.argmax(axis=1) == labels[:100]).mean() > 0.7
    status = ask({"op": "status"})["status"]
    assert status["jobs"][serve]["kind"] == "inference" and status["jobs"][train]["state"] == "admitted"
    report = ask({"op": "report", "since": 0})["sharing"]
    assert {job["attempt"] for job in report["jobs"]} >= {serve, train}

    serve_conn.send({"op": "cancel", "attempt": serve})
    done = done_event(serve_conn)
    assert done["state"] == "stopped" and done["attempt"] == serve and not done["lost"]
    with pytest.raises(ServingError):
        predict(f"127.0.0.1:{port}", features[:1], timeout=3)
    lanes = ask({"op": "status"})["status"]["memory"]["lanes"]
    assert all(serve not in lane["jobs"] for lane in lanes)  # its lane is free again
    assert ask({"op": "status"})["status"]["jobs"][train]["state"] == "admitted"  # training goes on
    train_conn.send({"op": "cancel", "attempt": train, "hard": True})
    assert done_event(train_conn)["state"] == "cancelled"


def test_a_serve_attempt_stops_when_its_worker_goes_away(service, digits_model):
    ask, open_connection = service
    port = free_port()
    serve, conn, reply = submit(open_connection, "serve",
                                {"model": {"job": str(uuid.uuid4())}, "port": port, "auth": "none"},
                                sources={"model.pt": str(digits_model)})
    assert reply["ok"], reply
    assert predict(f"127.0.0.1:{port}", np.zeros((1, 64), dtype=np.float32)).shape == (1, 10)
    conn.close()  # the worker died
    wait_for(lambda: ask({"op": "status"})["status"]["jobs"][serve]["state"] != "admitted", 30,
             "the endpoint to leave the executor")

    def refused() -> bool:
        try:
            predict(f"127.0.0.1:{port}", np.zeros((1, 64), dtype=np.float32), timeout=2)
        except ServingError:
            return True
        return False

    wait_for(refused, 10, "the gRPC server to stop")


def test_a_serve_attempt_without_its_model_is_declined(service):
    _, open_connection = service
    _, conn, reply = submit(open_connection, "serve", {"model": {"job": str(uuid.uuid4())}})
    conn.close()
    # Declined: the worker then runs it in a child process, which fails it with the same reason.
    assert not reply["ok"] and "model.pt" in reply["reason"]
