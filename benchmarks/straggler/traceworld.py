"""A simulated world whose availability statistics come from published GPU-cluster studies, not from SAS's design.

The synthetic world of :mod:`benchmarks.straggler.simulator` (per-node sines, AR noise, bursts) was built by us,
and the issue that asked for this module called it "tuned to neither side" only in intent. This world is
instead built from what published traces report about shared GPU clusters, with every parameter's source
named beside it (``SOURCES``, also in the benchmark's JSON). No trace file is read (this machine has no
network access): the parameters are published *statistics*, several of them read off figures, and the ones no
paper states are marked **estimate**. The papers' figure, table and section numbers are cited from memory and
could not be re-checked here. ``docs/components/straggler.md`` lists the parameters as a table.

Three processes make a node's availability (CPU, GPU, network; 1 = free of outside load, 0 = gone):

1. **Co-located jobs.** Other tenants' jobs share the node (PAI shares GPUs between jobs and runs CPU-heavy
   tasks beside GPU ones; Philly places jobs on servers other jobs use). They arrive per node as a Poisson
   process whose rate follows the day (2.), last a heavy-tailed log-normal time, and each takes a share of the
   node's CPU and network and interferes with the GPU. A node's availability is one minus what its tenants
   use, with a little per-tick noise (the tenants' own usage varies).
2. **Diurnal load.** The tenants' arrival rate follows a 24-hour cycle, the same phase on every node (the users
   of a cluster share a working day), peaking in the afternoon.
3. **Spot preemptions.** Half of the nodes are spot instances, in three pools (instance type x zone) whose
   preemption rates differ by a factor of four from one to the next; a preemption event takes a quarter of a
   pool's live nodes at once ("bulky" preemptions), and a preempted node comes back (its replacement, in the
   same pool) after an exponential delay. A node that is gone has availability 0 on every resource; the
   simulator rolls a gang that loses a node back to its last checkpoint and queues it again.

Nothing here knows about SAS or about any placement policy.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np


class Config(Protocol):
    """What this module reads of the simulator's ``Config`` (not imported: the simulator imports this module)."""

    nodes: int
    tick_s: float
    seed: int

    @property
    def ticks(self) -> int: ...

HOUR = 3600.0

# Every parameter, with its source. "estimate" marks a value no paper states; the reason is given.
SOURCES: dict[str, dict[str, Any]] = {
    "tenant_work_median_s": {
        "value": 20 * 60.0,
        "source": "estimate, from the shape of the task/job duration CDFs: Weng et al., NSDI'22 (Alibaba PAI), "
                  "Fig. 3 (task durations from seconds to days, most under an hour) and Jeon et al., ATC'19 "
                  "(Philly), Fig. 2 (run times from minutes to weeks). Median read off the figures, not stated."},
    "tenant_work_sigma": {
        "value": 1.5,
        "source": "estimate: a log-normal sigma of 1.5 puts the 95th percentile at 12x the median, the heavy "
                  "tail both PAI (Weng et al., Fig. 3) and Philly (Jeon et al., Fig. 2) show."},
    "tenants_mean": {
        "value": 2.5,
        "source": "estimate: the mean number of other tasks on a node, from PAI's packing of several task "
                  "instances per machine (Weng et al., section 3: most instances request a fraction of a GPU "
                  "and a few CPU cores) and Philly's multi-tenant servers (Jeon et al., section 3). With the "
                  "shares below, the outside load takes about 40% of a node's CPU, which PAI names a potential "
                  "bottleneck (Weng et al., section 5)."},
    "tenant_cpu": {
        "value": (0.05, 0.30),
        "source": "estimate: PAI's tasks are often CPU-heavy and CPU is a potential bottleneck (Weng et al., "
                  "section 5); the share of a node's CPU one co-located task takes, uniform."},
    "tenant_network": {
        "value": (0.0, 0.25),
        "source": "estimate: the share of a node's network one co-located task takes, uniform (Philly: "
                  "distributed jobs spread over servers exchange gradients over the shared network, Jeon et "
                  "al., section 3)."},
    "tenant_gpu": {
        "value": (0.0, 0.10),
        "source": "estimate: interference on a worker's GPU from one co-located task. A gang's worker gets a "
                  "GPU of its own (Philly allocates whole GPUs, Jeon et al. section 2), so a co-located task "
                  "slows it only through the shared host, PCIe and memory bandwidth: a few percent, as the "
                  "lower utilization of Philly's jobs on shared servers suggests (Jeon et al., section 3)."},
    "usage_noise": {
        "value": 0.03,
        "source": "estimate: per-tick variation of a node's outside usage; PAI's released per-worker "
                  "mini-batch times (clusterdata, cluster-trace-gpu-v2020/mini-batch-time) show workers of one "
                  "job varying from iteration to iteration."},
    "diurnal_amplitude": {
        "value": 0.5,
        "source": "estimate, read off hourly submission plots: submissions peak in working hours at about 3x "
                  "the night-time trough (rate 1 +/- 0.5) in Hu et al., SC'21 (Helios, SenseTime), Fig. 3 and "
                  "in PAI (Weng et al., section 3)."},
    "diurnal_peak_hour": {
        "value": 15.0,
        "source": "estimate: the afternoon peak of the same plots."},
    "start_hour": {
        "value": 7.0,
        "source": "scenario: the simulation's clock starts at 07:00, so the jobs arrive over the morning ramp "
                  "(09:00-13:00 after the 2-hour warm-up)."},
    "spot_fraction": {
        "value": 0.5,
        "source": "scenario (estimate): half of the nodes are spot instances, as in the spot/on-demand mixes "
                  "of Wu et al., NSDI'24 (Can't Be Late) and Thorpe et al., NSDI'23 (Bamboo)."},
    "spot_mtbp_h": {
        "value": (3.0, 12.0, 48.0),
        "source": "estimate: the mean time between preemptions of one instance in three spot pools. Bamboo "
                  "(Thorpe et al., NSDI'23, section 2) measured frequent preemptions of p3 (V100) spot "
                  "instances on EC2 over a day; AWS's Spot Instance Advisor sorts pools into interruption "
                  "buckets (<5% ... >20% a month) that differ by 4x and more. The fastest pool is Bamboo's "
                  "regime, the slowest close to on-demand within a 10-hour run."},
    "spot_bulk": {
        "value": 0.25,
        "source": "estimate: the share of a pool's live nodes one preemption event takes. Bamboo (section 2) "
                  "reports preemptions arriving in bulk, many instances at once."},
    "spot_replace_s": {
        "value": 20 * 60.0,
        "source": "estimate: mean time until a preempted node's replacement is running. Can't Be Late (Wu et "
                  "al., section 2) shows spot capacity unavailable for minutes to hours; Bamboo needs minutes "
                  "to get a new instance."},
    "checkpoint_s": {
        "value": 30 * 60.0,
        "source": "estimate: a gang checkpoints every 30 minutes of work and loses what it did since, on "
                  "preemption (CheckFreq, Mohan et al., FAST'21, section 2: checkpoints are commonly taken per "
                  "epoch or at long fixed intervals)."},
    "restart_s": {
        "value": 120.0,
        "source": "estimate: time a gang spends restarting from its checkpoint."},
}


def spare_capacity() -> float:
    """The share of a node's CPU the co-located tasks leave on average (the resource PAI names a bottleneck):
    the simulator scales the job stream's offered load by it, so that ``Config.load`` means the same in both
    worlds: jobs ask for that share of what the world leaves them, and the cluster is not simply overloaded."""
    low, high = value("tenant_cpu")
    return 1.0 - float(value("tenants_mean")) * (float(low) + float(high)) / 2


def value(name: str) -> Any:
    return SOURCES[name]["value"]


def _diurnal(seconds: np.ndarray) -> np.ndarray:
    """The tenants' arrival-rate multiplier at ``seconds`` since the simulation began (mean 1)."""
    hour = float(value("start_hour")) + seconds / HOUR
    return 1.0 + float(value("diurnal_amplitude")) * np.cos(2 * np.pi * (hour - float(value("diurnal_peak_hour"))) / 24.0)


def spot_pools(config: Config) -> np.ndarray:
    """The spot pool of each node (-1: on-demand), seeded by ``config.seed``; the same for every policy."""
    rng = np.random.default_rng([config.seed, 7])
    pools = len(value("spot_mtbp_h"))
    spot = int(round(float(value("spot_fraction")) * config.nodes))
    assignment = np.full(config.nodes, -1, dtype=int)
    chosen = rng.permutation(config.nodes)[:spot]
    assignment[chosen] = np.arange(spot) % pools
    return assignment


def _tenants(config: Config, rng: np.random.Generator) -> np.ndarray:
    """Outside usage, nodes x ticks x resources (CPU, GPU, network), from the co-located tenants."""
    n, ticks, tick_s = config.nodes, config.ticks, config.tick_s
    usage = np.zeros((n, ticks, 3))
    median, sigma = float(value("tenant_work_median_s")), float(value("tenant_work_sigma"))
    mean_duration = median * math.exp(sigma ** 2 / 2)
    rate = float(value("tenants_mean")) / mean_duration  # per node and second, on average over the day
    lead = 48 * HOUR  # start the process two days early, so the first tick sees a steady state
    horizon = ticks * tick_s
    peak = rate * (1.0 + float(value("diurnal_amplitude")))
    cpu, gpu, net = value("tenant_cpu"), value("tenant_gpu"), value("tenant_network")
    for node in range(n):
        count = rng.poisson(peak * (horizon + lead))
        starts = np.sort(rng.uniform(-lead, horizon, count))
        starts = starts[rng.random(count) < _diurnal(starts) / (1.0 + float(value("diurnal_amplitude")))]
        durations = rng.lognormal(math.log(median), sigma, len(starts))
        shares = np.stack([rng.uniform(cpu[0], cpu[1], len(starts)), rng.uniform(gpu[0], gpu[1], len(starts)),
                           rng.uniform(net[0], net[1], len(starts))], axis=1)
        first = np.maximum(0, np.ceil(starts / tick_s)).astype(int)
        last = np.minimum(ticks, np.ceil((starts + durations) / tick_s)).astype(int)
        for a, b, share in zip(first, last, shares, strict=True):
            if b > a:
                usage[node, a:b] += share
    return usage


def _preemptions(config: Config, pools: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``down``, nodes x ticks: True while a node is preempted and not yet replaced."""
    n, ticks, tick_s = config.nodes, config.ticks, config.tick_s
    down = np.zeros((n, ticks), dtype=bool)
    bulk, replace_s = float(value("spot_bulk")), float(value("spot_replace_s"))
    for pool, mtbp_h in enumerate(value("spot_mtbp_h")):
        members = np.flatnonzero(pools == pool)
        if not len(members):
            continue
        # each node is hit at 1 / mtbp; an event hits a `bulk` share of the live nodes, so events come at
        # 1 / (mtbp x bulk) per pool
        event_p = tick_s / (float(mtbp_h) * HOUR * bulk)
        back = np.zeros(len(members), dtype=int)  # the tick at which each member is up again
        events = rng.random(ticks) < event_p
        hits = rng.random((ticks, len(members))) < bulk
        delays = rng.exponential(replace_s / tick_s, (ticks, len(members)))
        for tick in np.flatnonzero(events):
            live = back <= tick
            struck = live & hits[tick]
            back[struck] = tick + np.maximum(1, np.round(delays[tick, struck])).astype(int)
            for index in np.flatnonzero(struck):
                down[members[index], tick:back[index]] = True
    return down


def trace_world(config: Config) -> np.ndarray:
    """Availability, nodes x ticks x (cpu, gpu, network), seeded by ``config.seed``: 1 minus the co-located
    tenants' usage (with noise), clipped to [0.02, 1]; exactly 0 on every resource while a node is preempted."""
    rng = np.random.default_rng([config.seed, 3])
    usage = _tenants(config, rng)
    noise = rng.normal(0.0, float(value("usage_noise")), usage.shape)
    available = np.clip(1.0 - usage + noise * (usage > 0), 0.02, 1.0)
    down = _preemptions(config, spot_pools(config), rng)
    available[down] = 0.0
    return available


def parameters() -> dict[str, dict[str, Any]]:
    """Every parameter with its source (for the benchmark's JSON)."""
    return {name: {"value": list(entry["value"]) if isinstance(entry["value"], tuple) else entry["value"],
                   "source": entry["source"]} for name, entry in SOURCES.items()}
