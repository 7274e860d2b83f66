"""The GPU-sharing service as a real process on a temporary socket, with LocalContexts (``--local-root``) in
place of the control plane."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from multiprocessing import AuthenticationError

import psutil
import pytest
from support import device_service_command, wait_for

from components.gpushare.service import call, read_authkey

pytestmark = pytest.mark.timeout(120)


SMALL = {"workload": "mlp-digits", "epochs": 2, "batch_size": 32, "log_every": 10, "checkpoint_every": 1000}


@pytest.fixture
def service(device_service):
    return device_service


def test_two_jobs_interleave_and_cancel_frees_the_lane(service):
    first, conn_a, reply_a = service.run(SMALL)
    second, conn_b, reply_b = service.run(SMALL)
    assert reply_a["ok"] and reply_b["ok"], (reply_a, reply_b)
    assert reply_a["pid"] == reply_b["pid"] == service.process.pid
    done_a, done_b = service.done(conn_a), service.done(conn_b)
    assert done_a["state"] == done_b["state"] == "succeeded", (done_a, done_b)
    assert done_a["steps"] == done_b["steps"] > 50
    for attempt, done in ((first, done_a), (second, done_b)):
        assert done["result"]["eval"]["test_accuracy"] > 0.5
        assert (service.root / attempt / "artifacts" / "model.pt").exists()

    status = service.call({"op": "status"})["status"]
    assert status["counters"]["switches"] > 10
    order = [unit["job"] for unit in service.call({"op": "timeline"})["timeline"] if unit["kind"] == "iteration"]
    alternations = sum(1 for a, b in zip(order, order[1:], strict=False) if a != b)
    assert set(order) == {first, second} and alternations > 10

    report = service.call({"op": "report", "since": 0})
    entry = report["sharing"]
    assert set(entry) == {"index", "policy", "switches", "switch_latency_ms", "utilization", "budget", "lanes",
                          "jobs", "slices"}
    assert entry["policy"] == "pack" and entry["budget"] == 2**30 and entry["switches"] > 10
    assert {job["attempt"] for job in entry["jobs"]} == {first, second}
    assert {piece["attempt"] for piece in entry["slices"]} == {first, second}
    assert all(piece["start"] <= piece["end"] <= report["cursor"] for piece in entry["slices"])
    assert entry["lanes"] == []  # both left: their memory is free
    later = service.call({"op": "report", "since": report["cursor"]})["sharing"]
    assert later["slices"] == [] and later["jobs"] == []

    # A long job, stopped at an iteration boundary: it checkpoints and leaves its lane.
    assert service.call({"op": "policy", "policy": "fair"})["policy"] == "fair"
    long, conn, reply = service.run({**SMALL, "epochs": 500})
    assert reply["ok"], reply

    def lanes():
        return [lane for lane in service.call({"op": "status"})["status"]["memory"]["lanes"] if long in lane["jobs"]]

    def steps():
        return service.call({"op": "status"})["status"]["jobs"][long]["steps"]

    wait_for(lambda: steps() > 20, 60, "the long job to run")
    assert lanes()
    assert service.call({"op": "cancel", "attempt": long})["found"]
    done = service.done(conn)
    assert done["state"] == "stopped" and 20 < done["result"]["stopped_at_step"] < 500 * 45
    assert (service.root / long / "checkpoint.pt").exists()
    assert not lanes()
    assert service.call({"op": "report"})["sharing"]["policy"] == "fair"

    # The service shuts down on SIGTERM.
    service.process.send_signal(signal.SIGTERM)
    assert service.process.wait(timeout=30) == 0


def test_entrypoint_functions_are_declined_and_a_closed_connection_stops_the_job(service):
    with pytest.raises(AuthenticationError):
        call(service.path, b"wrong key", {"op": "ping"})
    assert service.call({"op": "ping"})["ok"]  # a failed handshake does not stop the service
    _, conn, reply = service.run({"entrypoint": "components.train.examples:fit_line"})
    assert not reply["ok"] and "cannot be interleaved" in reply["reason"]
    conn.close()
    _, conn, reply = service.run({"entrypoint": "components.train.examples:no_such_thing"})
    assert not reply["ok"] and "no_such_thing" in reply["reason"]
    conn.close()

    long, conn, reply = service.run({**SMALL, "epochs": 500})
    assert reply["ok"]
    wait_for(lambda: service.call({"op": "status"})["status"]["jobs"][long]["steps"] > 5, 60, "the job to run")
    conn.close()  # the worker died: the job checkpoints and ends
    wait_for(lambda: service.call({"op": "status"})["status"]["jobs"][long]["state"] == "succeeded", 30,
             "the orphaned job to stop")
    # The executor marks the job ended before its host thread has stored the checkpoint: wait for the file.
    wait_for(lambda: (service.root / long / "checkpoint.pt").exists(), 60, "the orphaned job's checkpoint")
    assert service.call({"op": "shutdown"})["ok"]
    assert service.process.wait(timeout=30) == 0


def test_service_exits_when_its_parent_dies(tmp_path):
    (tmp_path / "key").write_text(secrets.token_hex(16))
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         f"child = subprocess.Popen({device_service_command(tmp_path)!r})\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        authkey = read_authkey(tmp_path / "key")

        def listening():
            try:
                return call(str(tmp_path / "s.sock"), authkey, {"op": "ping"})["pid"] == pid
            except OSError:
                return False

        wait_for(listening, 30, "the service to listen")
        parent.kill()
        parent.wait(timeout=10)
        wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
                 "the service to exit after its parent died")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_the_service_warms_up_every_hostable_kind_once_started(caplog):
    import logging

    from components.gpushare.service import warm_up

    with caplog.at_level(logging.INFO, logger="strata.gpushare"):
        warm_up()
        warm_up()  # safe to repeat
    warmed = [record.getMessage() for record in caplog.records if "warmed up" in record.getMessage()]
    assert len(warmed) == 2 and all("train" in message.split(" in ")[0] for message in warmed)
    import sys

    assert "sklearn.datasets" in sys.modules and "components.train.loop" in sys.modules
