"""Conformance suite for sessions (:class:`components.runtime.contract.component.Session`), the unit both execution
paths of a node run: stepped to the end in a child process, or hosted by a device service.

Subclass :class:`SessionConformance` in a test module and give :meth:`~SessionConformance.spec` and the
``kind`` (its registered component builds the sessions), or override :meth:`~SessionConformance.make_session`::

    class TestMySession(SessionConformance):
        kind = "my-kind"

        def spec(self):
            return {"size": 10}

A stepped session (the default) is checked for: start/step to ``DONE``, a result; a stop request honoured at
the next step with a checkpoint (when ``checkpoints``) and ``stopped_on_request()``; a new session resuming
from that checkpoint; hosted and child sessions reaching the same end. A session that joins a host by itself
(``attached = True``, e.g. an inference endpoint) is checked through :meth:`~SessionConformance.make_executor`:
it attaches, ends in the executor once asked to stop, settles, and reports ``stopped_on_request()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from components.runtime.contract.component import Progress, Session, drive
from components.runtime.contract.context import DeviceHandle, LocalContext


class SessionConformance:
    """The session contract, as pytest tests."""

    kind: ClassVar[str] = ""
    attached: ClassVar[bool] = False  # the session joins a host by itself (attach) and is never stepped
    checkpoints: ClassVar[bool] = True  # a stopped session leaves a checkpoint a new attempt resumes from
    max_steps: ClassVar[int] = 100_000
    stop_after: ClassVar[int] = 3  # steps before a stop is requested
    end_timeout: ClassVar[float] = 60.0

    # -- factories --------------------------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        return {}

    def sources(self, tmp_path: Path) -> dict[str, Path]:
        """The source job's artifacts, by name (for kinds that read another job's output)."""
        return {}

    def make_context(self, workdir: Path, attempt: str = "attempt-1") -> LocalContext:
        return LocalContext(job_id="conformance-job", attempt_id=attempt, spec=dict(self.spec()), workdir=workdir,
                            devices=[DeviceHandle("virtual", 0, 2**30)], sources=self.sources(workdir.parent))

    def make_session(self, ctx: LocalContext, hosted: bool) -> Session:
        from components.runtime.contract.registry import load_component

        return load_component(self.kind).session(ctx, hosted=hosted)

    def make_executor(self) -> Any:
        """A host's executor for attached sessions: ``attach(executor, name)``, ``wait(name, timeout)``,
        ``shutdown(cancel=True, timeout=...)``."""
        raise NotImplementedError("give an executor for attached sessions")

    # -- helpers ------------------------------------------------------------------------------------------
    def step_until(self, session: Session, steps: int) -> Progress:
        progress = Progress.ITERATION
        for _ in range(steps):
            progress = session.step()
            assert isinstance(progress, Progress), progress
            if progress is Progress.DONE:
                break
        return progress

    def run_to_end(self, session: Session) -> tuple[Progress, int]:
        session.prepare()
        session.start("cpu")
        count = 0
        try:
            progress = Progress.ITERATION
            while progress is not Progress.DONE:
                progress = session.step()
                assert isinstance(progress, Progress), progress
                count += 1
                assert count <= self.max_steps, "the session never reached DONE"
        finally:
            session.close()
        session.settle(self.end_timeout)
        return progress, count

    def require(self, attached: bool) -> None:
        if attached != self.attached:
            pytest.skip("an attached session is not stepped" if self.attached else
                        "a stepped session does not attach itself")

    # -- stepped sessions ---------------------------------------------------------------------------------
    @pytest.mark.parametrize("hosted", [False, True], ids=["child", "hosted"])
    def test_steps_to_done(self, tmp_path, hosted):
        self.require(attached=False)
        ctx = self.make_context(tmp_path / "run")
        session = self.make_session(ctx, hosted)
        assert isinstance(session, Session)
        progress, count = self.run_to_end(session)
        assert progress is Progress.DONE and count >= 1
        assert not session.stopped_on_request()
        assert session.remaining_steps() in (None, 0)
        ctx.close()

    @pytest.mark.parametrize("hosted", [False, True], ids=["child", "hosted"])
    def test_a_stop_request_ends_it_at_the_next_step_and_a_new_attempt_resumes(self, tmp_path, hosted):
        self.require(attached=False)
        workdir = tmp_path / "run"
        ctx = self.make_context(workdir)
        session = self.make_session(ctx, hosted)
        session.prepare()
        session.start("cpu")
        try:
            assert self.step_until(session, self.stop_after) is not Progress.DONE, "too short to be stopped"
            before = session.remaining_steps()
            ctx.request_stop()
            assert session.step() is Progress.DONE
        finally:
            session.close()
        session.settle(self.end_timeout)
        assert session.stopped_on_request()
        ctx.close()
        if not self.checkpoints:
            return
        assert ctx._load_checkpoint_bytes() is not None, "no checkpoint after a stop"
        again = self.make_context(workdir, attempt="attempt-2")
        resumed = self.make_session(again, hosted)
        resumed.prepare()
        resumed.start("cpu")
        try:
            if before is not None:
                assert resumed.remaining_steps() == before, "the new attempt did not resume from the checkpoint"
        finally:
            resumed.close()
        again.close()

    def test_drive_runs_it_like_a_child_process(self, tmp_path):
        self.require(attached=False)
        ctx = self.make_context(tmp_path / "run")
        assert drive(self.make_session(ctx, False), ctx.torch_device) is Progress.DONE
        ctx.close()

    # -- attached sessions --------------------------------------------------------------------------------
    @pytest.mark.parametrize("hosted", [False, True], ids=["child", "hosted"])
    def test_attaches_ends_on_stop_and_settles(self, tmp_path, hosted):
        self.require(attached=True)
        ctx = self.make_context(tmp_path / "run")
        session = self.make_session(ctx, hosted)
        executor = self.make_executor()
        try:
            session.prepare()
            admission = session.attach(executor, "conformance", priority=0, weight=1.0)
            assert admission is not None and admission.status != "rejected", admission
            ctx.request_stop()
            session.interrupt(False)
            executor.wait("conformance", self.end_timeout)
            session.settle(self.end_timeout)
            assert session.stopped_on_request()
        finally:
            session.settle(self.end_timeout)
            executor.shutdown(cancel=True, timeout=10)
            ctx.close()
