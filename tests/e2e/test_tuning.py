"""End-to-end: a `tune` job on `strata up` runs its trials as nested child jobs inside its own GPU (on its warm
trial runner; PBT's trials are placed one by one), stops the poor ones early (ASHA), ends SUCCEEDED with a best trial listed by its trials route, and that trial's model is
served."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from e2e_support import login

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
SWEEP = {
    "name": "e2e-sweep", "kind": "tune", "resources": {"gpus": 1}, "max_attempts": 2,
    "spec": {
        "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.05},
                  "hidden": {"type": "choice", "values": [16, 64]}},
        "metric": "test_accuracy", "mode": "max", "trials": 4, "max_iterations": 3, "packing": 4, "seed": 3,
        "searcher": {"name": "random"},
        "scheduler": {"name": "asha", "options": {"grace_period": 1, "reduction_factor": 2}},
        "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}", "hidden": "{{hidden}}",
                                                "batch_size": 32}},
    },
}


def test_a_sweep_runs_its_trials_inside_its_gpu_and_its_best_model_is_served(cluster, tmp_path):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    done = cluster.cli("submit", str(tmp_path / "sweep.yaml"), "--wait", "--timeout", "240", timeout=260)
    assert done.returncode == 0, (done.stdout, done.stderr, cluster.output())
    sweep = re.search(r"submitted job (\S+) ", done.stdout).group(1)
    job = cluster.job(sweep)
    assert job["state"] == "SUCCEEDED", (job, cluster.output())
    # `--wait` showed the live table of trials: a header, then each trial's row as it changed.
    assert "status" in done.stdout and "parameters" in done.stdout, done.stdout
    for number in range(4):
        assert re.search(rf"trial +{number} +(running|paused|stopped|completed)", done.stdout), done.stdout

    children = cluster.get("jobs/", parent=sweep)["results"]
    assert len(children) == 4 and all(child["state"] in TERMINAL for child in children)
    tune_devices = {(a["node"], a["device_index"]) for a in job["attempts"][0]["allocations"]}
    assert [a["share"] for a in job["attempts"][0]["allocations"]] == [1.0]
    assert tune_devices
    for child in children:
        record = cluster.job(child["id"])
        assert record["parent"] == sweep and record["kind"] == "train" and record["nested"] is True
        # Run by the sweep's warm trial runner inside the sweep's GPU: a job of its own, never placed.
        assert record["attempts"] == [] and record["started_at"] and record["finished_at"], record
        assert any(point["name"] == "test_accuracy" for point in cluster.metrics(child["id"]))
        if record["state"] == "CANCELLED":  # stopped by the sweep's scheduler: its job says so, and when
            assert record["reason"].startswith("stopped early by ASHA at iteration "), record["reason"]
        if record["state"] == "SUCCEEDED":  # its files are its job's: the model a serve job reads
            assert {"model.pt", "metrics.json"} <= {a["name"] for a in cluster.get(f"jobs/{child['id']}/artifacts/")}

    logs = "\n".join(cluster.logs(sweep))
    assert logs.count("trial ") >= 4 and "best trial" in logs, logs
    artifacts = {a["name"]: a for a in cluster.get(f"jobs/{sweep}/artifacts/")}
    assert {"trials.json", "best.json"} <= set(artifacts)
    best = json.loads(cluster.session.get(
        f"{cluster.url}/api/v1/jobs/{sweep}/artifacts/{artifacts['best.json']['id']}/download/", timeout=30).text)
    assert best["best_job"] in {child["id"] for child in children} and best["best_value"] > 0.5
    metrics = {point["name"] for point in cluster.metrics(sweep)}
    assert {"trials_done", "best_test_accuracy"} <= metrics

    # The trials route: every trial with its parameters, decision and its job's state.
    table = cluster.get(f"jobs/{sweep}/trials/")
    assert [row["number"] for row in table["trials"]] == [0, 1, 2, 3]
    assert {row["job"] for row in table["trials"]} == {child["id"] for child in children}
    assert all(row["status"] in {"completed", "stopped"} and row["state"] in TERMINAL for row in table["trials"])
    assert all(set(row["params"]) == {"lr", "hidden"} for row in table["trials"])
    assert table["best"]["job"] == best["best_job"] and table["metric"] == "test_accuracy"

    # The job page shows the sweep's panels, drawn from the same report.
    browser = login(cluster)
    panels = {panel["slug"]: panel for panel in
              browser.get(f"{cluster.url}/jobs/{sweep}/live/?panels=1", timeout=30).json()["panels"]}
    assert {"tune-curves", "tune-parameters", "tune-rungs", "tune-shares"} <= set(panels), list(panels)
    assert len(panels["tune-curves"]["figure"]["data"]) == 4
    assert 'data-panel="tune-shares"' in browser.get(f"{cluster.url}/jobs/{sweep}/", timeout=30).text

    # The best trial is an ordinary train job: a serve job reads its model.
    (tmp_path / "serve.yaml").write_text(f"name: e2e-best\nkind: serve\nresources: {{gpus: 0.25}}\n"
                                         f"spec: {{model: {{job: {best['best_job']}}}}}\n")
    served = cluster.cli("submit", str(tmp_path / "serve.yaml"), "--wait", "--timeout", "90")
    assert served.returncode == 0, (served.stdout, served.stderr, cluster.output())
    serve_id = re.search(r"submitted job (\S+) ", served.stdout).group(1)
    assert cluster.job(serve_id)["endpoint"]
    cluster.api("POST", f"jobs/{serve_id}/cancel/")
    assert cluster.wait_state(serve_id, TERMINAL, 60)["state"] == "CANCELLED"


PBT = {
    "name": "e2e-pbt", "kind": "tune", "resources": {"gpus": 1}, "max_attempts": 2,
    "spec": {
        "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 0.05}},
        "metric": "test_accuracy", "mode": "max", "trials": 4, "max_iterations": 6, "packing": 4, "seed": 5,
        "searcher": {"name": "random"},
        "scheduler": {"name": "pbt", "options": {"perturbation_interval": 1, "quantile_fraction": 0.5,
                                                 "hyperparam_mutations": {"lr": {"low": 1e-4, "high": 0.05}}}},
        # Small batches: epochs long enough (hundreds of steps) that the engine sees each trial's results while
        # it runs (metrics reach the control plane twice a second); PBT ranks only trials still running.
        "trainable": {"kind": "train", "spec": {"workload": "mlp-digits", "lr": "{{lr}}", "batch_size": 4,
                                                "checkpoint_every": 60}},
    },
}


def test_a_pbt_sweep_goes_on_from_better_trials_checkpoints(cluster):
    """Population based training on real trainings: an exploited trial goes on as a new child job that starts
    from the donor's checkpoint (copied by the control plane) with an explored learning rate."""
    sweep = cluster.submit(PBT)["id"]
    job = cluster.wait_state(sweep, TERMINAL, 240)
    assert job["state"] == "SUCCEEDED", (job, cluster.output())
    table = cluster.get(f"jobs/{sweep}/trials/")
    exploited = [row for row in table["trials"] if row["exploits"]]
    if not exploited:
        pytest.fail("no trial was exploited:\n" + "\n".join(cluster.logs(sweep)) + "\n" + json.dumps(table["rungs"]))
    children = {child["id"]: child for child in cluster.get("jobs/", parent=sweep)["results"]}
    assert len(children) == 4 + sum(len(row["exploits"]) for row in table["trials"])
    for row in exploited:
        for old in row["jobs"]:  # cancelled, unless it finished before the engine read its results
            assert children[old]["state"] in {"CANCELLED", "SUCCEEDED"}
            if children[old]["state"] == "CANCELLED":  # a placed trial: its job says why (the placed path)
                assert children[old]["reason"].startswith("replaced by PBT at iteration "), children[old]
        step = row["exploits"][-1]
        assert step["job"] == row["job"] and row["params"] == step["params"]
        logs = "\n".join(cluster.logs(row["job"]))
        # It trained on from the donor's weights, at its own (explored) learning rate.
        assert "resumed mlp-digits from the checkpoint at step" in logs, logs
        assert cluster.job(row["job"])["spec"]["lr"] == pytest.approx(step["params"]["lr"])
    assert all(row["status"] == "completed" for row in table["trials"]), table
    assert table["best"]["value"] > 0.5
