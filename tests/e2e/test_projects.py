"""A team's own project on a real cluster (``strata up`` without a node, then ``strata node`` processes): a directory
from outside the repository shipped with ``strata submit --code``, its requirements installed from a package index
(on loopback) into the job's environment, its logs, metrics (stdout and strata_report), artifacts and checkpoint,
resumed after its node is killed; the unchanged torchrun DDP example on two ranks; a tune sweep of a command job;
an entrypoint from the bundle; a broken requirements.txt that fails once with pip's message; and the research
mechanisms on a team's own Workload classes: GPU sharing and a sweep, SMS, Stanza, and its model served over gRPC
(exported, with no code of the team's, and through a loader class of the bundle)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e2e_support import TERMINAL, group_processes, running_cluster, wait_for
from support import index_environment, package_index

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "projects"

TRAIN = '''
import argparse, os, sys, time
from pathlib import Path
import torch
import strata_hello
import strata_report

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--epoch-seconds", type=float, default=0.0)  # a pause after each epoch of a first run only
args = parser.parse_args()
print(strata_hello.GREETING, flush=True)
ckpt = strata_report.checkpoint_dir() / "state.pt"
start = 0
if ckpt.exists():
    start = torch.load(ckpt)["epoch"]
    print(f"resumed at epoch {start}", flush=True)
torch.manual_seed(0)
x = torch.randn(512, 8)
y = (x.sum(1) > 0).long()
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for epoch in range(start, args.epochs):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"strata: step={epoch + 1} loss={loss.item():.4f}", flush=True)
    strata_report.report(step=epoch + 1, accuracy=accuracy)
    torch.save({"epoch": epoch + 1}, ckpt)
    strata_report.save()
    if not start:  # the pauses keep a first run going for the node to be killed under it; a resumed run needs none
        time.sleep(args.epoch_seconds)
torch.save(model.state_dict(), strata_report.output_dir() / "model.pt")
Path("beside.txt").write_text("the working directory is writable")
print("done", flush=True)
'''


def tabulate_wheel(directory: Path) -> Path:
    """The real tabulate wheel the DDP example's requirements.txt names: from this machine's package mirror, or
    downloaded by pip once (from whatever index pip is configured with)."""
    found = sorted(glob.glob("/opt/pypi/files/tabulate-0.10.0-py3-none-any.whl"))
    if found:
        return Path(found[0])
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(directory),
                    "tabulate==0.10.0"], check=True, timeout=300)
    return next(directory.glob("tabulate-*.whl"))


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("index")
    hello = {"strata-hello": {"strata_hello/__init__.py": "GREETING = 'hello from the package index'\n"}}
    with package_index(root, hello) as url:
        wheel = tabulate_wheel(root)
        (root / "simple" / "tabulate").mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, root / "simple" / "tabulate" / wheel.name)
        (root / "simple" / "tabulate" / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
        yield url


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, index):
    """A control plane and one node with two virtual GPUs that installs from the loopback index only."""
    with running_cluster(tmp_path_factory.mktemp("projects-home"), virtual_gpus=0) as running:
        running.node_env = index_environment(index)
        running.node = running.start_node("p1", virtual_gpus=2, env=running.node_env)
        wait_for(lambda: running.get("nodes/")["count"] >= 1 if isinstance(running.get("nodes/"), dict)
                 else len(running.get("nodes/")) >= 1, 90, message="the node to register")
        yield running


def project(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def job_file(directory: Path, body: str) -> Path:
    path = directory / "job.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def artifacts(cluster, job_id: str) -> dict[str, dict]:
    page = cluster.get(f"jobs/{job_id}/artifacts/")
    rows = page.get("results", page) if isinstance(page, dict) else page
    return {row["name"]: row for row in rows}


def test_a_project_from_outside_the_repo_runs_with_its_requirements(cluster, tmp_path):
    directory = project(tmp_path / "my-project", {"train.py": TRAIN, "requirements.txt": "strata-hello\n",
                                                  ".strataignore": "data/\n"})
    (directory / "data").mkdir()
    (directory / "data" / "huge.bin").write_bytes(b"0" * 4096)  # ignored: never shipped
    spec = job_file(tmp_path, """
        name: my-project
        kind: train
        resources: {gpus: 0.5}
        spec:
          command: ["python", "train.py", "--epochs", "3"]
          environment: {requirements: requirements.txt, env: {TEAM_SETTING: "on"}}
    """)
    result = cluster.cli("submit", str(spec), "--code", str(directory), "--wait", timeout=600)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    assert "packed" in result.stdout and "uploaded" in result.stdout
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED" and job["code"]["file_count"] == 3, job
    files = [f["path"] for f in cluster.get(f"code/{job['code']['digest']}/")["files"]]
    assert files == [".strataignore", "requirements.txt", "train.py"]
    logs = cluster.logs(job_id)
    text = "\n".join(logs)
    assert "hello from the package index" in text, text[-3000:]
    assert "Successfully installed strata-hello" in text and "built in" in text
    assert "checkpoint saved" in text and "done" in text
    names = {point["name"] for point in cluster.metrics(job_id)}
    assert {"loss", "accuracy"} <= names  # stdout lines and strata_report
    assert "model.pt" in artifacts(cluster, job_id)
    # The second job of the same project and environment finds both cached.
    again = cluster.cli("submit", str(spec), "--code", str(directory), "--wait", timeout=600)
    assert again.returncode == 0 and "already stored" in again.stdout, again.stdout + again.stderr
    second = again.stdout.split("submitted job ")[1].split()[0]
    assert "(cached)" in "\n".join(cluster.logs(second))


def test_a_checkpoint_is_resumed_after_the_node_is_killed(cluster, tmp_path):
    directory = project(tmp_path / "long", {"train.py": TRAIN, "requirements.txt": "strata-hello\n"})
    spec = job_file(tmp_path, """
        name: long-project
        kind: train
        resources: {gpus: 0.5}
        spec:
          command: ["python", "train.py", "--epochs", "40", "--epoch-seconds", "0.5"]
          environment: {requirements: requirements.txt}
    """)
    result = cluster.cli("submit", str(spec), "--code", str(directory), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = result.stdout.split("submitted job ")[1].split()[0]

    def epochs_reported():
        return max([p["step"] for p in cluster.metrics(job_id) if p["name"] == "accuracy"] or [0])

    wait_for(lambda: epochs_reported() >= 4, 300, interval=0.5, message="four epochs")
    os.killpg(cluster.node.pid, signal.SIGKILL)
    cluster.node.wait(timeout=10)
    wait_for(lambda: not group_processes(cluster.node.pid), 10, message="the node's processes to die")
    job = wait_for(lambda: (j := cluster.job(job_id))["state"] != "RUNNING" and j, 60,
                   message="the job to leave RUNNING after its node died")
    assert job["attempts"][0]["outcome"] == "node_lost", job
    cluster.node = cluster.start_node("p1", virtual_gpus=2, env=cluster.node_env)
    job = cluster.wait_state(job_id, TERMINAL, 300)
    assert job["state"] == "SUCCEEDED", f"{job}\n{cluster.output()}"
    text = "\n".join(cluster.logs(job_id))
    resumed = int(text.split("resumed at epoch ")[1].split()[0])
    assert resumed >= 3, text[-2000:]
    assert [a["outcome"] for a in job["attempts"]] == ["node_lost", "succeeded"]


def test_the_torchrun_ddp_example_trains_on_two_ranks(cluster, tmp_path):
    example = EXAMPLES / "ddp-torchrun"
    result = cluster.cli("submit", str(example / "job.yaml"), "--wait", timeout=600)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    job = cluster.job(job_id)
    assert job["resources"]["workers"] == 2 and job["state"] == "SUCCEEDED"
    text = "\n".join(cluster.logs(job_id))
    assert "[rank 1]" in text and "Successfully installed tabulate" in text, text[-3000:]
    accuracy = [p["value"] for p in cluster.metrics(job_id) if p["name"] == "accuracy"]
    assert len(accuracy) == 5 and accuracy[-1] >= 0.9, accuracy
    assert "model.pt" in artifacts(cluster, job_id)


def test_a_tune_sweep_of_a_command_job(cluster):
    result = cluster.cli("submit", str(EXAMPLES / "sweep-report" / "sweep.yaml"), "--wait", timeout=900)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    sweep = cluster.job(job_id)
    assert sweep["state"] == "SUCCEEDED" and len(sweep["children"]) == 4, sweep
    for child in sweep["children"]:
        trial = cluster.job(child["id"])
        assert trial["code"]["digest"] == sweep["code"]["digest"]  # the trials run the sweep's project
        assert "--lr" in trial["spec"]["command"] and "{{lr}}" not in " ".join(trial["spec"]["command"])
    values = [p for child in sweep["children"] for p in cluster.metrics(child["id"]) if p["name"] == "accuracy"]
    assert values and max(p["value"] for p in values) > 0.5


def test_an_entrypoint_from_the_bundle_and_a_broken_requirement(cluster, tmp_path):
    directory = project(tmp_path / "entry", {"mytrain.py": """
        def main(ctx):
            ctx.log("mytrain ran from the bundle")
            ctx.metrics({"answer": 42.0}, step=1)
    """, "requirements.txt": "no-such-package-strata-e2e==1.0\n"})
    ok = job_file(tmp_path, """
        kind: train
        resources: {gpus: 0.5}
        spec: {entrypoint: "mytrain:main"}
    """)
    result = cluster.cli("submit", str(ok), "--code", str(directory), "--wait", timeout=300)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    assert "mytrain ran from the bundle" in "\n".join(cluster.logs(job_id))

    broken = job_file(tmp_path, """
        kind: train
        resources: {gpus: 0.5}
        spec:
          entrypoint: "mytrain:main"
          environment: {requirements: requirements.txt}
    """)
    result = cluster.cli("submit", str(broken), "--code", str(directory), "--wait", timeout=300)
    assert result.returncode != 0
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    job = cluster.job(job_id)
    assert job["state"] == "FAILED" and len(job["attempts"]) == 1, job  # not retried: max_attempts is 3
    assert job["attempts"][0]["outcome"] == "user_error"
    assert "no-such-package-strata-e2e" in job["reason"], job["reason"]

    missing = job_file(tmp_path, """
        kind: train
        resources: {gpus: 0.5}
        spec: {entrypoint: "notthere:main"}
    """)
    result = cluster.cli("submit", str(missing), "--code", str(directory), "--wait", timeout=300)
    job = cluster.job(result.stdout.split("submitted job ")[1].split()[0])
    assert job["state"] == "FAILED" and len(job["attempts"]) == 1 and "notthere" in job["reason"], job


def test_a_user_workload_on_a_share_and_a_sweep_of_it(cluster):
    """A team's own Workload class from the bundle, on half a GPU, stepped and checkpointed by Strata's loop; then
    a tune sweep of it (trials of the same bundle)."""
    example = EXAMPLES / "workload-share"
    result = cluster.cli("submit", str(example / "job.yaml"), "--wait", timeout=600)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job_id = result.stdout.split("submitted job ")[1].split()[0]
    job = cluster.job(job_id)
    assert job["resources"]["gpus"] == 0.5 and job["code"] is not None
    accuracy = [p["value"] for p in cluster.metrics(job_id) if p["name"] == "test_accuracy"]
    assert len(accuracy) == 4 and accuracy[-1] >= 0.85, accuracy
    assert {"model.pt", "metrics.json"} <= set(artifacts(cluster, job_id))

    result = cluster.cli("submit", str(example / "sweep.yaml"), "--wait", timeout=900)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    sweep = cluster.job(result.stdout.split("submitted job ")[1].split()[0])
    assert sweep["state"] == "SUCCEEDED" and len(sweep["children"]) == 4, sweep
    assert all(cluster.job(child["id"])["spec"]["entrypoint"] == "mywork:DigitsWorkload"
               for child in sweep["children"])


def test_sms_on_a_user_classification_workload(cluster):
    """SMS (the straggler plugin's strategy) on a team's own ClassificationWorkload from the bundle, worker 1
    slowed 2x: the job learns and the straggler report says SMS shrank the slow rank's batches."""
    result = cluster.cli("submit", str(EXAMPLES / "workload-share" / "sms.yaml"), "--wait", timeout=900)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job = cluster.job(result.stdout.split("submitted job ")[1].split()[0])
    assert job["spec"]["distributed"]["strategy"] == "sms" and job["code"] is not None
    accuracy = [p["value"] for p in cluster.metrics(job["id"]) if p["name"] == "test_accuracy"]
    assert accuracy and accuracy[-1] >= 0.8, accuracy
    report = job["attempts"][-1]["reports"]["straggler"]["payload"]
    assert report["strategy"] == "sms" and report["world_size"] == 2 and report["dropped_samples"] > 0, report


def _listener(address: str):
    """The process listening on ``address``'s port (psutil), or None."""
    import psutil

    port = int(address.rsplit(":", 1)[1])
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port:
            return psutil.Process(connection.pid) if connection.pid else None
    return None


def _serve_example(cluster, directory: Path, name: str, source_job: str) -> tuple[str, str, str]:
    """Submit the example serve file ``name`` of ``directory`` for ``source_job`` (its model.job filled in) and
    wait for the endpoint: ``(serve job id, address, a deployment token)``."""
    import re

    from components.serving.client import ServingError, describe

    path = directory / name
    path.write_text(path.read_text().replace("00000000-0000-0000-0000-000000000000", source_job))
    submitted = cluster.cli("submit", str(path), "--wait", "--timeout", "240", timeout=300)
    assert submitted.returncode == 0, f"{submitted.stdout}\n{submitted.stderr}\n{cluster.output()}"
    served = re.search(r"submitted job (\S+) ", submitted.stdout).group(1)
    address = re.search(r"listening on (\S+) ", submitted.stdout).group(1)
    issued = cluster.cli("job-token", "create", served, "--name", "e2e")
    assert issued.returncode == 0, issued.stdout + issued.stderr
    token = issued.stdout.strip()

    def accepted():
        try:
            describe(address, token=token)
        except ServingError as error:
            if error.code.name != "UNAUTHENTICATED":
                raise
            return False
        return True

    wait_for(accepted, 30, message="the endpoint to learn the new token")
    return served, address, token


def test_a_user_model_is_served_over_grpc(cluster, tmp_path):
    """A team's own Workload class from the bundle is trained (examples/projects/workload-share/job.yaml); its
    model.pt holds the model exported by torch.export, so a serve job with no code of the team's serves it
    (serve.yaml), in a sandboxed process of its own (it reads what the team's code wrote), never in the
    GPU-sharing service; a loader class of the team's from the bundle serves the same model (serve-loader.yaml).
    Both answer real predictions over gRPC."""
    from components.runtime.node import sandbox
    from components.serving.client import describe, predict

    example = tmp_path / "workload-share"
    shutil.copytree(EXAMPLES / "workload-share", example)
    result = cluster.cli("submit", str(example / "job.yaml"), "--wait", timeout=600)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    trained = result.stdout.split("submitted job ")[1].split()[0]
    assert any("model.pt: the model is exported (torch.export" in line for line in cluster.logs(trained))

    sys.path.insert(0, str(example))  # the example's own split of the digits, to check the answers
    try:
        import mywork
    finally:
        sys.path.remove(str(example))
    _, _, x_test, y_test = mywork.digits(cluster.job(trained)["spec"])
    rows, labels = x_test.numpy(), y_test.numpy()
    bwrap = sandbox.resolve_mode(None) == "bwrap" and os.geteuid() == 0

    served, address, token = _serve_example(cluster, example, "serve.yaml", trained)
    job = cluster.job(served)
    assert job["code"] is None and job["spec"]["model"]["entrypoint"] is None  # no code of the team's shipped
    info = describe(address, token=token)
    assert info["workload"] == "mywork:DigitsWorkload" and info["source_job"] == trained
    scores = predict(address, rows, timeout=30, token=token)
    assert scores.shape == (len(rows), 10)
    assert (scores.argmax(axis=1) == labels).mean() >= 0.85  # the trained weights
    assert "in the GPU-sharing service" not in "\n".join(cluster.logs(served))
    listener = _listener(address)
    assert listener is not None and listener.pid != cluster.node.pid
    if bwrap:  # the team's uid, as its code runs
        assert listener.uids().real >= sandbox.UID_BASE, listener.uids()

    loader, loader_address, loader_token = _serve_example(cluster, example, "serve-loader.yaml", trained)
    assert cluster.job(loader)["code"] is not None  # the bundle, which holds the loader class
    assert describe(loader_address, token=loader_token)["workload"] == "mywork:DigitsModel"
    answer = predict(loader_address, rows, timeout=30, token=loader_token)
    assert abs(answer - scores).max() < 1e-4  # the same model, through the team's own class

    for job_id in (served, loader):
        cluster.api("POST", f"jobs/{job_id}/cancel/")
    for job_id in (served, loader):
        assert cluster.wait_state(job_id, TERMINAL, 60)["state"] == "CANCELLED"


def test_stanza_on_a_user_classification_workload(cluster):
    """Stanza (the straggler plugin's layer separation) on a team's own ClassificationWorkload from the bundle
    (examples/projects/workload-share/stanza.yaml): rank 0 trains the convolutions, rank 1 the fully connected
    layers; the job learns, and the straggler report says Stanza sent fewer bytes than data parallelism would."""
    result = cluster.cli("submit", str(EXAMPLES / "workload-share" / "stanza.yaml"), "--wait", timeout=900)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.output()}"
    job = cluster.job(result.stdout.split("submitted job ")[1].split()[0])
    assert job["spec"]["distributed"]["strategy"] == "stanza" and job["code"] is not None
    assert job["resources"]["workers"] == 2
    accuracy = [p["value"] for p in cluster.metrics(job["id"]) if p["name"] == "test_accuracy"]
    assert len(accuracy) == 3 and accuracy[-1] >= 0.8, accuracy
    report = job["attempts"][-1]["reports"]["straggler"]["payload"]
    assert report["strategy"] == "stanza" and report["world_size"] == 2, report
    assert 0 < report["bytes_sent"] < report["bytes_full"], report
