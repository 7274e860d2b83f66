"""Shrink instead of preempt on a real cluster (``strata up`` with one virtual GPU): a team's elastic command job
holds the whole device; a higher-priority job arrives; the elastic job stops at a checkpoint and restarts at once at
its smaller share beside it, resuming where it stopped, and the lost-work record says nothing was lost."""

from __future__ import annotations

import textwrap
from datetime import datetime
from pathlib import Path

from e2e_support import TERMINAL, wait_for

TRAIN = '''
import os, signal, sys, time
import strata_report

marker = strata_report.checkpoint_dir() / "step.txt"
step = int(marker.read_text()) if marker.exists() else 0
steps = int(sys.argv[1])
print(f"share {os.environ['STRATA_GPU_SHARE']} from step {step}", flush=True)
stopping = False


def stop(*_):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, stop)
while step < steps and not stopping:
    time.sleep(0.1)
    step += 1
    strata_report.report(step=step, progress=float(step))
    if step % 25 == 0:
        marker.write_text(str(step))
        strata_report.save()
marker.write_text(str(step))  # the checkpoint of a stop: stored when the program exits
print(f"stopped at step {step}" if stopping else "done", flush=True)
'''


def job_file(directory: Path, name: str, body: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def submitted(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split("submitted job ")[1].split()[0]


def test_an_elastic_job_is_shrunk_not_preempted_and_resumes_from_its_checkpoint(cluster, tmp_path):
    code = tmp_path / "project"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    elastic_spec = job_file(tmp_path, "elastic", """
        name: elastic
        kind: train
        priority: -10
        resources: {gpus: 1, elastic: {min_share: 0.25}}
        spec:
          command: ["python", "train.py", "300"]
    """)
    elastic = submitted(cluster.cli("submit", str(elastic_spec), "--code", str(code), timeout=300))

    def steps(job_id: str) -> int:
        return max([p["step"] for p in cluster.metrics(job_id) if p["name"] == "progress"] or [0])

    wait_for(lambda: steps(elastic) >= 30, 300, interval=0.5, message="the elastic job to pass its first checkpoint")
    urgent_spec = job_file(tmp_path, "urgent", """
        name: urgent
        kind: train
        priority: 50
        resources: {gpus: 0.5}
        spec:
          command: ["python", "train.py", "30"]
    """)
    urgent = submitted(cluster.cli("submit", str(urgent_spec), "--code", str(code), timeout=300))

    job = wait_for(lambda: (j := cluster.job(elastic))["resources"]["gpus"] == 0.25 and len(j["attempts"]) >= 2 and j,
                   300, interval=0.5, message="the elastic job to restart at its smaller share")
    first = job["attempts"][0]
    assert first["outcome"] == "preempted", job
    urgent_job = cluster.wait_state(urgent, TERMINAL, 300)
    assert urgent_job["state"] == "SUCCEEDED", urgent_job
    job = cluster.wait_state(elastic, TERMINAL, 600)
    assert job["state"] == "SUCCEEDED" and job["failures"] == 0, job

    text = "\n".join(cluster.logs(elastic))
    assert "share 1 from step 0" in text, text[-2000:]
    stopped = int(text.split("stopped at step ")[1].split()[0])
    resumed = int(text.split("share 0.25 from step ")[1].split()[0])
    assert resumed == stopped >= 30, text[-2000:]  # nothing lost: it resumed from the checkpoint of its stop
    events = cluster.get(f"jobs/{elastic}/events/")
    events = events.get("results", events) if isinstance(events, dict) else events
    assert any(e["kind"] == "resize" and e["message"].startswith(f"shrunk for higher-priority job {urgent}")
               for e in events), events
    # The urgent job ran beside the shrunk one: it started before the elastic job ended.
    assert datetime.fromisoformat(urgent_job["started_at"]) < datetime.fromisoformat(job["finished_at"])
    # The lost-work record of the shrunk attempt: one shrink, no preemption, nothing lost.
    usage = cluster.get(f"usage/{job['team']}/")
    lost = usage["lost_work"]
    assert (lost["shrinks"], lost["preemptions"], lost["steps"]) == (1, 0, 0), lost
