"""The ``train`` kind's session (a TrainLoopSession from TrainComponent.session) against the session
conformance suite, in a child process's shape and hosted (as the device's sharing service runs it)."""

from __future__ import annotations

import pytest

import components.gpushare.sessions  # noqa: F401 -- the host: installs its tools (memory profiling) into train's sessions
from components.runtime.contract.component import NotHostable
from components.runtime.contract.context import LocalContext
from components.runtime.testing.conformance.sessions import SessionConformance
from components.train.component import TrainComponent

pytestmark = pytest.mark.timeout(300)


class TestTrainSession(SessionConformance):
    kind = "train"

    def spec(self):
        return {"workload": "mlp-digits", "epochs": 1, "batch_size": 128, "log_every": 5, "checkpoint_every": 1000}


def test_hosted_train_sessions_refuse_entrypoint_functions_and_measure_their_memory(tmp_path):
    ctx = LocalContext(job_id="j", attempt_id="a", spec={"entrypoint": "components.train.examples:fit_line"},
                       workdir=tmp_path / "a")
    with pytest.raises(NotHostable, match="cannot be interleaved"):
        TrainComponent().session(ctx, hosted=True)
    ctx = LocalContext(job_id="j", attempt_id="b", spec=TestTrainSession().spec(), workdir=tmp_path / "b")
    session = TrainComponent().session(ctx, hosted=True)
    request = session.memory_estimate()
    assert request.persistent > 0 and request.ephemeral > 0
    assert session.loop.owns_process is False and session.loop.host_io is not None
    child = TrainComponent().session(LocalContext(job_id="j", attempt_id="c", spec=TestTrainSession().spec(),
                                                  workdir=tmp_path / "c"))
    assert child.loop.owns_process is True and child.loop.host_io is None and child.memory_estimate() is None
