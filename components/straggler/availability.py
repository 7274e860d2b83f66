"""Node availability: what each node samples about itself, and a forecast of how available it will be.

SAS (availability-aware gang placement, :mod:`components.straggler.sas`) places a gang on the group of nodes
most likely to stay available while the job runs. It needs, per node and resource, the *mean availability over
the next horizon* and how uncertain that is. This module provides both halves:

- :class:`AvailabilityPredictor`: a pure forecaster (numpy and scikit-learn, no clock, no I/O). It keeps a
  bounded history of availability samples (one per resource, 0 = fully used, 1 = idle), fits a regression model
  (``Ridge`` by default, ``GradientBoostingRegressor`` on request) on lag features of the history (the last few
  samples, the recent mean, spread and slope, a longer mean, the mean of the same stretch one and two periods
  ago when the series has a dominant period, and the phase within that period), and predicts the mean over the
  next ``horizon_s`` seconds with a residual standard deviation per series. It scores its own forecasts once
  the horizon they spoke about has passed (mean absolute error, beside the error of the naive forecast "the
  recent mean"). One model may be fitted on many nodes' histories at once (the simulator does this).
- :class:`AvailabilityService`: the plugin's node service. A thread samples the node every ``interval_s``
  (default 1 s) with psutil (CPU: ``1 - cpu_percent/100``; memory: the available fraction; network: ``1 -
  min(1, rate / capacity)`` over the non-loopback interfaces, capacity ``STRATA_STRAGGLER_NETWORK_BPS``, default
  1 Gbit/s; GPU: ``1 - utilization`` from NVML on CUDA devices, and the CPU's availability on virtual GPUs, which
  are the CPU), refits the predictor every ``fit_every_s`` (30 s) and forecasts every ``forecast_every_s``
  (5 s). Every heartbeat carries the latest forecast as ``reports["straggler"]`` (the payload is described in
  :mod:`components.straggler.report`).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from components.runtime.contract.services import NodeInfo, NodeService

log = logging.getLogger("strata.straggler")

RESOURCES = ("cpu", "memory", "gpu", "network")
NETWORK_ENV = "STRATA_STRAGGLER_NETWORK_BPS"  # bits per second one interface direction carries at most
INTERVAL_ENV = "STRATA_STRAGGLER_INTERVAL_S"
DEFAULT_NETWORK_BPS = 1e9
MODELS = ("ridge", "gbr")


# -- features -------------------------------------------------------------------------------------------------
def dominant_periods(x: np.ndarray, min_period: float = 4.0) -> np.ndarray:
    """Per series (rows of ``x``, series × samples), the period in samples of its strongest cycle, or NaN when
    none stands out: the peak of the power spectrum (mean removed, at least two whole cycles in the series)
    must hold a tenth of the variance and be four times the spectrum's median."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    count, n = x.shape
    periods = np.full(count, np.nan)
    if n < max(16, 2 * min_period):
        return periods
    power = np.abs(np.fft.rfft(x - x.mean(axis=1, keepdims=True), axis=1)) ** 2
    frequencies = np.arange(power.shape[1]) / n  # cycles per sample
    usable = (frequencies >= 2.0 / n) & (frequencies > 0) & (frequencies <= 1.0 / min_period)
    if not usable.any():
        return periods
    candidates = np.flatnonzero(usable)
    peak = candidates[np.argmax(power[:, candidates], axis=1)]
    strongest = power[np.arange(count), peak]
    total = power[:, 1:].sum(axis=1)
    clear = (total > 0) & (strongest >= 0.1 * total) & (strongest >= 4.0 * np.median(power[:, 1:], axis=1))
    periods[clear] = 1.0 / frequencies[peak[clear]]
    return periods


def dominant_period(x: np.ndarray, min_period: float = 4.0) -> float | None:
    """:func:`dominant_periods` of one series; None when no cycle stands out."""
    period = dominant_periods(np.asarray(x, dtype=float)[None, :], min_period)[0]
    return None if math.isnan(period) else float(period)


def _cumsum(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((len(x), 1)), np.cumsum(x, axis=1)], axis=1)


def features(x: np.ndarray, rows: np.ndarray, horizon: int, lags: int, window: int,
             periods: np.ndarray | float | None = None) -> np.ndarray:
    """The feature rows of each series of ``x`` (series × samples, or one series) at each index in ``rows`` (the
    last sample seen; every row ``>= lags - 1``): series × rows × features (rows × features for one series).
    ``periods``: each series' period in samples (NaN or None: none). Column 0 is the recent mean (the last
    ``window`` samples); the other levels are relative to it (a linear model and a model pooled over nodes
    both use them): spread and slope of the window, a ten-window mean, the last ``lags`` samples, the mean of
    the same stretch of the cycle one and two periods ago, whether that is known, and the phase."""
    single = np.ndim(x) == 1
    x = np.atleast_2d(np.asarray(x, dtype=float))
    count, n = x.shape
    periods = np.full(count, np.nan) if periods is None else np.broadcast_to(
        np.asarray(periods, dtype=float), (count,)).copy()
    periods[~np.isfinite(periods)] = np.nan
    rows = np.asarray(rows, dtype=int)
    cs, cs2 = _cumsum(x), _cumsum(x * x)
    csi = _cumsum(x * np.arange(n, dtype=float)[None, :])

    def mean_of(table: np.ndarray, last: np.ndarray, length: np.ndarray) -> np.ndarray:
        return (table[:, last + 1] - table[:, last + 1 - length]) / length

    length = np.minimum(rows + 1, window)
    mean = mean_of(cs, rows, length)
    spread = np.sqrt(np.maximum(mean_of(cs2, rows, length) - mean * mean, 0.0))
    mean_t = (rows + 1 - length + rows) / 2.0
    cov = mean_of(csi, rows, length) - mean_t * mean
    var_t = np.maximum((length * length - 1) / 12.0, 1e-9)
    slope = np.where(length > 1, cov / var_t, 0.0) * (horizon / 2.0)  # projected over half the horizon
    long_mean = mean_of(cs, rows, np.minimum(rows + 1, 10 * window))
    columns = [mean, spread, np.broadcast_to(slope, mean.shape), long_mean - mean]
    columns += [x[:, np.maximum(rows - lag, 0)] - mean for lag in range(lags)]
    seasons = []
    has = np.isfinite(periods)
    safe = np.where(has, periods, 1.0)
    cycles = np.maximum(1, np.ceil(horizon / safe))
    for back in (0, 1):
        shift = np.round((cycles + back) * safe).astype(int)[:, None]  # the same stretch, some periods ago
        first = rows[None, :] + 1 - shift
        known = has[:, None] & (first >= 0) & (first + horizon <= rows[None, :] + 1)
        value = (np.take_along_axis(cs, np.clip(first + horizon, 0, n), 1)
                 - np.take_along_axis(cs, np.clip(first, 0, n), 1)) / horizon
        seasons.append(np.where(known, value - mean, np.nan))
    has_season = np.isfinite(seasons[0])
    seasons[1] = np.where(np.isfinite(seasons[1]), seasons[1], seasons[0])
    seasons = [np.where(np.isfinite(value), value, 0.0) for value in seasons]
    phase = 2 * np.pi * (((rows[None, :] + 1 + horizon / 2.0) % safe[:, None]) / safe[:, None])
    columns += [seasons[0], seasons[1], has_season.astype(float), np.sin(phase) * has_season,
                np.cos(phase) * has_season]
    stacked = np.stack(columns, axis=-1)
    return stacked[0] if single else stacked


def targets(x: np.ndarray, rows: np.ndarray, horizon: int) -> np.ndarray:
    """The mean of the ``horizon`` samples after each row (every ``row + horizon < len``), per series."""
    single = np.ndim(x) == 1
    cs = _cumsum(np.atleast_2d(np.asarray(x, dtype=float)))
    rows = np.asarray(rows, dtype=int)
    found = (cs[:, rows + 1 + horizon] - cs[:, rows + 1]) / horizon
    return found[0] if single else found


def _spread(first: int, last: int, count: int) -> np.ndarray:
    """Up to ``count`` indexes evenly spread over [first, last], the last one included."""
    if last < first:
        return np.zeros(0, dtype=int)
    total = last - first + 1
    if total <= count:
        return np.arange(first, last + 1)
    return np.unique(np.round(np.linspace(first, last, count)).astype(int))


def _by_length(series: Sequence[np.ndarray]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for position, x in enumerate(series):
        groups.setdefault(len(x), []).append(position)
    return groups


# -- the forecaster -------------------------------------------------------------------------------------------
@dataclass
class Forecast:
    """One node's forecast: per resource the predicted mean availability over the horizon, its standard
    deviation, and the latest sample."""

    predicted: dict[str, float]
    std: dict[str, float]
    current: dict[str, float]
    model: str = "naive"


@dataclass
class _Model:
    estimator: Any
    rmse: float  # on held-out rows (the last fifth of each series)


@dataclass
class _Accuracy:
    errors: dict[str, deque] = field(default_factory=dict)  # resource -> recent |forecast - what happened|
    naive: dict[str, deque] = field(default_factory=dict)
    matured: int = 0


class AvailabilityPredictor:
    """Forecasts the mean availability of each resource over the next ``horizon_s`` seconds (see the module
    docstring). Pure: no clock, no I/O; the same samples and calls give the same answers.

    Online use (one node): :meth:`observe` each sample, :meth:`fit` now and then, :meth:`predict` for the
    forecast (which is scored once its horizon has passed: :meth:`accuracy`). Pooled use (many nodes):
    ``fit(histories)`` and ``predict_many(histories)`` with ``{resource: samples}`` per node."""

    STD_ROWS = 24  # stretches of a series' own history its forecast error is measured on
    STD_PRIOR = 4  # how many stretches the model's held-out error counts for beside them

    def __init__(self, resources: Sequence[str] = RESOURCES, horizon_s: float = 60.0, interval_s: float = 1.0,
                 history: int = 600, model: str = "ridge", lags: int = 4, window: int | None = None,
                 seed: int = 0, rows_per_series: int = 400, accuracy_window: int = 256):
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {model!r}")
        if horizon_s <= 0 or interval_s <= 0 or history < 8:
            raise ValueError("horizon and interval must be > 0 and the history at least 8 samples")
        self.resources = tuple(resources)
        self.horizon_s = float(horizon_s)
        self.interval_s = float(interval_s)
        self.horizon = max(1, int(round(horizon_s / interval_s)))
        self.lags = lags
        self.window = window or max(4, min(self.horizon, history // 8))
        self.model = model
        self.seed = seed
        self.rows_per_series = rows_per_series
        self.history: dict[str, deque] = {r: deque(maxlen=history) for r in self.resources}
        self.count = 0  # samples observed in all (the history keeps the last ``history``)
        self.models: dict[str, _Model] = {}
        self._pending: deque = deque(maxlen=4096)  # (index of the last sample seen, predicted, naive)
        self._accuracy = _Accuracy({r: deque(maxlen=accuracy_window) for r in self.resources},
                                   {r: deque(maxlen=accuracy_window) for r in self.resources})

    # -- online ------------------------------------------------------------------------------------------
    def observe(self, values: Mapping[str, float]) -> None:
        """One sample per resource (availability in [0, 1]; a missing or non-finite value repeats the last)."""
        for resource in self.resources:
            value = values.get(resource)
            if value is None or not math.isfinite(float(value)):
                value = self.history[resource][-1] if self.history[resource] else 1.0
            self.history[resource].append(min(1.0, max(0.0, float(value))))
        self.count += 1
        self._score()

    @property
    def samples(self) -> int:
        return len(self.history[self.resources[0]]) if self.resources else 0

    def _own(self) -> dict[str, np.ndarray]:
        return {r: np.fromiter(self.history[r], dtype=float) for r in self.resources}

    def _score(self) -> None:
        last = self.count - 1
        kept = self.samples
        while self._pending and self._pending[0][0] + self.horizon <= last:
            index, predicted, naive = self._pending.popleft()
            first = index + 1 - (self.count - kept)  # position in the history of the sample after ``index``
            if first < 0:
                continue  # the history no longer holds what happened
            for resource in self.resources:
                actual = sum(itertools.islice(self.history[resource], first, first + self.horizon)) / self.horizon
                self._accuracy.errors[resource].append(abs(predicted[resource] - actual))
                self._accuracy.naive[resource].append(abs(naive[resource] - actual))
            self._accuracy.matured += 1

    def accuracy(self) -> dict[str, Any]:
        """``{"mae": {resource: float | None}, "naive_mae": {...}, "n": int}`` over the most recent scored
        forecasts (``n`` of them); ``naive_mae`` is the error of "the recent mean" on the same horizons."""
        errors, naive = self._accuracy.errors, self._accuracy.naive
        n = min((len(errors[r]) for r in self.resources), default=0)
        return {"mae": {r: (sum(errors[r]) / len(errors[r]) if errors[r] else None) for r in self.resources},
                "naive_mae": {r: (sum(naive[r]) / len(naive[r]) if naive[r] else None) for r in self.resources},
                "n": n}

    # -- fitting -----------------------------------------------------------------------------------------
    def _estimator(self):
        if self.model == "gbr":
            from sklearn.ensemble import GradientBoostingRegressor

            return GradientBoostingRegressor(n_estimators=60, max_depth=3, learning_rate=0.1, subsample=0.8,
                                             random_state=self.seed)
        from sklearn.linear_model import Ridge

        return Ridge(alpha=1.0)

    def min_samples(self) -> int:
        """How many samples a series needs before it gives training rows."""
        return self.lags + self.horizon + 8

    def fit(self, histories: Sequence[Mapping[str, Sequence[float]]] | None = None) -> bool:
        """Fit one model per resource on ``histories`` (one ``{resource: samples}`` per node; this predictor's
        own history when None). False (and the models kept as they were) when there are too few samples."""
        series_list = [self._own()] if histories is None else [
            {r: np.asarray(h[r], dtype=float) for r in self.resources} for h in histories]
        fitted = {}
        for resource in self.resources:
            train_x, train_y, held_x, held_y = [], [], [], []
            every = [series[resource] for series in series_list]
            for length, members in _by_length(every).items():
                if length < self.min_samples():
                    continue
                x = np.vstack([every[m] for m in members])
                rows = _spread(self.lags - 1, length - 1 - self.horizon, self.rows_per_series)
                feats = features(x, rows, self.horizon, self.lags, self.window, dominant_periods(x))
                ys = targets(x, rows, self.horizon) - feats[:, :, 0]  # relative to the recent mean
                cut = max(1, int(len(rows) * 0.8))
                train_x.append(feats[:, :cut].reshape(-1, feats.shape[-1]))
                train_y.append(ys[:, :cut].ravel())
                held_x.append(feats[:, cut:].reshape(-1, feats.shape[-1]))
                held_y.append(ys[:, cut:].ravel())
            if not train_x or sum(len(y) for y in train_y) < 8:
                return False
            tx, ty = np.vstack(train_x), np.concatenate(train_y)
            hx, hy = np.vstack(held_x), np.concatenate(held_y)
            estimator = self._estimator().fit(tx, ty)
            rmse = float(np.sqrt(np.mean((estimator.predict(hx) - hy) ** 2))) if len(hy) else float(np.std(ty))
            estimator = self._estimator().fit(np.vstack([tx, hx]), np.concatenate([ty, hy]))
            fitted[resource] = _Model(estimator, max(rmse, 1e-3))
        self.models = fitted
        return True

    @property
    def fitted(self) -> bool:
        return bool(self.models)

    # -- predicting --------------------------------------------------------------------------------------
    def predict(self, history: Mapping[str, Sequence[float]] | None = None) -> Forecast:
        """The forecast for one node: this predictor's own history when ``history`` is None (and then it is
        remembered, to be scored once its horizon has passed)."""
        own = history is None
        forecast = self.predict_many([self._own() if own else history])[0]
        if own and self.samples:
            naive = {r: float(np.mean(list(self.history[r])[-self.window:])) for r in self.resources}
            self._pending.append((self.count - 1, dict(forecast.predicted), naive))
        return forecast

    def predict_many(self, histories: Sequence[Mapping[str, Sequence[float]]], std: bool = True) -> list[Forecast]:
        """One forecast per ``{resource: samples}``. The std is the series' own error on up to 24 stretches of
        its history whose outcome is known, blended with the model's held-out error (worth 4 stretches); with
        ``std=False`` it is the model's held-out error alone (cheaper: one feature row per series). Before a
        model is fitted (or for a series shorter than its lags) the forecast is the recent mean with the recent
        spread."""
        out = [Forecast({}, {}, {}, self.model if self.models else "naive") for _ in histories]
        for resource in self.resources:
            model = self.models.get(resource)
            every = [np.asarray(history[resource], dtype=float) for history in histories]
            for length, members in _by_length(every).items():
                if length == 0:
                    for m in members:
                        out[m].predicted[resource], out[m].std[resource], out[m].current[resource] = 1.0, 0.5, 1.0
                    continue
                x = np.vstack([every[m] for m in members])
                for position, m in enumerate(members):
                    out[m].current[resource] = float(x[position, -1])
                if model is None or length < self.lags:
                    recent = x[:, -self.window:]
                    for position, m in enumerate(members):
                        out[m].predicted[resource] = float(recent[position].mean())
                        out[m].std[resource] = float(max(recent[position].std(), 0.02))
                    continue
                scored = _spread(self.lags - 1, length - 1 - self.horizon, self.STD_ROWS) if std else np.zeros(
                    0, dtype=int)
                rows = np.concatenate([[length - 1], scored]).astype(int)
                feats = features(x, rows, self.horizon, self.lags, self.window, dominant_periods(x))
                guess = model.estimator.predict(feats.reshape(-1, feats.shape[-1])).reshape(len(members), len(rows))
                guess = np.clip(guess + feats[:, :, 0], 0.0, 1.0)
                if len(scored):
                    local = np.mean((guess[:, 1:] - targets(x, scored, self.horizon)) ** 2, axis=1)
                    blended = (len(scored) * local + self.STD_PRIOR * model.rmse ** 2) / (len(scored) + self.STD_PRIOR)
                else:
                    blended = np.full(len(members), model.rmse ** 2)
                spread = np.clip(np.sqrt(blended), 0.01, 0.5)
                for position, m in enumerate(members):
                    out[m].predicted[resource] = float(guess[position, 0])
                    out[m].std[resource] = float(spread[position])
        return out


# -- the node service -----------------------------------------------------------------------------------------
class NodeSampler:
    """Reads the node's availability with psutil (and NVML for CUDA devices): one ``{resource: value}`` per
    call. The first network reading has no rate yet (it reads as fully available)."""

    def __init__(self, devices: Sequence[Any] = (), network_bps: float | None = None):
        import psutil

        self.psutil = psutil
        self.devices = list(devices)
        bits = network_bps or float(os.environ.get(NETWORK_ENV) or DEFAULT_NETWORK_BPS)
        self.network_bytes = max(bits / 8.0, 1.0)
        self._net: tuple[float, int, int] | None = None
        self.cpus = os.cpu_count() or 1
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement
        self.gpu_source = self._gpu_source()

    def _gpu_source(self) -> str:
        cuda = [d for d in self.devices if not getattr(d, "virtual", True)]
        if not cuda:
            return "cpu" if self.devices else "none"
        from components.runtime.node import devices

        return "nvml" if devices._nvml_module() else "none"

    def _network(self, now: float) -> float:
        counters = self.psutil.net_io_counters(pernic=True) or {}
        sent = sum(c.bytes_sent for name, c in counters.items() if not name.startswith("lo"))
        received = sum(c.bytes_recv for name, c in counters.items() if not name.startswith("lo"))
        previous, self._net = self._net, (now, sent, received)
        if previous is None or now <= previous[0]:
            return 1.0
        seconds = now - previous[0]
        rate = max(sent - previous[1], received - previous[2], 0) / seconds  # full duplex: the busier way
        return 1.0 - min(1.0, rate / self.network_bytes)

    def _gpu(self, cpu: float) -> float:
        if self.gpu_source == "cpu":
            return cpu  # virtual GPUs are the CPU
        if self.gpu_source != "nvml":
            return 1.0  # nothing to measure: no opinion
        from components.runtime.node import devices

        free = []
        for device in self.devices:
            if getattr(device, "virtual", True):
                continue
            sample = devices._sample_cuda(device)
            free.append(1.0 - min(100.0, float(sample.get("utilization", 0.0))) / 100.0)
        return sum(free) / len(free) if free else 1.0

    def sample(self, now: float | None = None) -> dict[str, float]:
        now = time.monotonic() if now is None else now
        cpu = 1.0 - min(100.0, self.psutil.cpu_percent(interval=None)) / 100.0
        memory = self.psutil.virtual_memory()
        values = {"cpu": cpu, "memory": memory.available / max(memory.total, 1), "network": self._network(now),
                  "gpu": self._gpu(cpu)}
        try:
            values["load"] = min(4.0, os.getloadavg()[0] / self.cpus)
        except OSError:
            values["load"] = 0.0
        return values


class AvailabilityService(NodeService):
    """The straggler plugin's node service: samples, forecasts and reports the node's availability (a thread
    of the node agent; see the module docstring)."""

    name = "availability"

    def __init__(self, node: NodeInfo | None = None, interval_s: float | None = None, horizon_s: float = 60.0,
                 fit_every_s: float = 30.0, forecast_every_s: float = 5.0, history: int = 600,
                 model: str = "ridge"):
        self.node = node or NodeInfo(name="node")
        self.interval_s = float(interval_s or os.environ.get(INTERVAL_ENV) or 1.0)
        self.fit_every_s = fit_every_s
        self.forecast_every_s = forecast_every_s
        self.predictor = AvailabilityPredictor(horizon_s=horizon_s, interval_s=self.interval_s, history=history,
                                               model=model)
        self.sampler: NodeSampler | None = None
        self.load = 0.0
        self._payload: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.errors = 0

    @classmethod
    def instances(cls, node: NodeInfo) -> list[AvailabilityService]:
        return [cls(node)]

    # -- the loop ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.stop(1.0)
        if self.sampler is None:
            self.sampler = NodeSampler(self.node.devices)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="straggler-availability",
                                        daemon=True)
        self._thread.start()

    def check(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.1, timeout))

    def _run(self, stop: threading.Event) -> None:
        last_fit = last_forecast = -math.inf
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.step(began, fit=began - last_fit >= self.fit_every_s,
                          forecast=began - last_forecast >= self.forecast_every_s)
                if began - last_fit >= self.fit_every_s:
                    last_fit = began
                if began - last_forecast >= self.forecast_every_s:
                    last_forecast = began
            except Exception as error:  # noqa: BLE001 - a bad sample costs one sample, never the service
                self.errors += 1
                log.warning("availability sample failed: %r", error)
            stop.wait(max(0.05, self.interval_s - (time.monotonic() - began)))

    def step(self, now: float, fit: bool = False, forecast: bool = True) -> None:
        """One sample (and a refit, a fresh forecast when asked): what the thread does every interval."""
        values = self.sampler.sample(now)
        self.load = values.pop("load", 0.0)
        with self._lock:
            self.predictor.observe(values)
            if fit and self.predictor.samples >= self.predictor.min_samples():
                self.predictor.fit()
            if forecast or self._payload is None:
                self._payload = self._build(self.predictor.predict())

    def _build(self, forecast: Forecast) -> dict[str, Any]:
        accuracy = self.predictor.accuracy()
        return {"time": time.time(), "predicted": _rounded(forecast.predicted), "std": _rounded(forecast.std),
                "current": _rounded(forecast.current),
                "accuracy": {"mae": _rounded(accuracy["mae"]), "naive_mae": _rounded(accuracy["naive_mae"]),
                             "n": accuracy["n"]},
                "horizon_s": self.predictor.horizon_s, "samples": self.predictor.samples,
                "model": forecast.model, "gpu_source": self.sampler.gpu_source if self.sampler else "none",
                "load": round(float(self.load), 4)}

    def report(self) -> dict[str, Any] | None:
        return self._payload


def _rounded(values: Mapping[str, float | None]) -> dict[str, float | None]:
    return {key: (None if value is None else round(float(value), 5)) for key, value in values.items()}
