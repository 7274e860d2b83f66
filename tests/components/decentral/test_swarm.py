"""Real hivemind swarms on 127.0.0.1: peers average (and agree), survive a crash, catch a newcomer up, drop
hostile updates, and refuse a peer without credentials. Each peer is its own process (LocalSwarm reaps them)."""

from __future__ import annotations

import time

# Imported once, here: LocalSwarm forks every peer from this process, so a peer starts without importing torch
# and hivemind again (as in a whole run, where earlier tests imported them), and a newcomer comes up sooner.
import hivemind  # noqa: F401
import pytest

import components.decentral.peer  # noqa: F401
from benchmarks.decentral.local import LocalSwarm

pytestmark = pytest.mark.timeout(600)

INITIAL_LOSS = 4.8  # the untrained tiny model's held-out loss (uniform over 96 characters: ln 96 = 4.56, plus)


def _shared_groups(results: dict[str, dict]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for result in results.values():
        for record in result["rounds"]:
            if record.get("ok") and len(record.get("members") or []) >= 2:
                groups.setdefault(record["group"], []).append(record["fingerprint"])
    return {group: prints for group, prints in groups.items() if len(prints) >= 2}


def _agree(prints: list[float]) -> bool:
    return max(prints) - min(prints) <= 1e-6 * max(1.0, abs(prints[0]))


def _join(swarm: LocalSwarm, *names: str, **options: dict) -> dict[str, dict]:
    """Start peers at once (``options[name]``: their start options), each bootstrapping from the peers already
    up, instead of one after the other; their start-up answers, by name."""
    for name in names:
        swarm.start(name, wait=False, **options.get(name, {}))
    return {name: swarm.wait_ready(name) for name in names}


def _start(swarm: LocalSwarm, first: str, *others: str, **options: dict) -> dict[str, dict]:
    """``first`` founds the swarm, then the others join it at once."""
    return {first: swarm.start(first), **_join(swarm, *others, **options)}


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    with LocalSwarm(tmp_path_factory.mktemp("clean"), {"steps": 200, "peers": {"min": 3, "max": 8}}) as swarm:
        for name, started in _start(swarm, "a", "b", "c").items():
            assert "error" not in started, (name, started)
        swarm.wait(400)
        yield {name: swarm.result(name) for name in ("a", "b", "c")}


def test_three_peers_average_agree_and_learn(clean_run):
    for name, result in clean_run.items():
        assert result and "error" not in result, (name, result)
        assert result["steps"] == 200
        # Every peer joined several averaging rounds, and "could not find a group" did not pass for training:
        # most of its rounds succeeded.
        assert result["rounds_ok"] >= 3, (name, result["rounds"])
        assert result["rounds_ok"] >= 0.8 * (result["rounds_ok"] + result["rounds_failed"]), result["rounds"]
        assert result["test_loss"] < 3.0, (name, result["test_loss"])
        assert {peer["name"] for peer in result["view"]} >= {"a", "b", "c"} - {name} or len(result["view"]) >= 2
    groups = _shared_groups(clean_run)
    assert len(groups) >= 3, groups
    agreeing = [group for group, prints in groups.items() if _agree(prints)]
    # After a complete round every member holds the same average (a round whose reducer timed out keeps some
    # local slices, so a few may differ).
    assert len(agreeing) >= max(3, int(0.75 * len(groups))), groups
    assert any(len(prints) == 3 for group, prints in groups.items() if group in agreeing)


def test_a_peer_without_credentials_cannot_join_and_a_hostile_peer_is_dropped_and_reported(tmp_path, clean_run):
    """One swarm for both: while its founder waits for the others (nobody trains before four peers are there), a
    peer without credentials tries to join it and is refused; then the others, a hostile one among them, join."""
    with LocalSwarm(tmp_path, {"steps": 200, "peers": {"min": 4, "max": 8}}) as swarm:
        founder = swarm.start("a")
        intruder = swarm.start("intruder", credentialed=False)
        # The same bootstrap peer, still up, takes credentialed peers.
        members = {"a": founder, **_join(swarm, "b", "c", "evil", evil={"corrupt": {"mode": "nan"}})}
        assert swarm.processes["a"].is_alive()
        swarm.wait(400)
        results = {name: swarm.result(name) for name in ("a", "b", "c")}
    assert all("error" not in member for member in members.values()), members
    assert "error" in intruder, intruder
    # libp2p connected (the address was right), but no peer answered its DHT requests: its token was refused.
    assert "none of the initial_peers responded" in intruder["error"], intruder

    evil = swarm.info.get("evil", {}).get("p2p") if swarm.info.get("evil") else None
    rejections = [rejection for result in results.values() for rejection in result["rejections"]]
    assert rejections, "no honest peer dropped anything"
    assert all("non-finite" in rejection["problem"] for rejection in rejections)
    assert {rejection["name"] for rejection in rejections} == {"evil"} or (
        evil and {rejection["peer"] for rejection in rejections} == {evil})
    honest = [result["test_loss"] for result in results.values()]
    clean = [result["test_loss"] for result in clean_run.values()]
    assert all(loss == loss for loss in honest)  # no NaN reached an honest peer
    assert sum(honest) / len(honest) <= 1.05 * sum(clean) / len(clean), (honest, clean)


def test_a_crash_leaves_the_swarm_training_and_a_newcomer_catches_up(tmp_path):
    with LocalSwarm(tmp_path, {"steps": 600, "peers": {"min": 3, "max": 8}}) as swarm:
        _start(swarm, "a", "b", "c")
        # The three train as soon as they see each other; c crashes a moment later. Not much later: the newcomer
        # must come up (seconds; more on a loaded machine, where it once joined at step 221 of 300 and found no
        # round before a and b were done) and average with a and b before their 600 steps are done.
        time.sleep(3)
        swarm.kill("c")  # a crash: SIGKILL, no goodbye
        swarm.start("late")  # bootstraps from a and b, downloads their parameters
        swarm.wait(400)
        results = {name: swarm.result(name) for name in ("a", "b", "late")}
    assert swarm.result("c") is None  # it never got to write a summary
    for name in ("a", "b"):
        result = results[name]
        assert result["steps"] == 600
        after_crash = [record for record in result["rounds"] if record.get("ok") and "c" not in record["members"]]
        assert len(after_crash) >= 2, result["rounds"]  # rounds went on without the dead peer
        assert result["test_loss"] < 3.0
    late = results["late"]
    assert late["downloaded"] is not None
    assert any(record.get("ok") for record in late["rounds"])
    assert late["test_loss"] < 3.0


def test_a_process_killed_holding_hivemind_locks_does_not_stall_later_peers(tmp_path):
    """hivemind's MPFuture locks are shared by every process forked from the one that imported hivemind; a peer
    SIGKILLed while holding one left every later DHT of this test process waiting for ever (seen in CI: three tests
    in a row). Each local peer now takes locks of its own."""
    import multiprocessing as mp
    import os
    import signal

    from hivemind.utils.mpfuture import MPFuture

    context = mp.get_context("fork")
    held = context.Event()

    def hold() -> None:
        MPFuture._update_lock.acquire()
        held.set()
        time.sleep(600)

    holder = context.Process(target=hold, daemon=True)
    holder.start()
    try:
        assert held.wait(60)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
        assert not MPFuture._update_lock.acquire(timeout=0.1)  # the family's lock stays held by the dead process
        with LocalSwarm(tmp_path, {"steps": 5, "peers": {"min": 1, "max": 2}}) as swarm:
            info = swarm.start("a", timeout=120)
            assert "error" not in info and info["maddrs"], info
    finally:
        MPFuture.reset_backend()  # this test process's own locks would stay held
