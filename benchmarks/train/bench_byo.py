"""``strata bench byo``: what it costs to bring your own project, against the built-in path and the peers.

On a real cluster started here (``strata up`` without a node, then one ``strata node`` with two virtual GPUs that
installs from a package index on loopback, `benchmarks.core.package_index`), each figure is measured ``RUNS`` times
and reported as the median with its range:

1. **start**: submit (the bundle's upload included) until the job's code prints its first line, for a project
   with a 20 MB code bundle (a new bundle each run: fetched and unpacked every time) and an environment already
   built, against the same measure for a built-in workload (``mlp-digits``: until its child's first line).
   Target: at most 1.5x (ratio >= 0.67).
2. **fresh environment**: the same with an environment not built yet (one small pure-Python package, a new one
   each run), against Ray Jobs (``ray job submit`` through ``JobSubmissionClient`` with ``runtime_env``
   ``{"working_dir", "pip": [package]}``, Ray 2.60 in ``.venv-peers``, ``make bench-peers``) until the same
   script prints the same first line. Target: at most 1x. Only with ``--peers``.
3. **second job of a sweep**: the setup time (the node worker's preparation of the project, as its log's
   "project prepared in" note says: fetching the bundle, building the environment, the working directory) of a
   second job with the same bundle and environment, against the first's. Target: at most 0.2x (ratio >= 5).
4. **DDP step**: the unchanged torchrun example (``examples/projects/ddp-torchrun``) on two workers of Strata
   against ``torchrun --nproc-per-node 2`` of the same script on the same machine: median seconds per step over
   epochs 2 and later. Target: ratio >= 0.95.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from benchmarks import benchkit
from benchmarks.stack import free_port

RUNS = 3
BUNDLE_BYTES = 20 * 2**20
REPO = Path(__file__).resolve().parents[2]
DDP_EXAMPLE = REPO / "examples" / "projects" / "ddp-torchrun"
FAST = {"PYTHONUNBUFFERED": "1"}  # the shipped heartbeat, lease and tick intervals: what a cluster runs with
SCRUBBED = ("STRATA_DATABASE_URL", "STRATA_BROKER_URL", "STRATA_BROKER_PREFIX", "STRATA_HOME", "STRATA_CONFIG",
            "STRATA_URL", "STRATA_TOKEN", "STRATA_NODE_TOKEN")
# Its first line carries the wall time it started at (the setup figure reads it against the attempt's start).
MAIN = "import time\nprint('program-ready', time.time(), flush=True)\nimport {module}\nprint('imported', {module}.NAME, flush=True)\n"
say = benchkit.progress("  ")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(FAST)
    env.update(extra)
    return env


class LocalCluster:
    """``strata up --virtual-gpus 0`` in a throw-away home, plus one node with two virtual GPUs."""

    def __init__(self, home: Path, node_env: dict[str, str]):
        self.home, self.node_env = home, node_env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        self.session = requests.Session()

    def __enter__(self) -> LocalCluster:
        strata = str(Path(sys.executable).with_name("strata"))
        log = (self.home / "up.out").open("ab")
        self.processes.append(subprocess.Popen(
            [strata, "up", "--home", str(self.home), "--port", str(self.port), "--virtual-gpus", "0"],
            env=_env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        self._wait(lambda: (self.home / "credentials.json").exists() and self._healthy(), 120, "strata up")
        credentials = json.loads((self.home / "credentials.json").read_text())
        self.session.headers["Authorization"] = f"Bearer {credentials['token']}"
        node_log = (self.home / "node.out").open("ab")
        self.processes.append(subprocess.Popen(
            [strata, "node", "--server", self.url, "--name", "bench", "--virtual-gpus", "2",
             "--state-dir", str(self.home / "node")],
            env=_env(STRATA_NODE_TOKEN=credentials["node_token"], **self.node_env), stdout=node_log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        self._wait(lambda: self.get("nodes/")["count"] >= 1, 120, "the node to register")
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.session.close()

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    @staticmethod
    def _wait(condition, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = condition()
            except (requests.RequestException, KeyError, ValueError):
                value = None
            if value:
                return value
            time.sleep(0.05)
        raise RuntimeError(f"timed out waiting for {what}")

    def get(self, path: str, **params):
        response = self.session.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body=None, **kwargs):
        response = self.session.post(f"{self.url}/api/v1/{path}", json=body, timeout=600, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    def push(self, directory: Path) -> str:
        from components.runtime.shared import bundles

        with tempfile.TemporaryFile() as archive:
            bundles.pack(directory, archive, max_bytes=2**30)
            archive.seek(0)
            return self.post("code/", data=archive, headers={"Content-Type": "application/gzip"})["digest"]

    def first_line(self, job_id: str, marker: str, timeout: float = 900) -> dict:
        """The first log line of ``job_id`` containing ``marker`` (polled every 50 ms); fails if the job ends."""
        after = 0

        def seen():
            nonlocal after
            for line in self.get(f"jobs/{job_id}/logs/", after=after):
                after = line["id"]
                if marker in line["message"]:
                    return line
            job = self.get(f"jobs/{job_id}/")
            if job["state"] in {"FAILED", "CANCELLED"}:
                raise RuntimeError(f"job {job_id} {job['state']}: {job['reason']}")
            return None

        return self._wait(seen, timeout, f"{marker!r} in job {job_id}'s log")

    def wait_done(self, job_id: str, timeout: float = 900) -> dict:
        job = self._wait(lambda: (j := self.get(f"jobs/{job_id}/"))["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}
                         and j, timeout, f"job {job_id} to end")
        if job["state"] != "SUCCEEDED":
            raise RuntimeError(f"job {job_id} {job['state']}: {job['reason']}")
        return job


def _project(root: Path, module: str, *, payload: int = 0, requirements: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "main.py").write_text(MAIN.format(module=module))
    if payload:
        (root / "weights.bin").write_bytes(os.urandom(payload))  # incompressible: 20 MB on the wire too
    if requirements is not None:
        (root / "requirements.txt").write_text(requirements)
    return root


def _timed_project_job(cluster: LocalCluster, directory: Path, environment: dict | None,
                       timings: dict | None = None) -> tuple[float, float]:
    """(submit -> the program's first line, the node's preparation of the project) in seconds; ``timings`` gets
    the upload's seconds and the attempt's start -> the program's first line."""
    started = time.monotonic()
    digest = cluster.push(directory)
    uploaded = time.monotonic() - started
    spec = {"command": ["python", "main.py"], **({"environment": environment} if environment else {})}
    job = cluster.post("jobs/", {"kind": "train", "name": "byo-bench", "code": digest, "max_attempts": 1,
                                 "resources": {"gpus": 0.5}, "spec": spec})
    line = cluster.first_line(job["id"], "program-ready")
    elapsed = time.monotonic() - started
    done = cluster.wait_done(job["id"])
    prepared = cluster.first_line(job["id"], "project prepared in")
    if timings is not None:
        timings.setdefault("upload_s", []).append(round(uploaded, 3))
        timings.setdefault("claim_to_program_s", []).append(round(_setup_seconds(done, line), 3))
    return elapsed, float(prepared["message"].split("project prepared in", 1)[1].split()[0])


def _setup_seconds(job: dict, line: dict) -> float:
    """The attempt's start (its claim, the control plane's clock) until the program's own first ``time.time()``
    (the same machine's clock): the fetch, the environment and the working directory, without log delays."""
    from datetime import datetime

    begin = datetime.fromisoformat(job["attempts"][-1]["started_at"].replace("Z", "+00:00")).timestamp()
    ready = float(line["message"].split("program-ready", 1)[1].split()[0])
    return max(0.0, ready - begin)


def _timed_builtin_job(cluster: LocalCluster) -> float:
    started = time.monotonic()
    job = cluster.post("jobs/", {"kind": "train", "name": "builtin-bench", "max_attempts": 1,
                                 "resources": {"gpus": 0.5}, "spec": {"workload": "mlp-digits", "epochs": 1}})
    cluster.first_line(job["id"], "starting on")
    elapsed = time.monotonic() - started
    cluster.wait_done(job["id"])
    return elapsed


def _ddp_on_strata(cluster: LocalCluster, epochs: int) -> float:
    digest = cluster.push(DDP_EXAMPLE)
    job = cluster.post("jobs/", {"kind": "train", "name": "ddp-bench", "code": digest, "max_attempts": 1,
                                 "resources": {"gpus": 0.5, "workers": 2},
                                 "spec": {"command": ["python", "train.py", "--epochs", str(epochs)],
                                          "environment": {"requirements": "requirements.txt"}}})
    cluster.wait_done(job["id"])
    points = [p for p in _all(cluster, f"jobs/{job['id']}/metrics/") if p["name"] == "step_seconds"]
    return statistics.median(p["value"] for p in points if p["step"] >= 2)


def _all(cluster: LocalCluster, path: str) -> list[dict]:
    rows, after = [], 0
    while page := cluster.get(path, after=after):
        rows.extend(page)
        after = page[-1]["id"]
    return rows


def _ddp_with_torchrun(epochs: int, node_env: dict[str, str], work: Path) -> float:
    """The same script under torchrun in a virtual environment with its requirements (pip, the same index)."""
    env_dir = work / "torchrun-env"
    from components.runtime.node.project_cache import build_environment

    if not env_dir.exists():
        previous = {k: os.environ.get(k) for k in node_env}
        os.environ.update(node_env)
        try:
            build_environment(env_dir, DDP_EXAMPLE / "requirements.txt", [], lambda _m: None)
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    directory = work / f"torchrun-{secrets.token_hex(3)}"
    directory.mkdir()
    out = subprocess.run([str(env_dir / "bin" / "python"), "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          str(DDP_EXAMPLE / "train.py"), "--epochs", str(epochs)], cwd=directory,
                         capture_output=True, text=True, timeout=900,
                         env={**_env(), "STRATA_CHECKPOINT_DIR": str(directory / "checkpoint"),
                              "STRATA_OUTPUT_DIR": str(directory / "output")})
    if out.returncode != 0:
        raise RuntimeError(f"torchrun failed: {out.stderr[-500:]}")
    from components.runtime.contract.project import parse_report

    values = [(step, found[0]["step_seconds"]) for line in out.stdout.splitlines()
              if (found := parse_report(line)) and (step := found[1]) and "step_seconds" in found[0]]
    return statistics.median(v for step, v in values if step >= 2)


RAY_JOB = r'''
import json, sys, time
from ray.job_submission import JobSubmissionClient, JobStatus
address, working_dir, package = sys.argv[1], sys.argv[2], sys.argv[3]
client = JobSubmissionClient(address)
started = time.monotonic()
job = client.submit_job(entrypoint="python main.py", runtime_env={"working_dir": working_dir, "pip": [package]})
ready = None
while True:
    logs = client.get_job_logs(job)
    if ready is None and "program-ready" in logs:
        ready = time.monotonic() - started  # observed by polling, as `strata bench byo` observes its own jobs
    status = client.get_job_status(job)
    if status in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        break
    time.sleep(0.05)
print(json.dumps({"ready": ready, "status": str(status), "logs": logs[-500:]}))
'''


def _ray_jobs_runs(work: Path, index_env: dict[str, str], packages: list[str]) -> list[float]:
    """Ray Jobs with a pip runtime_env, one fresh package per run, against a local Ray head (its dashboard's job
    server), started and stopped here."""
    python = benchkit.peers_python()
    ray = str(Path(python).with_name("ray"))
    port, dashboard = free_port(), free_port()
    env = _env(**index_env, RAY_USAGE_STATS_ENABLED="0")
    subprocess.run([ray, "start", "--head", f"--port={port}", f"--dashboard-port={dashboard}",
                    "--include-dashboard=true", "--num-cpus=2", "--disable-usage-stats"],
                   env=env, check=True, capture_output=True, timeout=300)
    seconds = []
    try:
        for run, package in enumerate(packages):
            directory = _project(work / f"ray-{run}", package.replace("-", "_"))
            out = subprocess.run([python, "-c", RAY_JOB, f"http://127.0.0.1:{dashboard}", str(directory), package],
                                 env=env, capture_output=True, text=True, timeout=900)
            answer = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
            if answer.get("ready") is None:
                raise RuntimeError(f"Ray job {run} did not start: {out.stderr[-500:]} {answer}")
            say(f"Ray Jobs, fresh pip environment, run {run + 1}: {answer['ready']:.2f} s")
            seconds.append(answer["ready"])
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
    return seconds


def _figure(key, what, mine: list[float], theirs: list[float], target, mine_text, their_text, lower=True):
    extra = {"runs": {"mechanism": mine, "baseline": theirs},
             "range": {"mechanism": [min(mine), max(mine)] if mine else None,
                       "baseline": [min(theirs), max(theirs)] if theirs else None}}
    return benchkit.Figure(key=key, figure=what, mechanism=statistics.median(mine) if mine else None,
                           baseline=statistics.median(theirs) if theirs else None, unit="s", lower_is_better=lower,
                           target=target, mechanism_text=mine_text, baseline_text=their_text, extra=extra)


def main(quick: bool = False, output: str | None = None, peers: bool = False) -> int:
    from benchmarks.core.package_index import index_environment, package_index

    runs = 1 if quick else RUNS
    epochs = 4 if quick else 12
    print(f"strata bench byo{' --quick' if quick else ''}: {runs} run(s) per figure, {os.cpu_count()} CPUs",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="strata-byo-") as root_text:
        root = Path(root_text)
        names = [f"strata-byo-pkg{i}" for i in range(3 * runs + 2)]
        packages = {name: {f"{name.replace('-', '_')}/__init__.py": f"NAME = {name!r}\n"} for name in names}
        with package_index(root / "index", packages) as url:
            tabulate = sorted(Path("/opt/pypi/files").glob("tabulate-0.10.0-*.whl")) if Path("/opt/pypi/files").is_dir() \
                else []
            index_env = index_environment(url)
            if tabulate:  # the DDP example's one requirement, from this machine's mirror
                import shutil

                target = root / "index" / "simple" / "tabulate"
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(tabulate[0], target / tabulate[0].name)
                (target / "index.html").write_text(f'<a href="{tabulate[0].name}">{tabulate[0].name}</a>\n')
            else:
                index_env = {}  # pip's own configuration (the DDP example needs tabulate from somewhere)
                say("no local tabulate wheel: the node installs from pip's configured index")
            figures, details = [], {}
            home = root / "home"
            home.mkdir()
            with LocalCluster(home, index_env) as cluster:
                pkg = iter(names)
                # Warm-up: torch's first import on the node, and the environment of figure 1.
                _timed_builtin_job(cluster)
                cached_package = next(pkg)
                cached_env = {"pip": [cached_package]}
                _timed_project_job(cluster, _project(root / "warm", cached_package.replace("-", "_")), cached_env)

                builtin, bundle, start_timings = [], [], {}
                for run in range(runs):
                    builtin.append(_timed_builtin_job(cluster))
                    directory = _project(root / f"bundle-{run}", cached_package.replace("-", "_"),
                                         payload=BUNDLE_BYTES)
                    bundle.append(_timed_project_job(cluster, directory, cached_env, start_timings)[0])
                    say(f"start, run {run + 1}: built-in {builtin[-1]:.2f} s, 20 MB bundle {bundle[-1]:.2f} s")
                figures.append(_figure("start_cached_env", "submit -> code starts: 20 MB bundle, cached environment",
                                       bundle, builtin, 1 / 1.5, f"{statistics.median(bundle):.2f} s",
                                       f"{statistics.median(builtin):.2f} s (built-in mlp-digits)"))

                fresh, firsts, seconds_ = [], [], []
                for run in range(runs):
                    package = next(pkg)
                    directory = _project(root / f"fresh-{run}", package.replace("-", "_"),
                                         requirements=f"{package}\n")
                    environment = {"requirements": "requirements.txt"}
                    total, first_setup = _timed_project_job(cluster, directory, environment)
                    _, second_setup = _timed_project_job(cluster, directory, environment)
                    fresh.append(total)
                    firsts.append(first_setup)
                    seconds_.append(second_setup)
                    say(f"fresh environment, run {run + 1}: {total:.2f} s; setup {first_setup:.2f} s, then "
                        f"{second_setup:.2f} s for the second job")
                ray = []
                if peers:
                    ray = _ray_jobs_runs(root, index_env, [next(pkg) for _ in range(runs)])
                figures.append(_figure("start_fresh_env", "submit -> code starts: a new environment of one package",
                                       fresh, ray, 1.0, f"{statistics.median(fresh):.2f} s",
                                       f"{statistics.median(ray):.2f} s (Ray Jobs, pip runtime_env)" if ray
                                       else "not run (--peers)"))
                figures.append(_figure("second_job_setup", "setup of a sweep's second job (same bundle, environment)",
                                       seconds_, firsts, 5.0, f"{statistics.median(seconds_):.2f} s",
                                       f"{statistics.median(firsts):.2f} s (its first job)"))

                strata_ddp, torchrun = [], []
                for run in range(runs):
                    strata_ddp.append(_ddp_on_strata(cluster, epochs))
                    torchrun.append(_ddp_with_torchrun(epochs, index_env, root))
                    say(f"DDP step, run {run + 1}: Strata {strata_ddp[-1] * 1000:.2f} ms, torchrun "
                        f"{torchrun[-1] * 1000:.2f} ms")
                figures.append(_figure("ddp_step", "DDP step time, unchanged torchrun script, 2 ranks", strata_ddp,
                                       torchrun, 0.95, f"{statistics.median(strata_ddp) * 1000:.2f} ms",
                                       f"{statistics.median(torchrun) * 1000:.2f} ms (torchrun --nproc-per-node 2)"))
                details = {"runs": runs, "bundle_bytes": BUNDLE_BYTES, "ddp_epochs": epochs,
                           "start_20mb_bundle": start_timings}
    doc = benchkit.document("byo", quick, figures, details)
    print()
    print(benchkit.figures_table(doc))
    benchkit.write(doc, output)
    return 0
