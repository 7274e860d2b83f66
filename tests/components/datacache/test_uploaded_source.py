"""Datasets on an uploaded data set (``source: {upload: NAME}``): checked against the team's own data sets at
registration (another team's is unknown, like a missing one), pinned to the digest, re-checked at submit (a
re-upload or a forged definition is refused), named to the core for the node to fetch, and read by the pipeline
from the node's data cache."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from components.datacache.datasets import (
    BUILTINS,
    Datasets,
    definition,
    pipeline_id,
    resolve_dataset,
    source_path,
)
from components.datacache.pipeline import load_raw
from components.datacache.provider import DataCacheProvider
from components.runtime.contract.collections import StaticRecordContext
from components.runtime.contract.data import DATA_COLLECTION, DATA_SETS_ENV, data_sets_of, resolve_options
from components.runtime.contract.spec import SpecError

DIGEST = "a" * 64
IMAGES = {"digest": DIGEST, "format": "archive", "size": 900, "expanded_size": 4000}
ARRAYS = {"digest": "b" * 64, "format": "file", "file": "x.npz", "size": 100, "expanded_size": 100}
BODY = {"name": "pets", "source": {"upload": "pets-images"}, "format": "image-folder", "size": 8}


def context(**data_sets) -> StaticRecordContext:
    return StaticRecordContext(team="alpha", data_sets={name.replace("_", "-"): value
                                                        for name, value in data_sets.items()})


def registered(body=BODY, **data_sets) -> dict:
    """The record as the control plane stores it: validated, checked, resolved."""
    collection, ctx = Datasets(), context(**data_sets)
    record = collection.validate(dict(body))
    assert collection.access_problems(dict(record), ctx) == {}
    return collection.resolve(record, ctx)


def lookup_of(records: dict, data_sets: dict):
    def lookup(collection, name):
        if collection == DATA_COLLECTION:
            found = data_sets.get(name)
            return {**found, "name": name} if found is not None else None
        return records.get(name)

    return lookup


def test_an_upload_source_validates_to_itself_and_bad_ones_are_named():
    collection = Datasets()
    record = collection.validate(dict(BODY))
    assert record["source"] == {"upload": "pets-images"} and collection.validate(dict(record)) == record
    for source, field in (({"upload": "Not A Name"}, "source.upload"), ({"upload": 5}, "source.upload"),
                          ({"upload": "x", "path": "/srv"}, "source"), ({"url": "http://x"}, "source")):
        with pytest.raises(SpecError) as refused:
            collection.validate({**BODY, "source": source})
        assert field in refused.value.errors, refused.value.errors


def test_registration_needs_the_teams_own_data_set_of_the_right_layout():
    collection = Datasets()
    record = collection.validate(dict(BODY))
    # No data set of that name in the team (another team's is answered None by the core: the same words).
    missing = collection.access_problems(dict(record), context())
    assert set(missing) == {"source.upload"} and "team alpha has no uploaded data set named 'pets-images'" in \
        missing["source.upload"]
    one_file = collection.access_problems(dict(record), context(pets_images=ARRAYS))
    assert "is one file" in one_file["source.upload"]
    npz = collection.validate({**BODY, "format": "npz"})
    assert "is a directory" in collection.access_problems(npz, context(pets_images=IMAGES))["source.upload"]
    assert collection.access_problems(npz, context(pets_images=ARRAYS)) == {}
    with pytest.raises(SpecError) as refused:
        collection.resolve(dict(record), context())
    assert "source.upload" in refused.value.errors


def test_the_stored_record_is_pinned_to_the_digest_and_the_pipeline_follows_the_bytes():
    record = registered(pets_images=IMAGES)
    assert record["source"] == {"upload": "pets-images", **IMAGES}
    other = registered(pets_images={**IMAGES, "digest": "c" * 64})
    assert pipeline_id(definition(record)) != pipeline_id(definition(other))  # other bytes, another pipeline
    shown = Datasets().present(record, _NoReports())
    assert shown["pipelines"][0]["definition"]["source"]["digest"] == DIGEST


class _NoReports:
    def reports(self, plugin):
        return {"nodes": []}


def test_submit_resolves_through_the_pin_and_refuses_a_reupload_or_a_forgery():
    record = registered(pets_images=IMAGES)
    lookup = lookup_of({"pets": record}, {"pets-images": IMAGES})
    resolved = resolve_dataset("pets", lookup)
    assert resolved["definition"]["source"]["digest"] == DIGEST
    assert resolve_dataset(resolved, lookup) == resolved  # idempotent: a child's spec, a resubmit
    # Uploaded again (other bytes) or deleted since the registration: refused, saying what to do.
    for now in ({"pets-images": {**IMAGES, "digest": "c" * 64}}, {}):
        with pytest.raises(ValueError, match="register the dataset again"):
            resolve_dataset("pets", lookup_of({"pets": record}, now))
        with pytest.raises(ValueError, match="register"):
            resolve_dataset(resolved, lookup_of({"pets": record}, now))
    # A definition the spec brings itself (another team's digest, a path outside the team's roots) is refused.
    for forged in ({**resolved["definition"], "source": {**resolved["definition"]["source"], "digest": "e" * 64}},
                   {**resolved["definition"], "source": {"path": "/srv/other-team"}}):
        with pytest.raises(ValueError, match="no longer what this spec resolved"):
            resolve_dataset({"name": "pets", "definition": forged}, lookup)
    with pytest.raises(ValueError, match="no dataset named"):
        resolve_dataset({"name": "nothing", "definition": resolved["definition"]}, lookup)
    # Through the seam: a 400 naming spec.data.dataset.
    _, errors = resolve_options({"dataset": "pets"}, lookup_of({"pets": record}, {}),
                                providers=[DataCacheProvider()])
    assert set(errors) == {"spec.data.dataset"}


def test_the_provider_names_the_data_set_to_the_core():
    record = registered(pets_images=IMAGES)
    data = {"dataset": resolve_dataset("pets", lookup_of({"pets": record}, {"pets-images": IMAGES})), "cache": True}
    provider = DataCacheProvider()
    assert provider.data_sets(data) == [{"name": "pets-images", **IMAGES}]
    assert data_sets_of({"data": data}, providers=[provider]) == {DIGEST: {"name": "pets-images", **IMAGES}}
    builtin = {"dataset": {"name": "digits", "definition": definition({"name": "digits", **BUILTINS["digits"]})}}
    path = {"dataset": {"name": "p", "definition": {"source": {"path": "/srv/p"}, "format": "npz"}}}
    assert provider.data_sets(builtin) == provider.data_sets(path) == provider.data_sets({"cache": True}) == []


def _image_folder(root):
    for label, colour in enumerate(((220, 30, 30), (30, 200, 40))):
        folder = root / f"class-{label}"
        folder.mkdir(parents=True)
        for n in range(5):
            Image.new("RGB", (12, 12), (colour[0], colour[1], n * 20)).save(folder / f"{n}.png")


def test_the_pipeline_reads_the_data_set_the_node_fetched(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_SETS_ENV, str(tmp_path / "data"))
    record = registered(pets_images=IMAGES)
    pinned = definition(record)
    with pytest.raises(LookupError, match="not on this node"):
        load_raw(pinned)
    _image_folder(tmp_path / "data" / DIGEST)
    assert source_path(pinned) == tmp_path / "data" / DIGEST
    raw = load_raw(pinned)
    assert raw.classes == 2 and len(raw.samples) == 10 and len(raw.test) == 2
    # An npz uploaded as one file: the file inside its data set's directory.
    arrays = registered({**BODY, "format": "npz"}, pets_images=ARRAYS)
    folder = tmp_path / "data" / ARRAYS["digest"]
    folder.mkdir()
    np.savez(folder / "x.npz", x=np.zeros((6, 8, 8, 3), dtype=np.uint8), y=np.array([0, 1, 0, 1, 0, 1]))
    assert source_path(definition(arrays)) == folder / "x.npz"
    assert load_raw(definition(arrays)).classes == 2
