"""Byzantine peers on 127.0.0.1 against the plugin's guarded averaging and its DHT records (reliability.md case 14).

Real hivemind processes (DHT nodes and averagers, reaped at the end), tiny tensors, a few rounds: a peer that sends
NaN, ×1e6 values or a huge weight, and that also reduces its slice of the vector dishonestly (its own guard is
blind), never gets anything non-finite or out of scale into an honest peer's values; a DHT member cannot
overwrite another peer's signed progress record, nor slip a forged copy of it into the swarm's view. (Peers
without credentials are refused by test_swarm.py; whole-run loss against a clean run is checked there too.)"""

from __future__ import annotations

import dataclasses
import time
import types

import hivemind
import pytest
import torch
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from components.decentral.averaging import UpdateGuard, swarm_averager_class
from components.decentral.peer import SwarmPeer

pytestmark = pytest.mark.timeout(300)

SIZE = 3000  # values per peer, in parts of 250 (PART_BYTES): every one of the three reduces a slice of 1000
PART_BYTES = 1000
HOST = ["/ip4/127.0.0.1/tcp/0"]


class BlindGuard(UpdateGuard):
    """A Byzantine peer's guard: accepts everything, so its own reducer sends poisoned averages back."""

    def check(self, part, reference):
        return None


def start_dhts(count, validators=None):
    first = hivemind.DHT(start=True, host_maddrs=HOST, use_relay=False, use_auto_relay=False,
                         record_validators=[validators[0]] if validators else ())
    maddrs = [str(addr) for addr in first.get_visible_maddrs()]
    others = [hivemind.DHT(start=True, host_maddrs=HOST, initial_peers=maddrs, use_relay=False, use_auto_relay=False,
                           record_validators=[validators[index]] if validators else ())
              for index in range(1, count)]
    return [first, *others]


@pytest.fixture(scope="module")
def averagers():
    """Two honest guarded averagers and a Byzantine one, in one swarm."""
    dhts = start_dhts(3)
    averager_class = swarm_averager_class()
    made = []
    try:
        for dht, guard in zip(dhts, (UpdateGuard(10.0), UpdateGuard(10.0), BlindGuard()), strict=True):
            made.append(averager_class([torch.zeros(SIZE)], dht, guard=guard, prefix="hostile", start=True,
                                       target_group_size=3, min_group_size=3, min_matchmaking_time=1.0,
                                       request_timeout=2.0, allreduce_timeout=20.0, part_size_bytes=PART_BYTES))
        yield made
    finally:
        for averager in made:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()
        for process in [*made, *dhts]:
            process.join(10)
            assert not process.is_alive()


def run_round(averagers, values, weights=(1.0, 1.0, 1.0), drops=True):
    """One all-reduce of the three with these values; each honest peer's resulting values and what it dropped."""
    for averager, value in zip(averagers, values, strict=True):
        with averager.get_tensors() as tensors:
            tensors[0].copy_(value)
    scheduled = get_dht_time() + 1.5
    controls = [averager.step(wait=False, timeout=30, weight=weight, scheduled_time=scheduled)
                for averager, weight in zip(averagers, weights, strict=True)]
    for control in controls[:2]:
        assert control.result(timeout=60), "the honest peers did not average"
    try:
        controls[2].result(timeout=60)
    except Exception:  # noqa: BLE001 - the Byzantine peer is banned from the round: whatever it gets is its own
        pass
    results = []
    for averager in averagers[:2]:
        with averager.get_tensors() as tensors:
            results.append(tensors[0].clone())
    dropped = [[], []]  # drained until some came and nothing new for 1 s (they come through a queue)
    deadline, quiet_since = time.monotonic() + (10 if drops else 1), time.monotonic()
    while time.monotonic() < deadline and (not any(dropped) or time.monotonic() - quiet_since < 1.0):
        for index, averager in enumerate(averagers[:2]):
            fresh = averager.drain_rejections()
            if fresh:
                dropped[index] += fresh
                quiet_since = time.monotonic()
        time.sleep(0.05)
    return results, dropped


def honest_values(seed):
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(SIZE, generator=torch.Generator().manual_seed(0))
    return base + 0.01 * torch.randn(SIZE, generator=generator)


@pytest.mark.parametrize("attack", ["nan", "inf", "scaled_1e6"])
def test_a_byzantine_peers_values_never_reach_honest_peers(averagers, attack):
    a, b = honest_values(1), honest_values(2)
    evil = {"nan": torch.full((SIZE,), float("nan")), "inf": torch.full((SIZE,), float("inf")),
            "scaled_1e6": 1e6 * honest_values(3)}[attack]
    started = time.monotonic()
    (after_a, after_b), (dropped_a, dropped_b) = run_round(averagers, [a, b, evil])
    seconds = time.monotonic() - started
    evil_id = averagers[2].peer_id.to_base58()
    for after, before in ((after_a, a), (after_b, b)):
        assert torch.isfinite(after).all()
        # Every value is its own, or the honest pair's mean: inside the honest range, nothing of the attacker's.
        low, high = torch.minimum(a, b), torch.maximum(a, b)
        assert bool(((after >= low - 1e-5) & (after <= high + 1e-5)).all()), (after - before).abs().max()
    # Dropped and reported, with the attacker's id: the parts it sent to an honest reducer (sender), or its own
    # slice's answer (reducer). Which honest peer sees what depends on timing: once one of them bans the attacker,
    # the attacker's round fails and the other may simply get nothing more from it (and keeps its own values).
    dropped = dropped_a + dropped_b
    assert dropped and {item["peer"] for item in dropped} == {evil_id}, dropped
    problem = "non-finite" if attack in ("nan", "inf") else "out of scale"
    assert all(problem in item["problem"] for item in dropped), dropped
    assert "sender" in {item["role"] for item in dropped} <= {"sender", "reducer"}, dropped
    mean = (a + b) / 2
    averaged = torch.isclose(after_a, mean, atol=1e-5) & torch.isclose(after_b, mean, atol=1e-5)
    assert int(averaged.sum()) >= SIZE // 3, int(averaged.sum())  # at least an honest reducer's slice averaged
    print(f"{attack}: round in {seconds:.2f} s; honest peers averaged {int(averaged.sum())} of {SIZE} values, kept "
          f"their own for the attacker's slice; dropped {[(d['role'], d['problem']) for d in dropped]}")


def test_a_huge_weight_is_clamped_to_one(averagers):
    a, b, c = honest_values(4), honest_values(5), honest_values(6)
    (after_a, after_b), _ = run_round(averagers, [a, b, c], weights=(1.0, 1.0, 1e6), drops=False)
    # An honest-looking update with weight 1e6 would all but replace the average; clamped, it counts as one peer.
    honest_slices = torch.isclose(after_a, (a + b + c) / 3, atol=1e-5)
    assert int(honest_slices.sum()) >= SIZE // 2  # three honest-looking peers: every slice averaged
    assert float((after_a - (a + 1e6 * c) / (1 + 1e6)).abs().max()) > 1e-3


def test_forged_overwritten_and_replayed_progress_records_are_refused():
    alice_key, mallory_key = RSAPrivateKey(), RSAPrivateKey()
    alice_v, mallory_v = RSASignatureValidator(alice_key), RSASignatureValidator(mallory_key)
    alice, mallory = start_dhts(2, [alice_v, mallory_v])
    try:
        key = "job_progress"
        record = {"name": "alice", "p2p": "QmAlice", "credential": "signed-by-the-control-plane", "step": 10,
                  "time": time.time()}
        assert alice.store(key, subkey=alice_v.local_public_key, value=record, expiration_time=get_dht_time() + 30)
        forged = dict(record, step=10**9, loss=0.0)
        # Mallory writes under alice's owner-signed subkey: refused (RSASignatureValidator, every node checks).
        assert not mallory.store(key, subkey=alice_v.local_public_key, value=forged,
                                 expiration_time=get_dht_time() + 60)
        # ... and a copy of alice's record (her credential included) under a subkey of its own choosing, and junk:
        # stored, but not part of the swarm's view, which takes owner-signed records only.
        assert mallory.store(key, subkey="alice-copy", value=forged, expiration_time=get_dht_time() + 60)
        assert mallory.store(key, subkey=mallory_v.local_public_key, value=b"\0" * 4096,
                             expiration_time=get_dht_time() + 60)
        for dht in (alice, mallory):
            found = dht.get(key, latest=True).value
            assert found[alice_v.local_public_key].value["step"] == 10
        peer = types.SimpleNamespace(dht=mallory, progress_key=key, check=lambda credential, subject: None)
        view = SwarmPeer._read_view(peer)
        assert [(item["name"], item["step"]) for item in view] == [("alice", 10)], view
        # A replayed signed record cannot be given a new life: the signature covers the expiration time.
        old = DHTRecord(key=b"k", subkey=alice_v.local_public_key, value=b"v", expiration_time=get_dht_time() + 5)
        signed = dataclasses.replace(old, value=alice_v.sign_value(old))
        assert alice_v.validate(signed) and mallory_v.validate(signed)
        assert not mallory_v.validate(dataclasses.replace(signed, expiration_time=signed.expiration_time + 3600))
        assert not mallory_v.validate(dataclasses.replace(signed, subkey=mallory_v.local_public_key))
        # ... nor replace a newer one: the DHT keeps the record with the latest expiration.
        assert alice.store(key, subkey=alice_v.local_public_key, value=dict(record, step=11),
                           expiration_time=get_dht_time() + 40)
        assert not alice.store(key, subkey=alice_v.local_public_key, value=record, expiration_time=get_dht_time() + 20)
        assert mallory.get(key, latest=True).value[alice_v.local_public_key].value["step"] == 11
        assert alice.is_alive() and mallory.is_alive()
    finally:
        for dht in (mallory, alice):
            dht.shutdown()
            dht.join(10)


def test_a_non_finite_average_is_never_applied_to_the_parameters(tmp_path):
    """The last line behind the guarded all-reduce: whatever an averager hands back, a NaN or infinite average
    fails the round instead of entering the peer's parameters (which keep their values and go on training)."""
    from components.decentral.peer import PeerConfig

    class Finished:  # a round the averager reports as done, with a group of two
        def done(self):
            return True

        def result(self):
            return {"p1": {"name": "x", "step": 1}, "p2": {"name": "y", "step": 1}}

    class Poisoned:  # what an averager would hold after a round that went wrong
        def __init__(self, value):
            self.value = value

        def get_tensors(self):
            import contextlib

            return contextlib.nullcontext([torch.full((4,), self.value)])

    peer = SwarmPeer(PeerConfig(job="j", name="x", public_key="00"), io=None, workdir=tmp_path)
    peer.params = [torch.nn.Parameter(torch.ones(4))]
    for value in (float("nan"), float("inf"), 2.0):
        peer.averager, peer.control = Poisoned(value), Finished()
        peer.round_state = {"round": 1, "peers": 2, "deadlines": {}, "contributed": [torch.ones(4)],
                            "scheduled": 0.0, "began": 0.0}
        peer._round_tick()
    assert torch.equal(peer.params[0].detach(), torch.full((4,), 2.0))  # only the finite average was applied
    assert [record["ok"] for record in peer.rounds] == [False, False, True]
    assert "not finite" in peer.rounds[0]["error"]
