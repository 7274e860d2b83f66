"""The network benchmark's link scaling: the emulated link keeps a pipeline stage's link-to-compute ratio (rho)
equal to the real setting's."""

from __future__ import annotations

import pytest

from benchmarks.decentral.scale import (
    PAPER,
    Setting,
    equivalent_link_mbit,
    gpt_flops_per_token,
    measure_compute,
)


def _measured(flops_per_s: float, width: int = 128, flops_per_token: float = 4.8e6) -> dict:
    return {"flops_per_s": flops_per_s, "flops_per_token": flops_per_token, "config": {"width": width}}


def test_gpt3_xl_flops_per_token_follow_kaplan():
    # 6 N + 6 n_layer n_ctx d_model: 7.8 GFLOP of parameters and 0.6 of attention
    assert gpt_flops_per_token(1.3e9, 24, 2048, 2048) == pytest.approx(6 * 1.3e9 + 6 * 24 * 2048 * 2048)
    assert PAPER.gpu_flops == pytest.approx(17.8e12)


def test_the_emulated_link_has_the_settings_rho():
    measured = _measured(30e9)
    scaled = equivalent_link_mbit(measured, cores=2, stages=4)
    # rho here, at the emulated link, equals rho in the setting
    stage_flops = 30e9 * 2 / 4
    rho_here = (128 * 4 / (scaled["emulated_link_mbit"] * 1e6 / 8)) / (4.8e6 / 4 / stage_flops)
    assert rho_here == pytest.approx(scaled["rho"], rel=1e-9)
    assert scaled["gpu_vs_machine_compute"] == pytest.approx(17.8e12 / 60e9)
    # a faster machine needs a faster link; a 10x faster link in the setting, a 10x faster emulated one
    assert equivalent_link_mbit(_measured(60e9), cores=2)["emulated_link_mbit"] == pytest.approx(
        2 * scaled["emulated_link_mbit"])
    assert equivalent_link_mbit(measured, cores=2, link_mbit=1000)["emulated_link_mbit"] == pytest.approx(
        10 * scaled["emulated_link_mbit"])


def test_heavier_activations_per_flop_in_the_setting_mean_a_slower_emulated_link():
    """At the same parameter count a wider model ships more activation bytes per FLOP: its pipeline waits on the
    link longer, so the emulation slows its link too."""
    narrow = Setting("n", 1e9, 24, 1024, 2048, 2, "g", 1e14, 0.5, 100.0)
    wide = Setting("w", 1e9, 24, 4096, 2048, 2, "g", 1e14, 0.5, 100.0)
    measured = _measured(30e9)
    narrow_link = equivalent_link_mbit(measured, cores=2, setting=narrow)
    wide_link = equivalent_link_mbit(measured, cores=2, setting=wide)
    # 4x the bytes per token, a little more compute (attention grows with the width too)
    assert narrow_link["emulated_link_mbit"] / 4 < wide_link["emulated_link_mbit"] < narrow_link["emulated_link_mbit"] / 3
    assert 3 * narrow_link["rho"] < wide_link["rho"] < 4 * narrow_link["rho"]


def test_this_machines_rate_is_measured_with_counted_flops():
    measured = measure_compute("tiny", batch=4, steps=1)
    assert measured["flops_per_step"] > 6 * measured["parameters"] * 4 * 64 * 0.5
    assert measured["flops_per_s"] > 0 and measured["threads"] == 1
