"""The distributed-training seam (components.runtime.contract.distributed): the ``spec.distributed`` check, defaults,
fault injection (Slowdown, Link), strategy runtimes, and the gang collectives and rendezvous across two real
gloo processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

from components.runtime.contract import distributed
from components.runtime.contract.context import LocalContext
from components.runtime.contract.distributed import (
    Link,
    Slowdown,
    Strategy,
    StrategyRuntime,
    distributed_errors,
    normalize,
    open_runtime,
    ring_allreduce_bytes,
    slow_errors,
)
from components.runtime.contract.plugins import Plugin
from components.runtime.node.gang import Gang

ROOT = Path(__file__).resolve().parents[3]
P = "spec.distributed"


# -- the spec check -----------------------------------------------------------------------------------------------
def test_absent_is_fine_and_a_non_object_is_one_error():
    assert distributed_errors(None) == {}
    assert set(distributed_errors("ddp")) == {P}
    assert set(distributed_errors([{"strategy": "ddp"}])) == {P}
    assert distributed_errors({}) == {}  # ddp with its defaults
    assert distributed_errors({"strategy": "ddp"}) == {}
    assert distributed_errors({"strategy": "post-local-sgd", "period": 8, "warmup": 10, "backend": "gloo",
                               "timeout_s": 30, "bandwidth_mbit": 100,
                               "slow": {"ranks": [1], "factor": 3, "mode": "cpu"}}) == {}


def test_every_bad_field_is_named_at_once():
    errors = distributed_errors({
        "strategy": "nope", "period": 4, "backend": "mpi", "timeout_s": 0, "bandwidth_mbit": -1,
        "slow": {"ranks": [], "random": 2, "factor": 0.5, "duration": 0, "mode": "fast", "seed": -1, "odd": 1},
    })
    assert set(errors) == {
        f"{P}.strategy", f"{P}.period", f"{P}.backend", f"{P}.timeout_s", f"{P}.bandwidth_mbit",
        f"{P}.slow.ranks", f"{P}.slow.random", f"{P}.slow.factor", f"{P}.slow.duration", f"{P}.slow.mode",
        f"{P}.slow.seed", f"{P}.slow.odd",
    }
    assert "ddp" in errors[f"{P}.strategy"] and "post-local-sgd" in errors[f"{P}.strategy"]
    assert errors[f"{P}.period"] == "unknown option"  # no strategy to own it
    assert errors[f"{P}.slow.odd"] == "unknown option"


@pytest.mark.parametrize(("value", "field"), [
    ({"strategy": 3}, "strategy"),
    ({"strategy": None}, "strategy"),
    ({"timeout_s": 3601}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"timeout_s": "60"}, "timeout_s"),
    ({"timeout_s": float("nan")}, "timeout_s"),
    ({"bandwidth_mbit": 0.01}, "bandwidth_mbit"),
    ({"bandwidth_mbit": float("inf")}, "bandwidth_mbit"),
    ({"backend": ["gloo"]}, "backend"),
    ({"slow": "rank 1"}, "slow"),
    ({"slow": {}}, "slow"),  # neither ranks nor random
    ({"slow": {"factor": 2}}, "slow"),
    ({"slow": {"ranks": [True]}}, "slow.ranks"),
    ({"slow": {"ranks": [-1]}}, "slow.ranks"),
    ({"slow": {"ranks": 1}}, "slow.ranks"),
    ({"slow": {"ranks": [1], "factor": 101}}, "slow.factor"),
    ({"slow": {"ranks": [1], "duration": 2.5}}, "slow.duration"),
    ({"slow": {"random": 0}}, "slow.random"),
    ({"slow": {"random": 0.1, "seed": 2**32}}, "slow.seed"),
    ({"strategy": "ddp", "period": 4}, "period"),  # post-local-sgd's option, not ddp's
])
def test_one_bad_field(value, field):
    errors = distributed_errors(value)
    assert set(errors) == {f"{P}.{field}" if field else P}, errors


def test_unknown_options_name_the_strategy():
    errors = distributed_errors({"strategy": "ddp", "period": 4, "buckets": 1})
    assert errors == {f"{P}.buckets": "unknown option of ddp", f"{P}.period": "unknown option of ddp"}


def test_a_strategys_own_checks_appear_under_its_options():
    assert set(distributed_errors({"strategy": "ddp", "bucket_mb": 0})) == {f"{P}.bucket_mb"}
    errors = distributed_errors({"strategy": "post-local-sgd", "period": 0, "warmup": -1, "backend": "x"})
    assert set(errors) == {f"{P}.period", f"{P}.warmup", f"{P}.backend"}
    assert "whole number" in errors[f"{P}.period"]
    assert set(distributed_errors({"strategy": "ddp"}, prefix="spec.trial.distributed")) == set()
    assert set(distributed_errors({"strategy": "ddp", "bucket_mb": 0}, prefix="x")) == {"x.bucket_mb"}


def test_slow_errors_take_a_prefix():
    assert slow_errors(None, "p") == {}
    assert slow_errors({"ranks": [0, 3], "factor": 1, "duration": 1, "mode": "sleep", "seed": 0}, "p") == {}
    assert set(slow_errors({"random": 1.0, "factor": 100.5}, "p")) == {"p.factor"}


class Picky(Strategy):
    name: ClassVar[str] = "picky"
    options: ClassVar[frozenset[str]] = frozenset({"level"})
    runtime: ClassVar[str] = f"{__name__}:EchoRuntime"

    def validate(self, options):
        if options.get("level") == "crash":
            raise RuntimeError("cannot read the level")
        if "level" in options and not isinstance(options["level"], int):
            return {"level": "must be an integer"}
        return {}

    def defaults(self, options):
        return {"level": int(options.get("level", 1))}


class EchoRuntime(StrategyRuntime):
    plugin: ClassVar[str | None] = "pickies"

    def train_step(self, workload, batch):
        return {"loss": 0.0}


class NotARuntimeStrategy(Strategy):
    name: ClassVar[str] = "not-a-runtime"
    runtime: ClassVar[str] = f"{__name__}:Picky"


PICKIES = Plugin(name="pickies", strategies=(f"{__name__}:Picky", f"{__name__}:NotARuntimeStrategy"))


def test_a_raising_validate_is_an_error_not_an_exception(install_plugins):
    install_plugins(f"{__name__}:PICKIES")
    assert distributed_errors({"strategy": "picky", "level": 3}) == {}
    assert distributed_errors({"strategy": "picky", "level": "high"}) == {f"{P}.level": "must be an integer"}
    errors = distributed_errors({"strategy": "picky", "level": "crash", "timeout_s": 0})
    assert set(errors) == {f"{P}.strategy", f"{P}.timeout_s"}
    assert "picky could not check its options: cannot read the level" in errors[f"{P}.strategy"]
    assert normalize({"strategy": "picky"}) == {"strategy": "picky", "backend": "auto", "timeout_s": 120.0,
                                                 "level": 1}


# -- defaults ------------------------------------------------------------------------------------------------------
def test_normalize_fills_the_defaults():
    assert normalize(None) is None
    assert normalize({}) == {"strategy": "ddp", "backend": "auto", "timeout_s": 120.0, "bucket_mb": 25.0}
    assert normalize({"strategy": "post-local-sgd", "timeout_s": 30, "backend": "gloo"}) == {
        "strategy": "post-local-sgd", "backend": "gloo", "timeout_s": 30.0, "period": 4, "warmup": 0}
    full = normalize({"strategy": "ddp", "bucket_mb": 4, "bandwidth_mbit": 100, "slow": {"ranks": [1]}})
    assert full == {"strategy": "ddp", "backend": "auto", "timeout_s": 120.0, "bucket_mb": 4.0,
                    "bandwidth_mbit": 100.0, "slow": {"ranks": [1]}}
    # The stored value is checked again on the node (the kind's validate): it must pass and stay the same.
    assert distributed_errors(full) == {}
    assert normalize(full) == full


def test_the_registry_lists_the_built_in_strategies():
    found = distributed.strategies()
    assert {"ddp", "post-local-sgd"} <= set(found)
    assert found["ddp"].runtime == "components.train.parallel:DDPRuntime"
    assert found["post-local-sgd"].min_workers == 2
    assert all(isinstance(strategy, Strategy) for strategy in found.values())


# -- strategy runtimes --------------------------------------------------------------------------------------------
def gang(world_size: int = 1, rank: int = 0) -> Gang:
    return Gang(rank=rank, world_size=world_size, backend="gloo", device="cpu", address="127.0.0.1:1")


def ctx(tmp_path, **kwargs) -> LocalContext:
    return LocalContext(job_id="j", attempt_id="a", spec={}, workdir=tmp_path, **kwargs)


def test_open_runtime_refuses_unknown_strategies_and_too_few_workers(tmp_path, install_plugins):
    with pytest.raises(ValueError, match="no installed strategy is called 'nope'"):
        open_runtime(ctx(tmp_path), {"strategy": "nope"}, gang(2))
    with pytest.raises(ValueError, match="post-local-sgd needs at least 2 workers; this job has 1"):
        open_runtime(ctx(tmp_path), {"strategy": "post-local-sgd"}, gang(1))
    install_plugins(f"{__name__}:PICKIES")
    with pytest.raises(TypeError, match="is not a StrategyRuntime"):
        open_runtime(ctx(tmp_path), {"strategy": "not-a-runtime"}, gang(2))
    runtime = open_runtime(ctx(tmp_path), {"strategy": "picky", "slow": {"ranks": [1], "factor": 3}}, gang(2, 1))
    assert isinstance(runtime, EchoRuntime) and (runtime.rank, runtime.world_size) == (1, 2)
    assert runtime.slowdown.enabled and runtime.slowdown.factor == 3 and runtime.link.mbit is None


class Batches:
    """A workload stand-in: batch ``i`` of any epoch is ``(epoch, i)``."""

    def __init__(self, steps: int):
        self.steps = steps

    def steps_per_epoch(self) -> int:
        return self.steps

    def batch(self, epoch, index):
        return (epoch, index)


def test_each_rank_takes_its_own_batches_and_reports_its_step_times(tmp_path):
    rank0 = EchoRuntime(ctx(tmp_path), {}, gang(2, 0))
    rank1 = EchoRuntime(ctx(tmp_path), {}, gang(2, 1))
    workload = Batches(7)
    assert rank0.steps_per_epoch(7) == 3 and rank0.steps_per_epoch(1) == 1  # the 7th batch is dropped
    assert [rank0.batch(workload, 2, i) for i in range(3)] == [(2, 0), (2, 2), (2, 4)]
    assert [rank1.batch(workload, 2, i) for i in range(3)] == [(2, 1), (2, 3), (2, 5)]
    assert rank1.rank_metrics() == {}
    rank1.record_step(10)
    rank1.record_step(20)
    assert rank1.rank_metrics() == {"step_ms": 15.0}
    assert rank1.rank_metrics() == {}  # since the last call only
    slowed = EchoRuntime(ctx(tmp_path), {"slow": {"ranks": [1]}}, gang(2, 1))
    slowed.slowdown.advance()
    assert slowed.rank_metrics() == {"slowed_steps": 1.0}
    assert slowed.report() is None and slowed.state_dict() == {}
    slowed.close()


# -- fault injection ----------------------------------------------------------------------------------------------
def steps(slowdown: Slowdown, n: int) -> list[bool]:
    return [slowdown.advance() for _ in range(n)]


def test_named_ranks_are_slow_on_every_step_and_the_others_never():
    assert steps(Slowdown({"ranks": [1, 3]}, rank=1, world_size=4), 50) == [True] * 50
    assert steps(Slowdown({"ranks": [1, 3]}, rank=2, world_size=4), 50) == [False] * 50
    off = Slowdown(None, rank=1)
    assert not off.enabled and steps(off, 5) == [False] * 5 and off.delay(100) == 0.0
    slow = Slowdown({"ranks": [0]}, rank=0)
    steps(slow, 7)
    assert slow.slowed_steps == 7 and slow.step == 6


def runs(flags: list[bool]) -> list[int]:
    """Lengths of the runs of slow steps, the last one left out (it may be cut short)."""
    found, length = [], 0
    for flag in flags:
        if flag:
            length += 1
        elif length:
            found.append(length)
            length = 0
    return found


def test_random_episodes_are_reproducible_and_last_their_duration():
    options = {"random": 0.05, "duration": 7, "seed": 11}
    first = steps(Slowdown(options, rank=1, world_size=4), 2000)
    assert first == steps(Slowdown(options, rank=1, world_size=4), 2000)  # the same run again
    assert first != steps(Slowdown({**options, "seed": 12}, rank=1, world_size=4), 2000)
    assert first != steps(Slowdown(options, rank=2, world_size=4), 2000)  # each rank its own episodes
    episodes = runs(first)
    assert len(episodes) >= 5, episodes
    # An episode lasts ``duration`` steps; one that ends may be followed at once by the next.
    assert all(length % 7 == 0 for length in episodes), episodes
    assert 0.1 < sum(first) / len(first) < 0.5
    assert steps(Slowdown({"random": 1.0, "duration": 3}, rank=0), 10) == [True] * 10


def test_delay_sleeps_factor_minus_one_times_the_measured_work(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(distributed.time, "sleep", slept.append)
    slow = Slowdown({"ranks": [1], "factor": 3}, rank=1)
    assert slow.advance() is True
    assert slow.delay(8) == 0.0  # nothing measured yet
    slow.observe(0.02, 10)  # 2 ms of CPU per sample
    assert slow.per_sample == pytest.approx(0.002)
    assert slow.delay(5) == pytest.approx((3 - 1) * 0.002 * 5)
    assert slept == [pytest.approx(0.02)] and slow.slept == pytest.approx(0.02)
    slow.observe(0.04, 10)  # an exponential moving average: 0.8 old + 0.2 new
    assert slow.per_sample == pytest.approx(0.8 * 0.002 + 0.2 * 0.004)
    slow.observe(0.0, 10)
    slow.observe(1.0, 0)  # nothing to learn from either
    assert slow.per_sample == pytest.approx(0.0024)
    assert slow.delay(0) == 0.0 and slow.delay(-3) == 0.0
    fast = Slowdown({"ranks": [1], "factor": 3}, rank=0)
    fast.observe(0.02, 10)
    fast.advance()
    assert fast.delay(5) == 0.0
    assert len(slept) == 1


def burner_of(slowdown: Slowdown) -> psutil.Process | None:
    return psutil.Process(slowdown._burner.pid) if slowdown._burner is not None else None


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_cpu_mode_runs_a_burner_only_while_slow():
    slow = Slowdown({"ranks": [0], "mode": "cpu"}, rank=0)
    try:
        assert slow.advance() is True
        burner = burner_of(slow)
        assert burner is not None and burner.is_running() and burner.ppid() == os.getpid()
        assert slow.delay(100) == 0.0  # cpu mode contends instead of sleeping
        slow.advance()
        assert burner_of(slow).pid == burner.pid  # one burner for the whole slow spell
    finally:
        slow.close()
    assert slow._burner is None
    assert not psutil.pid_exists(burner.pid) or gone(burner)
    with pytest.raises(psutil.NoSuchProcess):  # reaped, not left a zombie
        psutil.Process(burner.pid).status()
    slow.close()  # twice is fine


def test_cpu_mode_stops_the_burner_when_an_episode_ends():
    # Seed 0, rank 0, chance 0.5, one-step episodes: the first steps are slow, then not, then slow...
    slow = Slowdown({"random": 0.5, "duration": 1, "mode": "cpu", "seed": 0}, rank=0)
    try:
        seen: list[tuple[bool, bool]] = []
        burners = []
        for _ in range(12):
            flag = slow.advance()
            seen.append((flag, slow._burner is not None))
            if slow._burner is not None:
                burners.append(burner_of(slow))
        assert all(flag == running for flag, running in seen), seen
        assert any(flag for flag, _ in seen) and not all(flag for flag, _ in seen), seen
    finally:
        slow.close()
    assert all(gone(process) for process in burners)


def test_link_counts_bytes_and_charges_the_time_they_take(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(distributed.time, "sleep", slept.append)
    free = Link(None)
    assert free.send(1_000_000) == 0.0 and free.bytes == 1_000_000 and free.seconds == 0.0
    link = Link(8)  # 8 Mbit/s: one megabyte a second
    assert link.send(1_000_000) == pytest.approx(1.0)
    assert link.send(250_000) == pytest.approx(0.25)
    assert link.send(0) == 0.0
    assert link.bytes == 1_250_000 and link.seconds == pytest.approx(1.25)
    assert slept == [pytest.approx(1.0), pytest.approx(0.25)]


def test_ring_allreduce_bytes():
    assert ring_allreduce_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1000, 0) == 0
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 4) == 1500
    assert ring_allreduce_bytes(4_000_000, 8) == 7_000_000


# -- two real ranks ------------------------------------------------------------------------------------------------
RANK = r"""
import json, sys
import torch
torch.set_num_threads(1)
from components.runtime.node.gang import Gang, init_gang
mode, rank, world, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
logs = []
if mode == "store":  # a process group made by hand: tests Gang alone
    import datetime
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=90)
    store = dist.TCPStore("127.0.0.1", int(where), world, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    gang = Gang(rank=rank, world_size=world, backend="gloo", device="cpu", address=f"127.0.0.1:{where}")
else:  # init_gang through LocalContexts sharing one workdir
    from components.runtime.contract.context import LocalContext
    ctx = LocalContext(job_id="j", attempt_id="a1", spec={}, rank=rank, world_size=world, workdir=where)
    gang = init_gang(ctx, {"timeout_s": 90, "backend": "auto"})
    logs = [message for _, _, message in ctx.logs]
answers = [gang.any(rank == 1), gang.any(False), gang.any(rank == 0), gang.any(True)]
gang.close()
import torch.distributed as dist
print(json.dumps({"rank": gang.rank, "world_size": gang.world_size, "backend": gang.backend,
                  "address": gang.address, "any": answers, "closed": not dist.is_initialized(), "logs": logs}))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_ranks(mode: str, where: str, world: int = 2, timeout: float = 150.0) -> list[dict[str, Any]]:
    env = {**os.environ, "STRATA_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    children = [subprocess.Popen([sys.executable, "-c", RANK, mode, str(rank), str(world), where], cwd=ROOT,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for rank in range(world)]
    results = []
    try:
        for child in children:
            out, err = child.communicate(timeout=timeout)
            assert child.returncode == 0, f"rank exited {child.returncode}:\n{err[-3000:]}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)
    return results


def test_gang_any_is_true_on_every_rank_when_true_on_one():
    results = two_ranks("store", str(free_port()))
    assert [result["rank"] for result in results] == [0, 1]
    for result in results:
        assert result["any"] == [True, False, True, True], result
        assert result["closed"] and result["world_size"] == 2


def test_init_gang_meets_through_the_shared_workdir(tmp_path):
    results = two_ranks("context", str(tmp_path))
    rank0, rank1 = results
    published = json.loads((tmp_path / "rendezvous.json").read_text())
    assert published["attempt"] == "a1" and published["address"].startswith("127.0.0.1:")
    assert rank0["address"] == rank1["address"] == published["address"]
    assert rank0["backend"] == rank1["backend"] == "gloo"  # auto on the CPU
    assert rank0["any"] == rank1["any"] == [True, False, True, True]
    assert rank1["logs"] == [f"rank 1/2 joined the gloo group at {published['address']}"]
    assert not list(tmp_path.glob("rendezvous*.tmp"))


def test_a_local_rank_waits_for_its_own_attempt(tmp_path):
    # Rank 0 of another attempt published here earlier: rank 1 of this one does not take that address.
    earlier = LocalContext(job_id="j", attempt_id="a0", spec={}, rank=0, world_size=2, workdir=tmp_path)
    assert earlier.gang.publish(4242) == "127.0.0.1:4242"
    rank1 = LocalContext(job_id="j", attempt_id="a1", spec={}, rank=1, world_size=2, workdir=tmp_path)
    with pytest.raises(TimeoutError, match="did not publish"):
        rank1.gang.address(timeout=0.2)
    rank0 = LocalContext(job_id="j", attempt_id="a1", spec={}, rank=0, world_size=2, workdir=tmp_path)
    assert rank0.gang.node_address() == "127.0.0.1"
    address = rank0.gang.publish(5151)
    assert rank1.gang.address(timeout=1) == address == "127.0.0.1:5151"


def test_the_base_context_has_no_rendezvous(tmp_path):
    from components.runtime.contract.context import Rendezvous

    gang = Rendezvous(ctx(tmp_path))  # what a context without the part answers
    assert gang.node_address() is None and gang.nodes() == []
    with pytest.raises(NotImplementedError):
        gang.publish(1)
    with pytest.raises(NotImplementedError):
        gang.address(0.1)

