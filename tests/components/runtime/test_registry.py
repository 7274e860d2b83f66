import pytest

from components.runtime import registry
from components.runtime.spec import KindSpec
from components.train.component import TrainComponent
from components.train.spec import TrainSpec


def test_train_kind_is_registered():
    spec = registry.get_kind("train")
    assert isinstance(spec, TrainSpec)
    assert isinstance(spec, KindSpec)
    assert spec.kind == "train"
    assert "train" in registry.kinds()


def test_registry_is_loaded_once():
    assert registry.kinds() is registry.kinds()
    assert registry.get_kind("train") is registry.get_kind("train")


def test_unknown_kind_lists_the_known_kinds():
    with pytest.raises(registry.UnknownKind) as caught:
        registry.get_kind("bake-bread")
    assert caught.value.kind == "bake-bread"
    assert caught.value.known == sorted(registry.kinds())
    assert "train" in caught.value.known
    assert "unknown job kind 'bake-bread'" in str(caught.value)
    assert "train" in str(caught.value)
    assert isinstance(caught.value, LookupError)


def test_load_component_instantiates_the_kinds_component():
    component = registry.load_component("train")
    assert isinstance(component, TrainComponent)
    assert component.kind == "train"


def test_import_path_needs_module_and_attribute():
    assert registry.import_path("components.train.spec:TrainSpec") is TrainSpec
    with pytest.raises(ImportError):
        registry.import_path("components.train.spec")
