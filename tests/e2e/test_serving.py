"""End-to-end: a serve job answers gRPC requests from inside the device's GPU-sharing service, next to a
training job that yields to them (SwitchFlow), and stops cleanly when cancelled."""

from __future__ import annotations

import json
import re

import pytest
from e2e_support import training_children, wait_for

from components.gpushare.service import call, read_authkey, socket_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def service_call(cluster, message: dict) -> dict:
    config = json.loads((cluster.home / "node" / "worker.json").read_text())["services"]["gpushare"]["config"]
    return call(socket_path(config["socket_dir"], 0), read_authkey(config["authkey_file"]), message, 10)


def digits_test_set(spec: dict):
    """The trained job's own held-out rows and labels (the workload's deterministic split)."""
    from components.train.spec import TrainSpec
    from components.train.workloads import builtin_workload

    _, _, x_test, y_test = builtin_workload("mlp-digits").load_data(TrainSpec().validate(spec))
    return x_test.numpy(), y_test.numpy()


def _accepted(describe, address: str, token: str) -> bool:
    from components.serving.client import ServingError

    try:
        describe(address, token=token)
    except ServingError as error:
        if error.code.name != "UNAUTHENTICATED":
            raise
        return False
    return True


def test_serve_a_trained_model_next_to_training_then_cancel(cluster, tmp_path):
    from components.serving.client import ServingError, describe, predict

    train_spec = {"workload": "mlp-digits", "epochs": 4, "batch_size": 32, "log_every": 50}
    trained = cluster.submit({"name": "e2e-digits", "kind": "train", "resources": {"gpus": 0.5},
                              "max_attempts": 1, "spec": train_spec})["id"]
    record = cluster.wait_state(trained, TERMINAL, 120)
    assert record["state"] == "SUCCEEDED", (record, cluster.output())

    # From CI: `strata submit --wait` returns once the endpoint answers.
    (tmp_path / "serve.yaml").write_text(f"name: e2e-serve\nkind: serve\nresources: {{gpus: 0.25}}\n"
                                         f"spec: {{model: {{job: {trained}}}}}\n")
    submitted = cluster.cli("submit", str(tmp_path / "serve.yaml"), "--wait", "--timeout", "90")
    assert submitted.returncode == 0, (submitted.stdout, submitted.stderr, cluster.output())
    served = re.search(r"submitted job (\S+) ", submitted.stdout).group(1)
    address = re.search(r"listening on (\S+) ", submitted.stdout).group(1)
    job = cluster.job(served)
    assert job["state"] == "RUNNING" and job["endpoint"] == address
    assert address.startswith("127.0.0.1:")
    logs = "\n".join(cluster.logs(served))
    assert "in the GPU-sharing service" in logs, logs
    assert not training_children(cluster.process.pid), "the fractional serve job ran in a child process"

    # Deployment tokens: issued through the control plane (the CLI prints one once); a call without one, or
    # with a wrong or revoked one, is UNAUTHENTICATED.
    issued = cluster.cli("job-token", "create", served, "--name", "e2e")
    assert issued.returncode == 0, (issued.stdout, issued.stderr)
    token = issued.stdout.strip()
    doomed = cluster.api("POST", f"jobs/{served}/tokens/", json={"name": "to-revoke"})
    # The endpoint refreshes the digests on its own schedule: one refresh may fall between the two issues.
    wait_for(lambda: _accepted(describe, address, token) and _accepted(describe, address, doomed["token"]), 30,
             message="the endpoint to learn both new tokens")
    info = describe(address, token=token)
    assert info["workload"] == "mlp-digits" and info["source_job"] == trained
    for refused in (None, "sj_wrong"):
        with pytest.raises(ServingError) as error:
            predict(address, [[0.0] * 64], token=refused)
        assert error.value.code.name == "UNAUTHENTICATED"
    revoked = cluster.cli("job-token", "revoke", served, doomed["id"])
    assert revoked.returncode == 0, (revoked.stdout, revoked.stderr)
    wait_for(lambda: not _accepted(describe, address, doomed["token"]), 30, message="the revocation to apply")
    listed = cluster.cli("job-token", "list", served)
    assert "revoked" in listed.stdout and "active" in listed.stdout and token not in listed.stdout

    # A long staged training job on the same device; requests go first and it yields to them.
    busy = cluster.submit({"name": "e2e-busy", "kind": "train", "resources": {"gpus": 0.25}, "max_attempts": 1,
                           "spec": {"workload": "tiny-gpt", "epochs": 50, "batch_size": 32, "log_every": 5}})["id"]
    wait_for(lambda: any(p["name"] == "loss" for p in cluster.metrics(busy)), 90, message="training to step")
    x_test, y_test = digits_test_set(train_spec)
    before = service_call(cluster, {"op": "status"})["status"]["counters"]["inference_latency"]["count"]
    correct = 0
    for start in range(0, 200, 10):
        scores = predict(address, x_test[start:start + 10], timeout=10, token=token)
        assert scores.shape == (10, 10)
        correct += int((scores.argmax(axis=1) == y_test[start:start + 10]).sum())
    assert correct / 200 > 0.85, correct  # the trained weights, not a fresh model
    status = service_call(cluster, {"op": "status"})["status"]
    attempts = {cluster.job(j)["attempts"][0]["id"]: j for j in (served, busy)}
    states = {attempts[a]: job["state"] for a, job in status["jobs"].items() if a in attempts}
    assert states == {served: "admitted", busy: "admitted"}, status["jobs"]  # both resident on the device
    assert status["counters"]["inference_latency"]["count"] - before >= 20
    assert cluster.job(busy)["state"] == "RUNNING"

    # The CLI sends rows from a file and prints the scores and classes.
    (tmp_path / "rows.json").write_text(json.dumps({"inputs": (x_test[:3] * 16).round().astype(int).tolist()}))
    answer = cluster.cli("infer", served, "--input", str(tmp_path / "rows.json"))
    assert answer.returncode == 0, (answer.stdout, answer.stderr)
    printed = json.loads(answer.stdout)
    # Whole numbers in JSON are sent as the model's float32 input, not as int64 (an INVALID_ARGUMENT).
    assert printed["argmax"] == predict(address, (x_test[:3] * 16).round(), token=token).argmax(axis=1).tolist()
    bad = cluster.cli("infer", served, "--input", "-", env=None)
    assert bad.returncode != 0 and "error" in bad.stderr

    wrong = [[0.0] * 7]  # 7 features, not 64
    with pytest.raises(ServingError) as error:
        predict(address, wrong, token=token)
    assert error.value.code.name == "INVALID_ARGUMENT" and "each row must be [64]" in str(error.value)

    # Cancel: the endpoint goes away, its lane is freed, the training job goes on.
    cluster.api("POST", f"jobs/{served}/cancel/")
    record = cluster.wait_state(served, TERMINAL, 60)
    assert record["state"] == "CANCELLED" and record["endpoint"] is None
    def endpoint_gone():
        try:
            predict(address, x_test[:1], timeout=3, token=token)
        except ServingError:
            return True
        return False

    # The job is CANCELLED at once; the node learns it on its next poll and closes the endpoint.
    wait_for(endpoint_gone, 30, message="the endpoint to close")
    serve_attempt = record["attempts"][0]["id"]
    wait_for(lambda: service_call(cluster, {"op": "status"})["status"]["jobs"][serve_attempt]["state"]
             in {"cancelled", "succeeded"}, 30, message="the endpoint to leave the executor")
    status = service_call(cluster, {"op": "status"})["status"]
    assert all(serve_attempt not in lane["jobs"] for lane in status["memory"]["lanes"])
    assert cluster.job(busy)["state"] == "RUNNING"
    cluster.api("POST", f"jobs/{busy}/cancel/")
    assert cluster.wait_state(busy, TERMINAL, 60)["state"] == "CANCELLED"

    # A whole-GPU serve job runs the same endpoint in a child process of its own.
    whole = cluster.submit({"name": "e2e-serve-whole", "kind": "serve", "resources": {"gpus": 1},
                            "spec": {"model": {"job": trained}}})["id"]
    address = wait_for(lambda: cluster.job(whole).get("endpoint"), 90, message="the whole-GPU endpoint")
    assert training_children(cluster.process.pid), "a whole-GPU serve job runs in a child process"
    token = cluster.api("POST", f"jobs/{whole}/tokens/", json={})["token"]
    wait_for(lambda: _accepted(describe, address, token), 30, message="the child's endpoint to learn the token")
    scores = predict(address, x_test[:50], token=token)
    assert (scores.argmax(axis=1) == y_test[:50]).mean() > 0.85
    cluster.api("POST", f"jobs/{whole}/cancel/")
    assert cluster.wait_state(whole, TERMINAL, 60)["state"] == "CANCELLED"
    wait_for(lambda: not training_children(cluster.process.pid), 30, message="the child to exit")
