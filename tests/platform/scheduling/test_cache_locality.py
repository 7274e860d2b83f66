"""The datacache plugin's placement hook through the real scheduler: a job reading a dataset goes to the node
whose cache holds its pipeline, as the nodes' reports say; when that node is full it runs elsewhere at once."""

from __future__ import annotations

import time

from components.datacache.datasets import BUILTINS, definition, pipeline_id
from strata.cluster.models import Node
from strata.jobs.models import Allocation

PIPELINE = pipeline_id(definition({"name": "shapes-jpeg", **BUILTINS["shapes-jpeg"]}))
READS = {"workload": "cnn-dataset", "epochs": 1, "data": {"dataset": "shapes-jpeg", "cache": True}}


def _nodes(job) -> set[str]:
    return {a.device.node.name for a in Allocation.objects.filter(attempt__job=job, active=True)
            .select_related("device__node")}


def _holds(node_name: str, pipeline: str) -> None:
    payload = {"time": time.time(), "bytes": 100, "budget": 1000, "hits": 0, "misses": 1, "evictions": 0,
               "corrupt": 0, "uncached": 0,
               "entries": [{"key": "k", "dataset": "shapes-jpeg", "pipeline": pipeline, "part": "variant-0",
                            "bytes": 100, "hits": 0, "last_used": time.time(), "build_seconds": 1.0}]}
    Node.objects.filter(name=node_name).update(reports={"datacache": {"time": time.time(), "payload": payload,
                                                                      "series_until": 0.0}})


def _submit(user, team, name: str, spec: dict):
    from components.train.spec import TrainSpec
    from strata.jobs.services import job_submit

    job, _ = job_submit(user=user, team=team, data={
        "kind": "train", "name": name, "spec": TrainSpec().validate(spec), "priority": 0, "max_attempts": 1,
        "time_limit": 3600, "resources": {"gpus": 1.0, "gpu_memory": None, "workers": 1}})
    return job


def test_a_job_goes_where_its_pipeline_is_cached_and_never_waits_for_it(make_team, make_user, make_node, run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("cold", gpus=1)
    make_node("warm", gpus=2)
    _holds("warm", PIPELINE)
    # Best fit alone picks the cold node (fewest whole devices free) ...
    plain = _submit(user, team, "plain", {"workload": "mlp-digits", "epochs": 1})
    run_pass()
    assert _nodes(plain) == {"cold"}
    # ... and a reader of the cached pipeline goes to the warm node.
    first = _submit(user, team, "first", READS)
    run_pass()
    assert _nodes(first) == {"warm"}
    # With the cold node busy and the warm one holding one free GPU, the next reader takes it; once the warm node
    # is full, a reader waits only for room, not for that node: it runs on the cold node when that frees up.
    second = _submit(user, team, "second", READS)
    run_pass()
    assert _nodes(second) == {"warm"}


def test_a_full_warm_node_sends_the_job_elsewhere_at_once(make_team, make_user, make_node, run_pass):
    team = make_team("alpha")
    user = make_user("alice", team)
    make_node("warm", gpus=1)
    make_node("cold", gpus=2)
    _holds("warm", PIPELINE)
    first = _submit(user, team, "first", READS)
    run_pass()
    assert _nodes(first) == {"warm"}
    second = _submit(user, team, "second", READS)
    run_pass()
    assert _nodes(second) == {"cold"}, "locality is a preference, never a reason to wait"
    other = _submit(user, team, "other", {**READS, "data": {"dataset": "digits", "cache": True}})
    run_pass()
    assert _nodes(other) == {"cold"}
