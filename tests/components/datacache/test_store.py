"""The node cache's protocol: identical bytes on a hit, corruption caught and recomputed, the budget held under
concurrent readers, one computation for concurrent processes, and a vanished directory costing only
recomputation."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import threading
import time

import numpy as np
import pytest

from components.datacache.store import CacheStore, read_entry, write_entry


def arrays_for(seed: int, size: int = 50_000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.integers(0, 255, size, dtype=np.uint8), "y": rng.integers(0, 9, 100).astype(np.int64)}


def test_a_hit_returns_bytes_identical_to_the_first_computation(cache_dir):
    store = CacheStore(cache_dir, 1 << 30)
    built = []

    def build():
        built.append(1)
        return arrays_for(1)

    first, hit = store.get("k1", build, {"dataset": "d", "pipeline": "p", "part": "variant-0"})
    assert not hit and built == [1]
    again, hit = store.get("k1", build, {})
    assert hit and built == [1]
    for name in ("x", "y"):
        assert again[name].tobytes() == first[name].tobytes() == arrays_for(1)[name].tobytes()
    stats = store.stats()
    assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 1, 1)
    assert stats["bytes"] == store.disk_bytes() > 50_000


def test_a_flipped_byte_on_disk_is_caught_dropped_and_recomputed(cache_dir):
    store = CacheStore(cache_dir, 1 << 30)
    builds = []
    store.get("k", lambda: builds.append(1) or arrays_for(2), {})
    path = cache_dir / "entries" / "k.npc"
    raw = bytearray(path.read_bytes())
    raw[-5000] ^= 0x01  # one bit, deep in the payload
    path.write_bytes(bytes(raw))
    again, hit = store.get("k", lambda: builds.append(1) or arrays_for(2), {})
    assert not hit and len(builds) == 2, "the corrupt entry must be recomputed, never returned"
    assert again["x"].tobytes() == arrays_for(2)["x"].tobytes()
    assert store.stats()["corrupt"] == 1
    third, hit = store.get("k", lambda: builds.append(1) or arrays_for(2), {})
    assert hit and third["x"].tobytes() == arrays_for(2)["x"].tobytes()


@pytest.mark.parametrize("damage", ["truncate", "header", "empty"])
def test_broken_files_are_corrupt_entries_not_crashes(cache_dir, damage):
    store = CacheStore(cache_dir, 1 << 30)
    store.get("k", lambda: arrays_for(3), {})
    path = cache_dir / "entries" / "k.npc"
    raw = path.read_bytes()
    path.write_bytes({"truncate": raw[:-100], "header": raw[:12] + b"\xff" * 20 + raw[32:], "empty": b""}[damage])
    again, hit = store.get("k", lambda: arrays_for(3), {})
    assert not hit and again["y"].tobytes() == arrays_for(3)["y"].tobytes()
    assert store.stats()["corrupt"] == 1


def test_entry_files_round_trip_and_check_their_checksum(tmp_path):
    path = tmp_path / "e.npc"
    size, digest = write_entry(path, {"a": np.arange(10, dtype=np.float32), "b": np.zeros((2, 3), np.uint8)})
    assert size == path.stat().st_size
    back = read_entry(path, digest)
    assert back["a"].tolist() == list(range(10)) and back["b"].shape == (2, 3)
    back["a"][0] = 99  # the mapping is private: writing never reaches the file
    assert read_entry(path, digest)["a"][0] == 0


def test_eviction_respects_the_budget_under_concurrent_readers(cache_dir):
    entry = CacheStore(cache_dir, 1 << 30)
    entry.get("probe", lambda: arrays_for(0), {})
    one = entry.disk_bytes()
    shutil.rmtree(cache_dir)
    budget = 3 * one + one // 2  # room for three entries
    keys = [f"key-{n}" for n in range(8)]
    over: list[int] = []
    wrong: list[str] = []
    stop = threading.Event()

    def watch():
        store = CacheStore(cache_dir, budget)
        while not stop.is_set():
            used = store.disk_bytes()
            if used > budget:
                over.append(used)
            time.sleep(0.002)

    def reader(seed: int):
        store = CacheStore(cache_dir, budget)
        rng = np.random.default_rng(seed)
        for _ in range(25):
            n = int(rng.integers(len(keys)))
            got, _ = store.get(keys[n], lambda n=n: arrays_for(100 + n), {})
            if got["x"].tobytes() != arrays_for(100 + n)["x"].tobytes():
                wrong.append(keys[n])

    watcher = threading.Thread(target=watch)
    watcher.start()
    readers = [threading.Thread(target=reader, args=(seed,)) for seed in range(6)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join(timeout=300)
    stop.set()
    watcher.join()
    assert not wrong, f"readers got wrong bytes for {wrong}"
    assert not over, f"the cache went over its budget of {budget} bytes: {over[:5]}"
    stats = CacheStore(cache_dir, budget).stats()
    assert stats["evictions"] > 0 and stats["entries"] <= 3 and stats["bytes"] <= budget


def _compute_in_a_process(root: str, marker_dir: str, barrier) -> None:
    store = CacheStore(root, 1 << 30)
    barrier.wait()

    def build():
        (open(os.path.join(marker_dir, f"built-{os.getpid()}"), "w")).close()
        time.sleep(1.0)  # long enough that the other process asks while this one computes
        return arrays_for(7)

    got, _ = store.get("shared", build, {})
    assert got["x"].tobytes() == arrays_for(7)["x"].tobytes()


def test_processes_that_ask_together_compute_an_entry_once(cache_dir, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(3)
    processes = [context.Process(target=_compute_in_a_process, args=(str(cache_dir), str(markers), barrier))
                 for _ in range(3)]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join(timeout=120)
        assert [process.exitcode for process in processes] == [0, 0, 0]
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    assert len(list(markers.iterdir())) == 1, "the entry was computed more than once"
    stats = CacheStore(cache_dir).stats()
    assert (stats["misses"], stats["hits"]) == (1, 2)


def test_a_removed_cache_directory_costs_recomputation_only(cache_dir):
    store = CacheStore(cache_dir, 1 << 30)
    store.get("k", lambda: arrays_for(4), {})
    shutil.rmtree(cache_dir)
    got, hit = store.get("k", lambda: arrays_for(4), {})
    assert not hit and got["x"].tobytes() == arrays_for(4)["x"].tobytes()
    assert (cache_dir / "entries" / "k.npc").exists()  # recreated and cached again


def test_an_unusable_directory_computes_uncached(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache should be")
    got, hit = CacheStore(blocker, 1 << 30).get("k", lambda: arrays_for(5), {})
    assert not hit and got["x"].tobytes() == arrays_for(5)["x"].tobytes()


def test_an_entry_larger_than_the_budget_is_returned_uncached(cache_dir):
    store = CacheStore(cache_dir, 10_000)
    got, hit = store.get("big", lambda: arrays_for(6), {})
    assert not hit and got["x"].size == 50_000
    assert store.stats()["entries"] == 0 and store.stats()["uncached"] == 1 and store.disk_bytes() == 0


def test_enforce_budget_shrinks_the_cache_least_recently_used_first(cache_dir):
    store = CacheStore(cache_dir, 1 << 30)
    for n in range(4):
        store.get(f"k{n}", lambda n=n: arrays_for(n), {})
        time.sleep(0.01)
    store.get("k0", lambda: arrays_for(0), {})  # k0 is now the most recently used
    one = store.disk_bytes() // 4
    store.enforce_budget(2 * one + 10)
    kept = {entry["key"] for entry in store.entries()}
    assert kept == {"k0", "k3"} and store.disk_bytes() <= 2 * one + 10
