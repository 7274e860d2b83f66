"""Command jobs in an attempt rank: logs, metrics (stdout and strata_report), outcomes, checkpoints, outputs,
stopping, and torchrun's variables."""

from __future__ import annotations

import sys
import textwrap
import threading
import time

import pytest

from components.runtime.contract.context import LocalContext
from components.runtime.contract.project import UserError, parse_report
from components.runtime.node.command import CommandFailed, run_command


@pytest.fixture
def project(tmp_path, monkeypatch):
    work = tmp_path / "work"
    for name in ("code", "output", "checkpoint"):
        (work / name).mkdir(parents=True)
    monkeypatch.setenv("STRATA_WORKDIR", str(work / "code"))
    monkeypatch.setenv("STRATA_OUTPUT_DIR", str(work / "output"))
    monkeypatch.setenv("STRATA_CHECKPOINT_DIR", str(work / "checkpoint"))
    return work


def context(tmp_path, **kwargs) -> LocalContext:
    return LocalContext(job_id="j", attempt_id="a", spec={}, workdir=tmp_path / "ctx", **kwargs)


def script(project, text: str, name: str = "train.py") -> list[str]:
    (project / "code" / name).write_text(textwrap.dedent(text))
    return [sys.executable, name]


def messages(ctx, level=None):
    return [message for _, lvl, message in ctx.logs if level is None or lvl == level]


def test_parse_report_lines():
    assert parse_report("strata: loss=0.5 acc=0.9 step=3") == ({"loss": 0.5, "acc": 0.9}, 3)
    assert parse_report("  strata: val/loss=1e-3") == ({"val/loss": 0.001}, None)
    assert parse_report("loss=0.5") is None and parse_report("strata: hello") is None


def test_logs_metrics_from_stdout_and_strata_report(tmp_path, project):
    command = script(project, """
        import sys, strata_report
        print("starting")
        print("strata: loss=2.0 step=1")
        print("a warning", file=sys.stderr)
        strata_report.report(step=2, loss=1.0, accuracy=0.5)
        strata_report.report(loss=0.5)
    """)
    ctx = context(tmp_path)
    run_command(ctx, command)
    assert "starting" in messages(ctx, "stdout") and "a warning" in messages(ctx, "stderr")
    points = sorted(ctx.metric_points, key=lambda p: (p[2], p[0]))
    assert points == [("loss", 2.0, 1), ("accuracy", 0.5, 2), ("loss", 1.0, 2), ("loss", 0.5, 3)]


def test_a_failing_program_fails_with_the_end_of_stderr(tmp_path, project):
    command = script(project, """
        import sys
        print("something broke", file=sys.stderr)
        sys.exit(7)
    """)
    with pytest.raises(CommandFailed, match="exited with code 7: something broke"):
        run_command(context(tmp_path), command)


@pytest.mark.parametrize("body, problem", [
    ("import no_such_module_anywhere\n", "ModuleNotFoundError"),
    ("def broken(:\n", "SyntaxError"),
])
def test_deterministic_python_errors_are_user_errors(tmp_path, project, body, problem):
    with pytest.raises(UserError, match=problem):
        run_command(context(tmp_path), script(project, body))


def test_a_missing_program_or_script_is_a_user_error(tmp_path, project):
    with pytest.raises(UserError, match="was not found"):
        run_command(context(tmp_path), ["no-such-program-strata"])
    with pytest.raises(UserError, match="can't open file"):
        run_command(context(tmp_path), [sys.executable, "missing.py"])


def test_a_signal_is_a_failure(tmp_path, project):
    command = script(project, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(CommandFailed, match="killed by signal 9"):
        run_command(context(tmp_path), command)


def test_the_checkpoint_directory_is_saved_and_restored_and_outputs_become_artifacts(tmp_path, project):
    command = script(project, """
        import os, pathlib, strata_report
        ckpt = strata_report.checkpoint_dir() / "state.txt"
        epoch = int(ckpt.read_text()) if ckpt.exists() else 0
        print(f"resumed at {epoch}")
        ckpt.write_text(str(epoch + 1))
        assert strata_report.save()
        (strata_report.output_dir() / "sub").mkdir(exist_ok=True)
        (strata_report.output_dir() / "sub" / "model.txt").write_text(f"epoch {epoch + 1}")
        open("beside-the-script.txt", "w").write("writable")
    """)
    ctx = context(tmp_path)
    run_command(ctx, command)
    assert "resumed at 0" in messages(ctx, "stdout")
    assert (ctx.workdir / "checkpoint.pt").exists()
    assert (ctx.workdir / "artifacts" / "sub__model.txt").read_text() == "epoch 1"
    assert (project / "code" / "beside-the-script.txt").read_text() == "writable"
    # A new attempt in a fresh directory starts from the saved checkpoint.
    for path in (project / "checkpoint").iterdir():
        path.unlink()
    ctx2 = context(tmp_path)
    run_command(ctx2, command)
    assert "resumed at 1" in messages(ctx2, "stdout")
    assert (ctx2.workdir / "artifacts" / "sub__model.txt").read_text() == "epoch 2"


def test_a_stop_sends_sigterm_and_saves_the_checkpoint(tmp_path, project):
    command = script(project, """
        import signal, sys, time, strata_report
        def stop(*_):
            (strata_report.checkpoint_dir() / "stopped.txt").write_text("at a stop")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("running", flush=True)
        while True:
            time.sleep(0.05)
    """)
    ctx = context(tmp_path)

    def stop_when_running():
        deadline = time.monotonic() + 60
        while "running" not in messages(ctx, "stdout") and time.monotonic() < deadline:
            time.sleep(0.05)
        ctx.request_stop()

    threading.Thread(target=stop_when_running, daemon=True).start()
    run_command(ctx, command, grace_s=30)
    assert any("checkpoint saved (at a stop)" in m for m in messages(ctx))
    assert (ctx.workdir / "checkpoint.pt").exists()


def test_a_program_ignoring_sigterm_is_killed_after_the_grace(tmp_path, project):
    command = script(project, """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("running", flush=True)
        while True:
            time.sleep(0.05)
    """)
    ctx = context(tmp_path)
    threading.Timer(1.0, ctx.request_stop).start()
    run_command(ctx, command, grace_s=0.5)  # a stopped program is not a failure of the job
    assert any("stopping the program" in m for m in messages(ctx))


def test_torchrun_variables_are_set(tmp_path, project):
    command = script(project, """
        import os
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR"):
            print(f"{name}={os.environ[name]}")
        print("port ok" if 0 < int(os.environ["MASTER_PORT"]) < 65536 else "bad port")
    """)
    ctx = context(tmp_path)
    run_command(ctx, command)
    out = messages(ctx, "stdout")
    assert {"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "GROUP_RANK=0",
            "MASTER_ADDR=127.0.0.1", "port ok"} <= set(out)
