"""Conformance suite for prepared-data providers (:mod:`components.runtime.contract.data`).

Subclass it and point it at your provider; give it option values it accepts and some it refuses::

    class TestMyCache(DataProviderConformance):
        provider_path = "my_plugin.data:NodeCache"
        good = ({"cache": True},)
        bad = ({"cache": "yes please"},)

It checks that the provider is light (its module imports nothing heavy), declares its options, names a problem
only under its own options, and serves what ``build()`` makes: equal recipes give equal data, different recipes
never get each other's, and a build that raises is not served afterwards as data; the uploaded data sets it names
for good options (``data_sets``) are a list of resolved mounts.
"""

from __future__ import annotations

from typing import Any, ClassVar

from components.runtime.contract.data import DATA_NAME, DIGEST, DataProvider, recipe_key
from components.runtime.contract.registry import import_path
from components.runtime.testing.conformance.kinds import light_import_problem


class DataProviderConformance:
    provider_path: ClassVar[str] = ""
    good: ClassVar[tuple[dict[str, Any], ...]] = ()
    bad: ClassVar[tuple[dict[str, Any], ...]] = ()

    def provider(self) -> DataProvider:
        value = import_path(self.provider_path)
        assert isinstance(value, type) and issubclass(value, DataProvider), f"{self.provider_path}: no DataProvider"
        return value()

    def test_it_is_light(self):
        assert light_import_problem(self.provider_path.split(":")[0]) is None

    def test_it_declares_its_options(self):
        options = self.provider().options
        assert isinstance(options, frozenset) and options and all(isinstance(o, str) and o for o in options)

    def test_good_options_pass_and_bad_ones_are_named_under_its_own_options(self):
        provider = self.provider()
        for data in self.good:
            assert set(data) <= provider.options, data
            assert provider.validate(dict(data)) == {}, data
        for data in self.bad:
            problems = provider.validate(dict(data))
            # Under its own options: the option itself or a field inside it ("perfect.reuse").
            assert problems and {name.split(".")[0] for name in problems} <= set(data), (data, problems)
            assert all(isinstance(message, str) and message for message in problems.values())

    def test_it_serves_what_build_makes(self):
        provider = self.provider()
        data = dict(self.good[0]) if self.good else {}
        for recipe, value in (({"dataset": "conformance", "n": 1}, [1, 2, 3]),
                              ({"dataset": "conformance", "n": 2}, [4, 5])):
            def build(value=value):
                return list(value)

            key = recipe_key(recipe)
            for _ in range(2):
                found = provider.fetch(key, recipe, build, data)
                assert found is None or list(found) == value, (recipe, found)

    def test_a_failing_build_is_not_served(self):
        provider = self.provider()
        data = dict(self.good[0]) if self.good else {}
        recipe = {"dataset": "conformance-broken"}

        def broken():
            raise RuntimeError("decoding failed")

        try:
            provider.fetch(recipe_key(recipe), recipe, broken, data)
        except RuntimeError:
            pass
        found = provider.fetch(recipe_key(recipe), recipe, lambda: [7], data)
        assert found is None or list(found) == [7]

    def test_the_data_sets_it_names_are_resolved_mounts(self):
        provider = self.provider()
        for data in self.good:
            named = provider.data_sets(dict(data))
            assert isinstance(named, list), (data, named)
            for mount in named:
                assert isinstance(mount, dict) and isinstance(mount.get("name"), str), mount
                assert DATA_NAME.match(mount["name"]) and DIGEST.match(str(mount.get("digest"))), mount
