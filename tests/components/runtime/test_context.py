"""context_from_payload: the devices a rank sees."""

from __future__ import annotations

from components.runtime.client.remote import context_from_payload


def payload(**extra):
    return {"job": "j", "attempt": "a", "spec": {}, "rank": 0, "world_size": 1, **extra}


def device(index, kind="cuda", share=1.0):
    return {"index": index, "kind": kind, "memory": 1 << 30, "share": share}


def test_a_rank_given_several_whole_gpus_sees_every_one(tmp_path):
    ctx = context_from_payload(payload(device=device(2), devices=[device(2), device(5)]), local_root=tmp_path)
    assert [(d.kind, d.index, d.share) for d in ctx.devices] == [("cuda", 0, 1.0), ("cuda", 1, 1.0)]
    assert sum(d.share for d in ctx.devices) == 2.0
    unnarrowed = context_from_payload(payload(devices=[device(2), device(5)]), narrowed=False, local_root=tmp_path)
    assert [d.index for d in unnarrowed.devices] == [2, 5]


def test_a_single_device_payload_and_no_device(tmp_path):
    one = context_from_payload(payload(device=device(3, "virtual", 0.25)), local_root=tmp_path)
    assert [(d.kind, d.index, d.share) for d in one.devices] == [("virtual", 3, 0.25)]
    assert context_from_payload(payload(device=None), local_root=tmp_path).devices == []
