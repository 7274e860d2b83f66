"""The collections seam's light parts: paths (normal_path, path_within), the static RecordContext twin, and the
conformance suite's access checks catching a collection that names paths but does not ask about them."""

from __future__ import annotations

import pytest

from components.runtime.contract.collections import Collection, StaticRecordContext, normal_path, path_within
from components.runtime.contract.spec import SpecError
from components.runtime.testing.conformance.collections import CollectionConformance


@pytest.mark.parametrize("path,normal", [("/", "/"), ("/srv/data/", "/srv/data"), ("//srv//./data", "/srv/data"),
                                         ("/srv/.hidden", "/srv/.hidden"), ("/a/b...", "/a/b...")])
def test_normal_path(path, normal):
    assert normal_path(path) == normal


@pytest.mark.parametrize("path", ["", "srv", "./srv", "/srv/../etc", "/..", "/a\0b", None, 5, b"/srv"])
def test_normal_path_refuses(path):
    with pytest.raises(ValueError):
        normal_path(path)


def test_path_within_counts_whole_components():
    assert path_within("/data", "/data") and path_within("/data/x/y", "/data") and path_within("/anything", "/")
    assert not path_within("/data2", "/data") and not path_within("/dat", "/data") and not path_within("/", "/data")


def test_the_static_context_grants_roots_and_refuses_forbidden_places():
    context = StaticRecordContext(team="alpha", data_roots=("/srv/",), forbidden=("/srv/state",))
    assert context.data_roots == ("/srv",)
    assert context.path_problem("/srv/data/x") is None
    assert "outside team alpha's data roots" in context.path_problem("/etc/x")
    assert "lies under /srv/state" in context.path_problem("/srv/state/db")
    assert "contains /srv/state" in context.path_problem("/srv")
    assert "'..'" in context.path_problem("/srv/../etc")
    assert context.asked == ["/srv/data/x", "/etc/x", "/srv/state/db", "/srv", "/srv/../etc"]
    assert "none granted" in StaticRecordContext().path_problem("/x")


class Files(Collection):
    """Records naming a file on the nodes, checked through the context."""

    title = "Files"

    def validate(self, body):
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            raise SpecError({"path": "required: an absolute path"})
        return {"name": body.get("name"), "path": body["path"]}

    def access_problems(self, record, context):
        problem = context.path_problem(record["path"])
        return {"path": problem} if problem else {}


class Careless(Files):
    def access_problems(self, record, context):  # names a path but never asks: every team reads anything
        return {}


class Notes(Files):
    def validate(self, body):
        if not isinstance(body, dict):
            raise SpecError({"text": "required"})
        return {"name": body.get("name"), "text": str(body.get("text", ""))}

    access_problems = Collection.access_problems


class TestFiles(CollectionConformance):
    collection_path = f"{__name__}:Files"
    good = ({"name": "f", "path": "/srv/f"},)
    bad = ({"name": "f"},)
    path_fields = ("path",)


class TestNotes(CollectionConformance):  # a collection that names no paths refuses nothing
    collection_path = f"{__name__}:Notes"
    good = ({"name": "n", "text": "hello"},)


def test_the_suite_fails_a_collection_that_does_not_ask_about_its_paths():
    class TestCareless(TestFiles):
        collection_path = f"{__name__}:Careless"

    with pytest.raises(AssertionError):
        TestCareless().test_access_problems_ask_the_context_about_each_path_and_name_its_field()
    with pytest.raises(AssertionError):
        TestCareless().test_a_path_under_the_platforms_own_state_is_refused_even_inside_a_granted_root()
