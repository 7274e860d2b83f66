"""A hostile job on a real ``strata up`` whose node runs a team's code in its bubblewrap sandbox (the default where
bubblewrap is installed; ``make install`` installs it): from a code bundle, the job tries to read the node token
(its environment, its payload, every visible ``/proc/<pid>/environ``, the agent's files), ``credentials.json``,
the control plane's database and secret key, another attempt's directory and another job's checkpoint; to write
outside its directories; to kill another attempt's process; and to call node routes with whatever it found. Every
try fails, and the test asserts on each; the other attempt runs on untouched."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import psutil
import pytest
from e2e_support import wait_for

from components.runtime.node import sandbox

pytestmark = pytest.mark.e2e

HOSTILE = r'''
import json, os, signal, sys, urllib.request, urllib.error
from pathlib import Path

targets = json.loads(Path("targets.json").read_text())
print("UID", os.getuid(), os.getgid(), flush=True)
import hashlib
secret = os.environ.get("HOSTILE_SECRET", "")
print("SECRET_SHA", hashlib.sha256(secret.encode()).hexdigest(), flush=True)
print("SECRET_SAID", secret, flush=True)  # the job prints its own secret: its log stores *** instead
print("ENV", json.dumps(dict(os.environ)), flush=True)

def probe(name, function):
    try:
        found = function()
    except (OSError, urllib.error.URLError) as error:
        print("PROBE", name, "BLOCKED", type(error).__name__, getattr(error, "code", ""), flush=True)
    else:
        print("PROBE", name, "LEAK", repr(found)[:300], flush=True)

# Every process this job can see, and what their environments and command lines hold.
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("PIDS", pids, flush=True)
for pid in pids:
    for what in ("environ", "cmdline"):
        try:
            print("PROC", pid, what, Path(f"/proc/{pid}/{what}").read_bytes().replace(b"\0", b" ")[:4000], flush=True)
        except OSError as error:
            print("PROC", pid, what, "unreadable", type(error).__name__, flush=True)
# Its own payload: the runtime's child read it from stdin; nothing of it is left on disk or in the environment.
for name, path in targets["read"].items():
    probe("read:" + name, lambda path=path: Path(path).read_bytes()[:200])
for name, path in targets["list"].items():
    probe("list:" + name, lambda path=path: os.listdir(path))
for name, path in targets["write"].items():
    probe("write:" + name, lambda path=path: Path(path).write_text("pwned") or "written")
for pid in targets["kill"]:
    probe(f"kill:{pid}", lambda pid=pid: os.kill(pid, signal.SIGKILL) or "killed")
for pid in pids:
    if pid not in (os.getpid(), os.getppid()):
        probe(f"kill-visible:{pid}", lambda pid=pid: os.kill(pid, signal.SIGKILL) or "killed")

def call(path, token=None, body=b"{}"):
    request = urllib.request.Request(targets["server"] + "/api/v1/" + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": "Bearer " + token} if token else {})})
    return urllib.request.urlopen(request, timeout=10).read()[:200]

for token in [None, *[v for k, v in os.environ.items() if "STRATA" in k and len(v) > 20]]:
    probe("register", lambda token=token: call("node/register/", token, json.dumps(
        {"name": "fake", "devices": []}).encode()))
    probe("heartbeat", lambda token=token: call("node/heartbeat/", token))
    probe("jobs", lambda token=token: call("jobs/", token))
print("DONE", flush=True)
'''

SLEEPER = r'''
import time
from pathlib import Path
Path("mine.txt").write_text("the other attempt's own file")
print("SLEEPING", flush=True)
time.sleep(600)
'''


def _job(cluster, directory: Path, name: str, secrets: tuple[str, ...] = ()) -> dict:
    environment = f"\n  environment: {{secrets: [{', '.join(secrets)}]}}" if secrets else ""
    (directory / "job.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        kind: train
        code: .
        resources: {{gpus: 0, cpus: 0.5}}
        max_attempts: 1
        spec:
          command: ["python", "{name}.py"]""") + environment + "\n")
    result = cluster.cli("submit", str(directory / "job.yaml"), timeout=120)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return cluster.job(result.stdout.split("submitted job ")[1].split()[0])


def test_a_hostile_job_reads_writes_kills_and_calls_nothing(cluster, tmp_path):
    assert sandbox.resolve_mode(None) == "bwrap", "bubblewrap must be installed (make install) for the sandbox"
    home = cluster.home
    state = home / "node"
    # Another job first: it leaves a checkpoint in the artifact store, then another attempt that keeps running.
    other = tmp_path / "other"
    other.mkdir()
    (other / "sleeper.py").write_text(SLEEPER)
    sleeper = _job(cluster, other, "sleeper")
    wait_for(lambda: any("SLEEPING" in line for line in cluster.logs(sleeper["id"])), 180,
             message="the other attempt to start")
    sleeper_attempt = cluster.job(sleeper["id"])["attempts"][-1]["id"]
    sleeper_dir = state / "work" / f"{sleeper_attempt}-0" / "code"
    assert (sleeper_dir / "mine.txt").exists()
    sleeper_pids = [p.pid for p in psutil.process_iter(["cmdline"]) if "sleeper.py" in " ".join(p.info["cmdline"] or [])]
    assert sleeper_pids
    stored = sorted(p for p in (home / "artifacts").rglob("*") if p.is_file())
    assert stored, "the artifact store holds the code bundles at least"

    project = tmp_path / "hostile"
    project.mkdir()
    (project / "hostile.py").write_text(HOSTILE)
    (project / "targets.json").write_text(json.dumps({
        "server": cluster.url,
        "read": {"worker-config": str(state / "worker.json"), "credentials": str(home / "credentials.json"),
                 "database": str(next(home.glob("*.sqlite3"), home / "strata.sqlite3")),
                 "client-config": str(home / "client.yaml"),
                 "other-attempt-file": str(sleeper_dir / "mine.txt"), "stored-artifact": str(stored[0]),
                 "agent-environ": f"/proc/{cluster.process.pid}/environ", "shadow": "/etc/shadow",
                 "root-home": str(Path.home() / ".bash_history")},
        "list": {"node-state": str(state), "home": str(home), "work": str(state / "work"),
                 "artifacts": str(home / "artifacts")},
        "write": {"etc": "/etc/strata-pwned", "node-state": str(state / "pwned"), "home": str(home / "pwned"),
                  "other-attempt": str(sleeper_dir / "mine.txt"), "repository": str(Path(__file__).parent / "pwned")},
        "kill": [*sleeper_pids, cluster.process.pid, os.getpid()],
    }))
    secret_value = "hostile-secret-" + os.urandom(8).hex()
    cluster.api("POST", "secrets/", json={"name": "HOSTILE_SECRET", "value": secret_value})
    hostile = _job(cluster, project, "hostile", secrets=("HOSTILE_SECRET",))
    wait_for(lambda: cluster.job(hostile["id"])["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}, 300,
             message="the hostile job to end")
    job = cluster.job(hostile["id"])
    logs = cluster.logs(hostile["id"])
    text = "\n".join(logs)
    assert job["state"] == "SUCCEEDED" and any("DONE" in line for line in logs), (job, text[-3000:])

    # It ran as its team's own unprivileged uid, and saw only its own sandbox's processes.
    uid = next(line for line in logs if "UID " in line).split("UID ")[1].split()
    assert int(uid[0]) != 0 and int(uid[0]) >= sandbox.UID_BASE, uid
    pids = json.loads(next(line for line in logs if "PIDS " in line).split("PIDS ")[1])
    assert len(pids) <= 6 and max(pids) < 100, pids  # its own PID namespace: bwrap's init, the runtime, itself

    # Nothing it read, listed, wrote, killed or called worked.
    probes = [line.split("PROBE ")[1] for line in logs if "PROBE " in line]
    names = {p.split()[0] for p in probes}
    for expected in ["read:worker-config", "read:credentials", "read:database", "read:client-config",
                     "read:other-attempt-file", "read:stored-artifact", "read:agent-environ", "read:shadow",
                     "list:node-state", "list:home", "list:work", "list:artifacts", "write:etc", "write:node-state",
                     "write:home", "write:other-attempt", "write:repository", "register", "heartbeat", "jobs",
                     *[f"kill:{pid}" for pid in sleeper_pids]]:
        assert expected in names, (expected, probes)
    # Listing the hidden directories shows only the empty tmpfs over them, with the job's own mount points: its
    # own attempt's directory and its bundle, nothing of the node's or another attempt's.
    listed = {p.split()[0]: p for p in probes if p.startswith("list:") and " LEAK " in p}
    own = str(job["attempts"][-1]["id"])
    for name, line in listed.items():
        entries = eval(line.split(" LEAK ", 1)[1])  # noqa: S307 - the repr of a list of names the job printed
        allowed = {"list:node-state": {"work", "code"}, "list:home": {"node"}}.get(name)
        if allowed is not None:
            assert set(entries) <= allowed, line
        else:
            assert name == "list:work" and all(entry.startswith(own) for entry in entries), line
        assert sleeper_attempt not in line and "worker.json" not in line and "credentials" not in line
    leaks = [p for p in probes if " LEAK " in f" {p} " and not p.startswith("list:")]
    assert not leaks, leaks
    # Its environment and every environment it could see hold neither the node's token nor the user's.
    for secret in (cluster.credentials["node_token"], cluster.credentials["token"]):
        assert secret not in text
    env = json.loads(next(line for line in logs if "ENV " in line).split("ENV ", 1)[1])
    assert not [name for name in env if "TOKEN" in name or name in ("STRATA_HOME", "STRATA_NODE_CONFIG")], env

    # The team's secret reached the job's environment, and its log holds *** where the job printed it.
    import hashlib

    assert any(f"SECRET_SHA {hashlib.sha256(secret_value.encode()).hexdigest()}" in line for line in logs)
    assert secret_value not in text and any("SECRET_SAID ***" in line for line in logs)
    # The other job (which asked for no secret) did not get it.
    assert secret_value not in "\n".join(cluster.logs(sleeper["id"]))

    # The other attempt is untouched, and still running.
    assert (sleeper_dir / "mine.txt").read_text() == "the other attempt's own file"
    assert all(psutil.pid_exists(pid) for pid in sleeper_pids)
    assert cluster.job(sleeper["id"])["state"] == "RUNNING"
    assert not Path("/etc/strata-pwned").exists() and not (state / "pwned").exists()
    cluster.api("POST", f"jobs/{sleeper['id']}/cancel/")
    wait_for(lambda: cluster.job(sleeper["id"])["state"] == "CANCELLED", 120, message="the sleeper to cancel")
    # A cancelled sandbox leaves no process behind.
    wait_for(lambda: not any(psutil.pid_exists(pid) for pid in sleeper_pids), 60,
             message="the sleeper's processes to end")
