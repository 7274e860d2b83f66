"""The availability predictor (forecasts of the mean availability over a horizon, scored online) and the node
service that samples, forecasts and reports it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from components.runtime.contract.services import NodeInfo
from components.runtime.testing.conformance.services import NodeServiceConformance
from components.straggler.availability import (
    AvailabilityPredictor,
    AvailabilityService,
    NodeSampler,
    dominant_period,
    dominant_periods,
    features,
    targets,
)
from components.straggler.report import StragglerReport


def periodic(count: int, period: float = 150.0, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = np.zeros(count)
    for index in range(1, count):
        noise[index] = 0.8 * noise[index - 1] + rng.normal(0, 0.03)
    t = np.arange(count)
    return np.clip(0.6 + 0.25 * np.sin(2 * np.pi * t / period + 0.3) + noise, 0, 1)


def run_online(predictor: AvailabilityPredictor, trace: np.ndarray, fit_every: int = 30, forecast_every: int = 5):
    for index, value in enumerate(trace):
        predictor.observe({"cpu": value})
        if index >= predictor.min_samples() and index % fit_every == 0:
            predictor.fit()
        if index % forecast_every == 0:
            predictor.predict()
    return predictor


@pytest.mark.parametrize("model", ["ridge", "gbr"])
def test_the_predictor_beats_the_recent_mean_on_a_periodic_trace(model):
    predictor = run_online(AvailabilityPredictor(resources=("cpu",), horizon_s=60, interval_s=1, history=600,
                                                 model=model), periodic(1500))
    accuracy = predictor.accuracy()
    assert accuracy["n"] >= 100
    assert accuracy["mae"]["cpu"] < 0.5 * accuracy["naive_mae"]["cpu"], accuracy
    # and beats "the last sample" too, on the same horizons
    trace = periodic(1500)
    last = [abs(trace[i] - trace[i + 1:i + 61].mean()) for i in range(900, 1439, 5)]
    assert accuracy["mae"]["cpu"] < np.mean(last)


def test_accuracy_is_scored_once_the_horizon_has_passed():
    predictor = AvailabilityPredictor(resources=("cpu", "gpu"), horizon_s=10, interval_s=1, history=100)
    assert predictor.accuracy() == {"mae": {"cpu": None, "gpu": None}, "naive_mae": {"cpu": None, "gpu": None},
                                    "n": 0}
    for _ in range(5):
        predictor.observe({"cpu": 0.5, "gpu": 1.0})
    forecast = predictor.predict()  # before any model: the recent mean
    assert forecast.model == "naive" and forecast.predicted == {"cpu": 0.5, "gpu": 1.0}
    for _ in range(9):
        predictor.observe({"cpu": 0.5, "gpu": 1.0})
    assert predictor.accuracy()["n"] == 0  # 9 of the 10 samples it spoke about
    predictor.observe({"cpu": 0.8, "gpu": 1.0})
    accuracy = predictor.accuracy()
    assert accuracy["n"] == 1
    assert accuracy["mae"]["cpu"] == pytest.approx(0.03) and accuracy["mae"]["gpu"] == pytest.approx(0.0)


def test_observe_clamps_and_repeats_missing_values():
    predictor = AvailabilityPredictor(resources=("cpu", "memory"), history=8)
    predictor.observe({"cpu": 1.7, "memory": -3})
    predictor.observe({"cpu": math.nan})
    assert list(predictor.history["cpu"]) == [1.0, 1.0] and list(predictor.history["memory"]) == [0.0, 0.0]
    for _ in range(20):
        predictor.observe({"cpu": 0.5, "memory": 0.5})
    assert predictor.samples == 8 and predictor.count == 22


def test_features_and_targets_on_a_small_series():
    x = np.arange(20, dtype=float) / 20
    rows = np.array([5, 10])
    feats = features(x, rows, horizon=4, lags=3, window=4)
    assert feats.shape[0] == 2
    assert feats[0, 0] == pytest.approx(x[2:6].mean())  # the recent mean
    assert feats[0, 4:7] == pytest.approx(x[[5, 4, 3]] - x[2:6].mean())  # lags, relative to it
    assert targets(x, rows, 4) == pytest.approx([x[6:10].mean(), x[11:15].mean()])
    both = features(np.vstack([x, x[::-1]]), rows, 4, 3, 4, periods=np.array([np.nan, 5.0]))
    assert both.shape == (2, 2, feats.shape[1]) and both[0] == pytest.approx(feats)


def test_the_dominant_period_is_found_and_noise_has_none():
    assert dominant_period(periodic(600, period=150.0)) == pytest.approx(150.0, rel=0.05)
    assert dominant_period(np.random.default_rng(0).random(600)) is None
    assert dominant_period(np.ones(10)) is None
    periods = dominant_periods(np.vstack([periodic(600, 100.0), np.full(600, 0.5)]))
    assert periods[0] == pytest.approx(100.0, rel=0.05) and math.isnan(periods[1])


def test_a_pooled_model_forecasts_many_nodes_and_their_spread():
    rng = np.random.default_rng(2)
    steady = [{"cpu": np.clip(0.8 + rng.normal(0, 0.01, 300), 0, 1)} for _ in range(3)]
    bursty = []
    for _ in range(3):
        x = np.clip(0.8 + rng.normal(0, 0.01, 300), 0, 1)
        for start in range(rng.integers(0, 30), 300, 40):
            x[start:start + 12] = 0.2
        bursty.append({"cpu": x})
    predictor = AvailabilityPredictor(resources=("cpu",), horizon_s=20, interval_s=1, history=300)
    assert not predictor.fitted and predictor.predict_many(steady)[0].model == "naive"
    assert predictor.fit(steady + bursty) and predictor.fitted
    forecasts = predictor.predict_many(steady + bursty)
    assert all(0 <= f.predicted["cpu"] <= 1 for f in forecasts)
    assert min(f.std["cpu"] for f in forecasts[3:]) > max(f.std["cpu"] for f in forecasts[:3])
    cheap = predictor.predict_many(steady + bursty, std=False)
    # The same predictions without the spread (to the last bits: a BLAS may sum in another order).
    assert [f.predicted.keys() for f in cheap] == [f.predicted.keys() for f in forecasts]
    assert all(a.predicted[key] == pytest.approx(b.predicted[key], rel=1e-12, abs=1e-12)
               for a, b in zip(cheap, forecasts, strict=True) for key in a.predicted)
    assert not AvailabilityPredictor(resources=("cpu",), horizon_s=50, interval_s=1).fit([{"cpu": np.ones(20)}])


class FakeSampler:
    gpu_source = "cpu"

    def __init__(self):
        self.tick = 0

    def sample(self, now=None):
        self.tick += 1
        value = 0.6 + 0.3 * math.sin(self.tick / 7)
        return {"cpu": value, "memory": 0.5, "gpu": value, "network": 1.0, "load": 0.25}


def test_the_service_report_passes_the_report_schema():
    service = AvailabilityService(NodeInfo(name="n"), interval_s=1.0, horizon_s=10.0, history=200)
    service.sampler = FakeSampler()
    assert service.report() is None
    for index in range(120):
        service.step(float(index), fit=index % 30 == 29, forecast=index % 5 == 0 or index == 119)
    payload = service.report()
    json.dumps(payload)
    clean = StragglerReport().node(payload)
    assert clean["samples"] == 120 and clean["horizon_s"] == 10.0 and clean["model"] == "ridge"
    assert set(clean["predicted"]) == {"cpu", "memory", "gpu", "network"}
    assert clean["accuracy"]["n"] > 0 and clean["gpu_source"] == "cpu" and clean["load"] == 0.25


def test_the_node_sampler_reads_this_machine():
    sampler = NodeSampler(devices=[], network_bps=1e9)
    first, second = sampler.sample(), sampler.sample()
    for values in (first, second):
        for resource in ("cpu", "memory", "gpu", "network"):
            assert 0.0 <= values[resource] <= 1.0, (resource, values)
    assert sampler.gpu_source == "none" and second["gpu"] == 1.0
    assert NodeSampler(devices=[type("V", (), {"virtual": True})()]).gpu_source == "cpu"


class TestAvailabilityService(NodeServiceConformance):
    service_path = "components.straggler.availability:AvailabilityService"
    plugin = "straggler"
    start_timeout = 120.0

    def kill(self, service) -> bool:
        service._stop.set()  # the sampling thread ends, as it would if it died
        return True

    def test_reports_pass_the_schema_once_sampled(self, services):
        self.started(services)
        from components.runtime.testing.conformance import wait_for

        wait_for(lambda: services[0].report() is not None, 10.0, "a first report")
        StragglerReport().node(services[0].report())
