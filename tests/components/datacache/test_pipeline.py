"""Pipelines: variants are pure functions of the pipeline definition, datasets load from the nodes' paths."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from components.datacache import pipeline as pipelines
from components.datacache.datasets import BUILTINS, definition, pipeline_id


def test_a_variant_is_a_pure_function_of_the_definition(npz_dataset, definition_of):
    spec = definition_of(npz_dataset)
    raw = pipelines.load_raw(spec)
    first = pipelines.build_variant(raw, spec, 3, None, 0)
    again = pipelines.build_variant(pipelines.load_raw(spec), spec, 3, None, 0)
    other = pipelines.build_variant(raw, spec, 4, None, 0)
    assert first["x"].dtype == np.uint8 and first["x"].shape == (len(raw.train), 3, 16, 16)
    assert first["x"].tobytes() == again["x"].tobytes() and first["y"].tolist() == again["y"].tolist()
    assert first["x"].tobytes() != other["x"].tobytes(), "another variant is augmented differently"
    assert float(first["cpu"][0]) > 0


def test_the_test_variant_is_not_augmented(npz_dataset, definition_of):
    spec = definition_of(npz_dataset)
    raw = pipelines.load_raw(spec)
    test = pipelines.build_variant(raw, spec, pipelines.TEST_VARIANT, None, 0)
    sample = raw.samples[int(raw.test[0])]
    expected = np.asarray(Image.fromarray(sample).convert("RGB").resize((16, 16), Image.BILINEAR)).transpose(2, 0, 1)
    assert test["x"][0].tobytes() == expected.tobytes()
    assert len(test["y"]) == len(raw.test) and not set(raw.test) & set(raw.train)


def test_pipeline_ids_change_with_any_parameter(npz_dataset, definition_of):
    base = definition_of(npz_dataset)
    assert pipeline_id(base) == pipeline_id(definition_of(npz_dataset))
    assert pipeline_id(base) != pipeline_id(definition_of(npz_dataset, size=20))
    assert pipeline_id(base) != pipeline_id(definition_of(npz_dataset, augment={"rotate": 5.0}))


def test_an_image_folder_loads_one_class_per_directory(tmp_path, definition_of):
    for label, colour in enumerate(((200, 20, 20), (20, 200, 20))):
        folder = tmp_path / "images" / f"class-{label}"
        folder.mkdir(parents=True)
        for n in range(5):
            Image.new("RGB", (24, 24), colour).save(folder / f"{n}.png")
    (tmp_path / "images" / "class-0" / "notes.txt").write_text("not an image")
    spec = definition_of(tmp_path / "images", format="image-folder", test_fraction=0.2)
    spec["format"] = "image-folder"
    raw = pipelines.load_raw(spec)
    assert raw.classes == 2 and len(raw.samples) == 10 and sorted(set(raw.labels.tolist())) == [0, 1]
    variant = pipelines.build_variant(raw, spec, 0, None, 0)
    assert variant["x"].shape == (8, 3, 16, 16)


def test_a_missing_path_is_a_clear_error(tmp_path, definition_of):
    spec = definition_of(tmp_path / "nowhere.npz")
    with pytest.raises(FileNotFoundError, match="no file .*nowhere.npz on this node"):
        pipelines.load_raw(spec)


def test_the_generated_images_are_jpegs_of_their_class():
    data, label = pipelines.generated_image(3, 64, 8, 0)
    assert data[:2] == b"\xff\xd8" and 0 <= label < 8  # a JPEG
    assert pipelines.generated_image(3, 64, 8, 0) == (data, label)


def test_digits_stream_with_their_own_pipeline():
    spec = definition({"name": "digits", **BUILTINS["digits"]})
    raw = pipelines.load_raw(spec)
    assert raw.classes == 10 and len(raw.train) == BUILTINS["digits"]["train"]
    variant = pipelines.build_variant(raw, spec, 0, None, 0)
    assert variant["x"].shape == (len(raw.train), 1, 16, 16)
