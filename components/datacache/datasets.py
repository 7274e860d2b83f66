"""Datasets and their preprocessing pipelines: what the cache keys its entries by.

A **dataset** is raw samples and labels: a built-in (scikit-learn's digits, a generated set of JPEG images,
the bundled text corpus) or one a team registered (``POST /api/v1/datasets/``: a directory of images, one
sub-directory per class, or an ``.npz`` file, either at a path on the nodes under a data root a cluster admin
granted the team, ``source: {path}``, or one of the team's uploaded data sets, ``source: {upload: NAME}``,
pinned to its digest at registration and fetched by the node like a mount). A **pipeline** turns raw samples into training tensors: decode, transform (resize to ``size``),
augment (random crop, flip, rotation, colour jitter, blur, each drawn per sample from the epoch's seed). A
pipeline is identified by the content hash of its whole definition (:func:`pipeline_id`): change one parameter
and it is another pipeline, cached apart.

Light: the control plane imports this (the collection, the spec check, the placement hook).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar

from components.runtime.contract.collections import Collection, RecordContext, name_problem
from components.runtime.contract.data import DATA_COLLECTION, DATA_NAME, recipe_key
from components.runtime.contract.panels import PanelData
from components.runtime.contract.spec import Checker, SpecError

PLUGIN = "datacache"
FORMAT_VERSION = 1
FORMATS = ("image-folder", "npz")
MAX_SIZE = 128
MAX_PATH = 4096  # PATH_MAX on Linux

# The default augmentation of image pipelines: the usual CIFAR-style recipe, CPU-heavy on purpose.
DEFAULT_AUGMENT: dict[str, Any] = {"crop": [0.45, 1.0], "flip": True, "rotate": 20.0, "jitter": 0.4, "blur": 0.3}
AUGMENT_FIELDS = set(DEFAULT_AUGMENT)

BUILTINS: dict[str, dict[str, Any]] = {
    "shapes-jpeg": {
        "description": "Generated colour images of 8 shape classes on textured backgrounds, stored as 128x128 "
                       "JPEGs (6000 train, 1000 test): decoding and augmenting them is CPU-heavy, like real "
                       "photographs.",
        "format": "generated-jpeg", "task": "classification", "classes": 8, "train": 6000, "test": 1000,
        "raw_size": 128, "size": 32, "channels": 3, "augment": DEFAULT_AUGMENT,
    },
    "digits": {
        "description": "scikit-learn's bundled 8x8 handwritten digits (1797 images, 20% held out), upscaled to "
                       "16x16.",
        "format": "sklearn-digits", "task": "classification", "classes": 10, "train": 1438, "test": 359,
        "raw_size": 8, "size": 16, "channels": 1,
        "augment": {"crop": [0.8, 1.0], "flip": False, "rotate": 10.0, "jitter": 0.2, "blur": 0.0},
    },
    "corpus": {
        "description": "The bundled text corpus (public-domain prose) the language-model workloads read; "
                       "listed for reference: it has no image pipeline to stream or cache.",
        "format": "text", "task": "language-model",
    },
}


def builtin_records() -> list[dict[str, Any]]:
    return [{"name": name, **copy.deepcopy(body)} for name, body in BUILTINS.items()]


def definition(record: dict[str, Any]) -> dict[str, Any]:
    """The pipeline definition of a dataset record: every parameter that decides the tensors it yields."""
    keys = ("format", "source", "classes", "train", "test", "raw_size", "size", "channels", "augment",
            "test_fraction")
    return {"dataset": record["name"], "version": FORMAT_VERSION,
            **{key: copy.deepcopy(record[key]) for key in keys if key in record}}


def pipeline_id(definition: dict[str, Any]) -> str:
    """The content hash naming a pipeline (16 hex digits): equal definitions, equal ids."""
    return recipe_key(definition)[:16]


def check_augment(check: Checker, name: str, default: dict[str, Any]) -> dict[str, Any] | None:
    """An augmentation object (None turns augmentation off), every bad field named ``<prefix>.<name>.<field>``."""
    value = check.spec.get(name, default)
    where = check._path(name)
    if value is None or value is False:
        return None
    if not isinstance(value, dict):
        check.errors[where] = "must be an object of augmentation parameters, or null for none"
        return None
    inner = Checker(value, where)
    inner.unknown(AUGMENT_FIELDS)
    inner.not_null("flip", "rotate", "jitter", "blur")  # an explicit null is no number (was a 500)
    crop = value.get("crop", default.get("crop", [1.0, 1.0]))
    if not (isinstance(crop, list) and len(crop) == 2 and all(isinstance(c, int | float) and not isinstance(c, bool)
                                                              for c in crop) and 0.05 <= crop[0] <= crop[1] <= 1.0):
        inner.errors[f"{where}.crop"] = "must be [smallest, largest] area fractions with 0.05 <= smallest <= largest <= 1"
        crop = None
    flip = inner.boolean("flip", default.get("flip", False))
    rotate = inner.number("rotate", default.get("rotate", 0.0), minimum=0.0, maximum=180.0)
    jitter = inner.number("jitter", default.get("jitter", 0.0), minimum=0.0, maximum=1.0)
    blur = inner.number("blur", default.get("blur", 0.0), minimum=0.0, maximum=1.0)
    check.errors.update(inner.errors)
    if inner.errors:
        return None
    return {"crop": [float(crop[0]), float(crop[1])], "flip": bool(flip), "rotate": float(rotate),
            "jitter": float(jitter), "blur": float(blur)}


class Datasets(Collection):
    """``/api/v1/datasets/``: the built-in datasets and those the team registered, with their pipelines and
    which nodes' caches hold them."""

    title: ClassVar[str] = "Datasets"
    description: ClassVar[str] = "Datasets jobs read by name (data: {dataset: NAME}), with their pipelines."
    schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "source", "format"],
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$"},
            "description": {"type": "string"},
            "source": {"oneOf": [
                {"type": "object", "additionalProperties": False, "required": ["path"],
                 "properties": {"path": {"type": "string", "pattern": "^/[^\\x00]*$",
                                         "description": "An absolute path on the nodes."}}},
                {"type": "object", "additionalProperties": False, "required": ["upload"],
                 "properties": {"upload": {"type": "string", "pattern": DATA_NAME.pattern,
                                           "description": "One of the team's uploaded data sets (strata data "
                                                          "upload): a directory for image-folder, one file for "
                                                          "npz."}}}]},
            "format": {"type": "string", "enum": list(FORMATS)},
            "task": {"const": "classification"},
            "size": {"type": "integer", "minimum": 4, "maximum": MAX_SIZE, "default": 32},
            "channels": {"type": "integer", "enum": [1, 3], "default": 3},
            "test_fraction": {"type": "number", "minimum": 0.05, "maximum": 0.5, "default": 0.2},
            "augment": {"anyOf": [
                {"type": "null"}, {"const": False},
                {"type": "object", "additionalProperties": False, "properties": {
                    "crop": {"type": "array", "minItems": 2, "maxItems": 2,
                             "items": {"type": "number", "minimum": 0.05, "maximum": 1.0}},
                    "flip": {"type": "boolean"},
                    "rotate": {"type": "number", "minimum": 0.0, "maximum": 180.0},
                    "jitter": {"type": "number", "minimum": 0.0, "maximum": 1.0},
                    "blur": {"type": "number", "minimum": 0.0, "maximum": 1.0}}}],
                "description": "Augmentation parameters; null (or false) for none."},
        },
        "examples": [{"name": "pets", "source": {"path": "/data/pets"}, "format": "image-folder"},
                     {"name": "pets-uploaded", "source": {"upload": "pets-images"}, "format": "image-folder"}],
    }

    def builtins(self) -> list[dict[str, Any]]:
        return builtin_records()

    def validate(self, body: Any) -> dict[str, Any]:
        check = Checker(body, "")
        check.unknown({"name", "description", "source", "format", "size", "channels", "augment",
                       "test_fraction", "task"})
        if body.get("task", "classification") != "classification":
            check.errors["task"] = "must be classification (the only task a registered dataset can have)"
        name = body.get("name")
        if problem := name_problem(name):
            check.errors["name"] = problem
        description = check.string("description", "")
        source = body.get("source")
        if isinstance(source, dict) and set(source) == {"upload"}:
            if not isinstance(source["upload"], str) or not DATA_NAME.match(source["upload"]):
                check.errors["source.upload"] = "must name one of the team's uploaded data sets (strata data list " \
                                                "shows them)"
        elif not isinstance(source, dict) or set(source) != {"path"}:
            check.errors["source"] = "required: {path: an absolute path on the nodes} or {upload: one of the " \
                                     "team's uploaded data sets}"
        elif not isinstance(source["path"], str) or not source["path"].startswith("/") or "\0" in source["path"]:
            check.errors["source.path"] = "must be an absolute path on the nodes"
        elif len(source["path"]) > MAX_PATH or ".." in source["path"].split("/"):
            # A path that climbs (/srv/../etc) says something else than it seems; longer ones no node can open.
            check.errors["source.path"] = f"must be a plain absolute path (no '..'), at most {MAX_PATH} characters"
        fmt = check.string("format", None, choices=FORMATS)
        if fmt is None and "format" not in check.errors:
            check.errors["format"] = f"required: one of {', '.join(FORMATS)} (a directory with one sub-directory " \
                                     "of images per class, or an .npz file with arrays x and y)"
        size = check.number("size", 32, kind=int, minimum=4, maximum=MAX_SIZE)
        channels = check.number("channels", 3, kind=int, minimum=1, maximum=3)
        if channels == 2:
            check.errors["channels"] = "must be 1 (grey) or 3 (colour)"
        test_fraction = check.number("test_fraction", 0.2, minimum=0.05, maximum=0.5)
        check.not_null("description", "size", "channels", "test_fraction")
        augment = check_augment(check, "augment", DEFAULT_AUGMENT)
        if check.errors:
            raise SpecError(check.errors)
        source = {"upload": source["upload"]} if "upload" in source else {"path": source["path"]}
        return {"name": name, "description": description, "source": source, "format": fmt,
                "task": "classification", "size": size, "channels": channels, "test_fraction": test_fraction,
                "augment": augment}

    def access_problems(self, record: dict[str, Any], context: RecordContext) -> dict[str, str]:
        """A registered dataset's path must be one the team may read on the nodes: under a data root a cluster
        admin granted it, never the platform's own state or another team's root (the core's rules). An uploaded
        source must be one of the team's own data sets (another team's is unknown, like a missing one), of the
        layout its format reads."""
        source = record["source"]
        if "upload" in source:
            problem = upload_problem(record["format"], source["upload"], context.data_set(source["upload"]),
                                     context.team)
            return {"source.upload": problem} if problem else {}
        problem = context.path_problem(source["path"])
        return {"source.path": problem} if problem else {}

    def resolve(self, record: dict[str, Any], context: RecordContext) -> dict[str, Any]:
        """An uploaded source pinned to the data set's digest (and layout and size) as it is now: the pipeline
        is a function of those bytes, and a job reads exactly them."""
        source = record["source"]
        if "upload" not in source:
            return record
        found = context.data_set(source["upload"])
        if problem := upload_problem(record["format"], source["upload"], found, context.team):
            raise SpecError({"source.upload": problem})
        return {**record, "source": pinned_source(source["upload"], found)}

    def summary(self, data: PanelData) -> dict[str, Any]:
        """Each node's cache: size against budget, entries, hits, misses, hit rate, evictions, corrupt entries."""
        caches = []
        for node in data.reports(PLUGIN).get("nodes", []):
            stats = node.get("payload") or {}
            if not stats:
                continue
            lookups = int(stats.get("hits", 0)) + int(stats.get("misses", 0))
            caches.append({"node": node.get("node"), "time": node.get("time"),
                           **{name: stats.get(name, 0) for name in ("bytes", "budget", "hits", "misses", "evictions",
                                                                    "corrupt", "uncached")},
                           "entries": len(stats.get("entries", [])),
                           "hit_rate": (int(stats.get("hits", 0)) / lookups) if lookups else None})
        return {"caches": sorted(caches, key=lambda cache: str(cache["node"]))}

    def present(self, record: dict[str, Any], data: PanelData) -> dict[str, Any]:
        shown = dict(record)
        if record.get("task") != "classification":
            shown["pipelines"] = []
            return shown
        pipeline = pipeline_id(definition(record))
        held = []
        for node in data.reports(PLUGIN).get("nodes", []):
            entries = [entry for entry in (node.get("payload") or {}).get("entries", [])
                       if entry.get("pipeline") == pipeline]
            if entries:
                held.append({"node": node.get("node"), "entries": len(entries),
                             "bytes": sum(int(entry.get("bytes", 0)) for entry in entries)})
        shown["pipelines"] = [{"id": pipeline, "definition": definition(record), "cached_on": held}]
        return shown


UPLOADED_FIELDS = ("digest", "format", "size", "expanded_size", "file")


def upload_problem(fmt: str, name: str, found: dict[str, Any] | None, team: str) -> str | None:
    """Why a dataset of format ``fmt`` cannot read the team's uploaded data set ``name`` (``found``: what the
    core answers of it, None when the team has none of that name), or None."""
    if found is None:
        return f"team {team} has no uploaded data set named {name!r} (strata data list shows them; strata data " \
               "upload makes one)"
    if fmt == "image-folder" and found.get("format") != "archive":
        return f"data set {name!r} is one file ({found.get('file')}): an image-folder dataset reads a directory " \
               "uploaded with one sub-directory of images per class"
    if fmt == "npz" and found.get("format") != "file":
        return f"data set {name!r} is a directory: an npz dataset reads one .npz file uploaded as it is " \
               "(strata data upload NAME file.npz)"
    return None


def pinned_source(name: str, found: dict[str, Any]) -> dict[str, Any]:
    """The ``source`` of a dataset reading the uploaded data set ``name``, pinned to what ``found`` says of it."""
    return {"upload": name, **{key: found[key] for key in UPLOADED_FIELDS if key in found}}


def uploaded_mount(source: Any) -> dict[str, Any] | None:
    """The data set a pinned uploaded ``source`` reads, as the core's mounts name one, or None for a path."""
    if not (isinstance(source, dict) and isinstance(source.get("upload"), str) and source.get("digest")):
        return None
    return {"name": source["upload"], **{key: source[key] for key in UPLOADED_FIELDS if key in source}}


def source_path(definition: dict[str, Any]) -> Path:
    """Where a registered dataset's raw data is on this node: its path, or the uploaded data set the node fetched
    for the attempt (its directory; an uploaded file inside it, under the file's name)."""
    source = definition["source"]
    mount = uploaded_mount(source)
    if mount is None:
        return Path(source["path"])
    from components.runtime.contract.data import data_set_path

    root = data_set_path(str(mount["digest"]))
    return root / str(mount["file"]) if mount.get("format") == "file" and mount.get("file") else root


def resolve_dataset(value: Any, lookup) -> dict[str, Any]:
    """A spec's ``data.dataset`` resolved: a name becomes ``{"name", "definition"}``; an already-resolved object
    (a child's spec, a resubmit) is kept when its name still resolves to the same definition, so a spec can never
    bring a definition of its own (a path outside the team's data roots, another team's upload). Raises
    ValueError with the message for ``spec.data.dataset``."""
    if isinstance(value, dict) and set(value) == {"name", "definition"} and isinstance(value["definition"], dict):
        if not isinstance(value["name"], str):
            raise ValueError("must name a dataset (strata datasets lists them)")
        if resolve_dataset(value["name"], lookup)["definition"] != value["definition"]:
            raise ValueError(f"dataset {value['name']!r} is no longer what this spec resolved it to (it was "
                             "registered again since): name it by its name")
        return value
    if not isinstance(value, str):
        raise ValueError("must name a dataset (strata datasets lists them)")
    record = lookup("datasets", value)
    if record is None:
        raise ValueError(f"no dataset named {value!r} in this team (strata datasets lists them)")
    if record.get("task") != "classification":
        raise ValueError(f"{value!r} is a {record.get('task')} dataset: only classification datasets stream epochs")
    source = record.get("source")
    if isinstance(source, dict) and "upload" in source:
        # Pinned at registration: the team must still have those very bytes (never another team's).
        found = lookup(DATA_COLLECTION, str(source["upload"]))
        if found is None or found.get("digest") != source.get("digest"):
            now = "no data set of that name now" if found is None else "another upload of that name now"
            raise ValueError(f"dataset {value!r} reads the uploaded data set {source['upload']!r} as it was when "
                             f"registered ({str(source.get('digest'))[:12]}), and the team has {now}: register the "
                             "dataset again (strata datasets delete, then register)")
    return {"name": value, "definition": definition(record)}


def dataset_pipeline(spec: dict[str, Any]) -> str | None:
    """The pipeline id a (normalized, resolved) job spec reads, else None: the placement hook's key."""
    data = spec.get("data") if isinstance(spec, dict) else None
    dataset = data.get("dataset") if isinstance(data, dict) else None
    if isinstance(dataset, dict) and isinstance(dataset.get("definition"), dict):
        return pipeline_id(dataset["definition"])
    if isinstance(dataset, str) and dataset in BUILTINS and BUILTINS[dataset].get("task") == "classification":
        return pipeline_id(definition({"name": dataset, **BUILTINS[dataset]}))
    return None
