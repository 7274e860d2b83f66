"""The scheduler's leader lease (scheduling/leader.py): one holder at a time, renewal, takeover after expiry."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from strata.scheduling import leader
from strata.scheduling.leader import lease_acquire, lease_release
from strata.scheduling.models import Lease

pytestmark = pytest.mark.django_db
T0 = timezone.now().replace(microsecond=0)


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def test_first_use_creates_the_lease_with_epoch_one():
    lease = lease_acquire("test", "a", ttl=10, now=at(0))
    assert lease is not None and lease.holder == "a" and lease.epoch == 1
    assert lease.expires_at == at(10) and lease.acquired_at == at(0)


def test_the_holder_renews_without_a_new_epoch():
    lease_acquire("test", "a", ttl=10, now=at(0))
    lease = lease_acquire("test", "a", ttl=10, now=at(5))
    assert lease.holder == "a" and lease.epoch == 1
    assert lease.expires_at == at(15) and lease.renewed_at == at(5) and lease.acquired_at == at(0)


def test_a_second_holder_is_refused_while_the_lease_is_valid():
    lease_acquire("test", "a", ttl=10, now=at(0))
    assert lease_acquire("test", "b", ttl=10, now=at(9.9)) is None
    assert Lease.objects.get(name="test").holder == "a"


def test_a_second_holder_takes_over_after_expiry_and_the_epoch_grows():
    lease_acquire("test", "a", ttl=10, now=at(0))
    lease = lease_acquire("test", "b", ttl=10, now=at(10))
    assert lease is not None and lease.holder == "b" and lease.epoch == 2 and lease.acquired_at == at(10)
    # The old holder is refused now, and taking it back later is another epoch.
    assert lease_acquire("test", "a", ttl=10, now=at(15)) is None
    assert lease_acquire("test", "a", ttl=10, now=at(21)).epoch == 3


def test_a_released_lease_is_free_at_once():
    lease_acquire("test", "a", ttl=10)
    assert lease_release("test", "b") is False
    assert lease_release("test", "a") is True
    lease = lease_acquire("test", "b", ttl=10)
    assert lease.holder == "b" and lease.epoch == 2


def test_names_are_independent():
    assert lease_acquire("one", "a", ttl=10, now=at(0)) is not None
    assert lease_acquire("two", "b", ttl=10, now=at(0)) is not None


def test_leader_status_says_who_leads():
    from strata.scheduling.services import leader_status

    assert leader_status() == {"name": "scheduler", "leader": False, "holder": None, "epoch": 0,
                               "expires_at": None}
    lease_acquire()  # this process, the default name and TTL
    status = leader_status()
    assert status["leader"] is True and status["holder"] == leader.holder_id() and status["epoch"] == 1
    Lease.objects.filter(name="scheduler").update(holder="other:1:x")
    status = leader_status()
    assert status["leader"] is False and status["holder"] == "other:1:x"


def test_holder_id_names_host_and_process():
    import os
    import socket

    host, pid, random = leader.holder_id().rsplit(":", 2)
    assert host == socket.gethostname() and pid == str(os.getpid()) and len(random) == 8
    assert leader.holder_id() == leader.holder_id()


def test_tick_reaps_only_on_the_leader(monkeypatch, settings):
    from strata.scheduling import services

    calls = []
    monkeypatch.setattr(services, "reap", lambda: calls.append("reap") or {"lost_nodes": 0, "requeued": 0,
                        "overdue": 0, "lost_participants": 0, "stopped_participants": 0})
    monkeypatch.setattr(services, "reconcile", lambda: calls.append("reconcile") or 0)
    first = services.tick()
    assert first["leader"] is True and first["epoch"] == 1 and calls == ["reap", "reconcile"]
    Lease.objects.filter(name="scheduler").update(holder="other:1:x")  # another replica leads
    calls.clear()
    second = services.tick()
    assert second["leader"] is False and calls == []  # the pass still ran: its keys are there
    assert "placed" in second


def test_telemetry_maintenance_runs_on_the_leader_only(monkeypatch):
    from strata.telemetry import services as telemetry
    from strata.telemetry import tasks

    calls = []
    monkeypatch.setattr(telemetry, "rollups_update", lambda: calls.append("rollup"))
    monkeypatch.setattr(telemetry, "telemetry_prune", lambda: calls.append("prune"))
    lease_acquire("scheduler", "other:1:x", ttl=60)
    tasks.rollup_task()
    tasks.retention_task()
    assert calls == []
    Lease.objects.filter(name="scheduler").update(expires_at=timezone.now() - timedelta(seconds=1))
    tasks.rollup_task()  # the lease expired: this process takes it and runs the rollup
    tasks.retention_task()
    assert calls == ["rollup", "prune"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_holders_on_postgres_exactly_one_wins():
    """20 threads (20 connections) race for a free lease, then for the same lease after it expired: each time
    exactly one wins, and the epoch grows by one. The expired race is between new holders: the old holder taking its
    own expired lease back is a renewal (the epoch stays), which CI once saw win the race."""
    count = 20

    def race(now, first_id=0):
        barrier = threading.Barrier(count)
        won, errors = [], []

        def worker(i):
            try:
                barrier.wait(timeout=30)
                if lease_acquire("race", f"holder-{first_id + i}", ttl=10, now=now) is not None:
                    won.append(first_id + i)
            except Exception as error:  # asserted on below
                errors.append(error)
            finally:
                connection.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        return won

    first = race(at(0))  # first use: INSERTs race
    assert len(first) == 1 and Lease.objects.get(name="race").epoch == 1
    assert race(at(5)) == first  # valid: only its holder renews it
    assert Lease.objects.get(name="race").epoch == 1
    won = race(at(100), first_id=count)  # expired: conditional UPDATEs race
    assert len(won) == 1
    lease = Lease.objects.get(name="race")
    assert lease.holder == f"holder-{won[0]}" and lease.epoch == 2
    # the first holder, whose lease another holder took, gets it back only once that one expires: a new epoch
    assert lease_acquire("race", f"holder-{first[0]}", ttl=10, now=at(105)) is None
    assert lease_acquire("race", f"holder-{first[0]}", ttl=10, now=at(200)).epoch == 3
