"""The prepared-data seam (components/runtime/contract/data.py): recipes and their keys, the per-process memo (one build
per recipe, even for concurrent callers), providers that jobs opt into with ``spec.data``, the option check that
names every bad option, and the registry's ``data_providers`` seam."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import pytest

from components.runtime.contract import registry
from components.runtime.contract.data import (
    DATA_COLLECTION,
    DataProvider,
    Memo,
    mounts_of,
    option_errors,
    prepare,
    recipe_key,
    resolve_options,
)
from components.runtime.contract.plugins import Plugin
from components.runtime.testing.conformance.data import DataProviderConformance


class DiskCache(DataProvider):
    """A provider for the tests: serves from a dict, filling it from ``build()`` on a miss."""

    options: ClassVar[frozenset[str]] = frozenset({"stash"})
    store: ClassVar[dict] = {}

    def validate(self, data):
        return {} if isinstance(data.get("stash"), bool) else {"stash": "must be true or false"}

    def fetch(self, key, recipe, build, data):
        if not data.get("stash"):
            return None
        if key not in self.store:
            self.store[key] = build()
        return self.store[key]


class Broken(DataProvider):
    options: ClassVar[frozenset[str]] = frozenset({"broken"})

    def validate(self, data):
        raise RuntimeError("oops")


CACHE = Plugin(name="disk-cache", data_providers=(f"{__name__}:DiskCache",))
SAME_OPTION = Plugin(name="other-cache", data_providers=(f"{__name__}:DiskCache",))


class TestDiskCacheConforms(DataProviderConformance):
    provider_path = f"{__name__}:DiskCache"
    good = ({"stash": True}, {"stash": False})
    bad = ({"stash": "yes"},)


def test_equal_recipes_have_equal_keys():
    assert recipe_key({"a": 1, "b": {"c": 2}}) == recipe_key({"b": {"c": 2}, "a": 1})
    assert recipe_key({"a": 1}) != recipe_key({"a": 2})
    with pytest.raises(ValueError):
        recipe_key({"a": float("nan")})


def test_the_memo_builds_a_recipe_once_even_for_concurrent_callers():
    memo, calls = Memo(entries=2), []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return object()

    results = []
    threads = [threading.Thread(target=lambda: results.append(memo.get("k", slow))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(calls) == 1 and len(results) == 4 and len({id(value) for value in results}) == 1
    assert (memo.builds, memo.hits) == (1, 3)


def test_the_memo_drops_the_least_recently_used_and_keeps_no_failed_build():
    memo = Memo(entries=2)
    first = memo.get("a", lambda: [1])
    memo.get("b", lambda: [2])
    assert memo.get("a", lambda: [9]) is first  # a is now the most recent
    memo.get("c", lambda: [3])  # drops b
    assert memo.get("b", lambda: [22]) == [22]  # built again; drops a, now the least recent
    assert memo.get("c", lambda: [33]) == [3]
    assert memo.get("a", lambda: [99]) == [99]

    def boom():
        raise RuntimeError("decode failed")

    with pytest.raises(RuntimeError):
        memo.get("d", boom)
    assert memo.get("d", lambda: [4]) == [4]
    off = Memo(entries=0)
    assert off.get("x", lambda: [1]) is not off.get("x", lambda: [1])


def test_prepare_asks_the_opted_into_provider_then_the_memo():
    DiskCache.store.clear()
    memo, built = Memo(entries=4), []

    def build():
        built.append(1)
        return [len(built)]

    recipe = {"dataset": "digits", "seed": 0}
    providers = [DiskCache()]
    # Opted in: the provider serves it (and keeps it), the memo is not used.
    assert prepare(recipe, build, {"stash": True}, providers=providers, memo=memo) == [1]
    assert prepare(recipe, build, {"stash": True}, providers=providers, memo=memo) == [1]
    assert recipe_key(recipe) in DiskCache.store and memo.builds == 0
    # Not opted in (or the provider passes): the memo, one build per recipe.
    assert prepare(recipe, build, {}, providers=providers, memo=memo) == [2]
    assert prepare(recipe, build, {"stash": False}, providers=providers, memo=memo) == [2]
    assert prepare({"dataset": "digits", "seed": 1}, build, None, providers=providers, memo=memo) == [3]
    # No recipe: nothing to share, built every time.
    assert prepare(None, build, {"stash": True}, providers=providers, memo=memo) == [4]
    assert prepare(None, build, {"stash": True}, providers=providers, memo=memo) == [5]


def test_every_bad_option_is_named():
    providers = [DiskCache(), Broken()]
    assert option_errors(None, providers) == {} and option_errors({}, providers) == {}
    assert option_errors({"stash": True}, providers) == {}
    errors = option_errors({"stash": "yes", "speed": 1, "broken": 1}, providers)
    assert errors == {"spec.data.stash": "must be true or false",
                      "spec.data.speed": "no installed plugin takes this data option (known: broken, mount, stash)",
                      "spec.data.broken": "could not be checked: RuntimeError"}
    assert set(option_errors("stash", providers)) == {"spec.data"}
    assert set(option_errors({"stash": True}, [], prefix="spec.x")) == {"spec.x.stash"}


def test_plugins_contribute_data_providers_and_an_option_has_one_owner(install_plugins):
    install_plugins(f"{__name__}:CACHE", f"{__name__}:SAME_OPTION")
    assert [type(p).__name__ for p in registry.data_providers()] == ["DataCacheProvider", "DiskCache"]
    assert "data option 'stash' (already disk-cache's)" in registry.problems()["other-cache"]
    # The train kind's spec takes the installed provider's option, and names a bad value.
    from components.runtime.contract.spec import SpecError
    from components.train.spec import TrainSpec

    assert TrainSpec().validate({"workload": "mlp-digits", "data": {"stash": True}})["data"] == {"stash": True}
    with pytest.raises(SpecError) as caught:
        TrainSpec().validate({"workload": "mlp-digits", "data": {"stash": 3}})
    assert caught.value.errors == {"spec.data.stash": "must be true or false"}


# -- the core's own option: mount: {alias: data set name} -------------------------------------------------------
DIGEST_A = "a" * 64


def test_mount_is_a_core_option_checked_alias_by_alias():
    assert option_errors({"mount": {"images": "pets-2024", "csv": "tables"}}, []) == {}
    errors = option_errors({"mount": {"../up": "pets", "ok": "Bad Name", "fine": {"name": "x", "digest": "zz"}}}, [])
    assert set(errors) == {"spec.data.mount.../up", "spec.data.mount.ok", "spec.data.mount.fine"}
    assert set(option_errors({"mount": []}, [])) == {"spec.data.mount"}
    assert set(option_errors({"mount": {}}, [])) == {"spec.data.mount"}
    assert set(option_errors({"mount": {f"a{i}": "x" for i in range(40)}}, [])) == {"spec.data.mount"}


def test_mount_resolves_to_the_digest_and_a_resolved_mount_to_itself():
    sets = {"pets": {"name": "pets", "digest": DIGEST_A, "format": "archive", "size": 10, "expanded_size": 30}}

    def lookup(collection, name):
        assert collection == DATA_COLLECTION
        return sets.get(name)

    resolved, errors = resolve_options({"mount": {"images": "pets"}}, lookup, providers=[])
    assert not errors and resolved == {"mount": {"images": sets["pets"]}}
    assert mounts_of({"data": resolved}) == {"images": sets["pets"]}
    assert resolve_options(resolved, lookup, providers=[]) == (resolved, {})  # idempotent
    _, errors = resolve_options({"mount": {"images": "nothing"}}, lookup, providers=[])
    assert set(errors) == {"spec.data.mount.images"} and "no data set named 'nothing'" in errors["spec.data.mount.images"]
    stale = {"mount": {"images": {**sets["pets"], "digest": "b" * 64}}}
    _, errors = resolve_options(stale, lookup, providers=[])
    assert "uploaded again" in errors["spec.data.mount.images"]
    assert mounts_of({"data": {"mount": {"images": "pets"}}}) == {} and mounts_of(None) == {}
