"""Smoke test of ``strata bench control-plane``: the in-process scheduling-pass part at a small scale."""

from __future__ import annotations

import pytest

from benchmarks.core.control_plane import DEVICES_PER_NODE, measure_pass
from strata.cli.bench import run_benchmark


@pytest.mark.django_db
def test_pass_uniform_fills_every_device():
    nodes, jobs = 50, 300  # 200 devices, 300 one-GPU jobs: exactly 200 fit
    result = measure_pass(jobs, nodes, mix="uniform")
    devices = nodes * DEVICES_PER_NODE
    assert result["placed"] == devices
    assert result["still_queued"] == jobs - devices
    assert result["waiting"] == jobs - devices
    assert result["placed_gpus"] == pytest.approx(devices)
    assert 0 < result["seconds"] < 10


@pytest.mark.django_db
def test_pass_mixed_is_capacity_limited():
    nodes, jobs = 50, 1000  # 200 devices; 800 GPUs of mixed whole/fractional/2-GPU demand
    result = measure_pass(jobs, nodes, mix="mixed")
    capacity = nodes * DEVICES_PER_NODE
    # Every request is a multiple of a quarter device and quarter-device jobs keep coming, so the pass fills
    # the cluster exactly; the rest stays queued with a reason.
    assert result["placed_gpus"] == pytest.approx(capacity)
    assert 0 < result["placed"] < jobs
    assert result["placed"] + result["still_queued"] == jobs
    assert result["waiting"] == result["still_queued"]
    assert 0 < result["seconds"] < 10


def test_unknown_benchmark_lists_known_ones():
    with pytest.raises(ValueError, match="known benchmarks: byo, control-plane"):
        run_benchmark("gpu", quick=True)


def test_peers_are_refused_by_a_benchmark_that_has_none():
    with pytest.raises(ValueError, match="runs no peer systems"):
        run_benchmark("control-plane", quick=True, peers=True)


def test_a_product_without_the_benchmarks_package_says_so(monkeypatch):
    """The product's image leaves benchmarks/ out: ``strata bench`` names the fix instead of a traceback."""
    import sys

    for name in [name for name in sys.modules if name == "benchmarks" or name.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "benchmarks", None)  # import benchmarks.* now raises ModuleNotFoundError
    with pytest.raises(ValueError, match="not installed here"):
        run_benchmark("dashboard", quick=True)
