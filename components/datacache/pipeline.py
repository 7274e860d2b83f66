"""Decode, transform and augment: the CPU work a pipeline does, in loader worker processes.

Everything here is numpy and PIL (no torch), so loader workers start quickly. The augmentation of sample ``i`` in
variant ``v`` is drawn from a generator seeded by ``(pipeline id, v, i)`` alone: a variant's tensors are a pure
function of the pipeline definition, which is what lets every job on a node share them, and what lets a
corrupt cache entry be recomputed byte for byte.

Shapes: a variant is ``{"x": uint8 [n, channels, size, size], "y": int64 [n]}``.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

from components.datacache.datasets import pipeline_id, source_path

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}
CHUNKS_PER_WORKER = 6  # a build is split into this many chunks per worker (progress, balance)
TEST_VARIANT = -1  # the deterministic (un-augmented) transform, used for the held-out set


def seed_of(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


# -- raw datasets -----------------------------------------------------------------------------------------------
SHAPES = ("disc", "square", "triangle", "cross", "ring", "bars", "diamond", "checker")
PALETTE = [(220, 60, 50), (40, 150, 70), (50, 90, 210), (230, 190, 40), (150, 60, 180), (40, 180, 190),
           (240, 120, 30), (120, 120, 120)]


def _draw_shape(draw: ImageDraw.ImageDraw, label: int, box: tuple[float, float, float, float], colour,
                rng: np.random.Generator) -> None:
    x0, y0, x1, y1 = box
    cx, cy, r = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2
    shape = SHAPES[label]
    if shape == "disc":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=colour)
    elif shape == "cross":
        w = r / 3
        draw.rectangle((cx - w, y0, cx + w, y1), fill=colour)
        draw.rectangle((x0, cy - w, x1, cy + w), fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=max(2, int(r / 3)))
    elif shape == "bars":
        step = max(2, int(r / 2))
        for y in range(int(y0), int(y1), 2 * step):
            draw.rectangle((x0, y, x1, min(y + step - 1, y1)), fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=colour)
    else:  # checker
        step = max(2, int(r / 2))
        for row, y in enumerate(range(int(y0), int(y1), step)):
            for col, x in enumerate(range(int(x0), int(x1), step)):
                if (row + col) % 2 == 0:
                    draw.rectangle((x, y, x + step - 1, y + step - 1), fill=colour)


def generated_image(index: int, size: int, classes: int, seed: int) -> tuple[bytes, int]:
    """One generated photograph-like JPEG: a shape of class ``label`` on a noisy gradient background."""
    rng = np.random.default_rng(seed_of("generated-jpeg", seed, index))
    label = int(rng.integers(classes))
    top, bottom = rng.integers(30, 225, 3), rng.integers(30, 225, 3)
    ramp = np.linspace(0.0, 1.0, size)[:, None, None]
    background = top[None, None, :] * (1 - ramp) + bottom[None, None, :] * ramp
    background = np.broadcast_to(background, (size, size, 3)) + rng.normal(0, 18, (size, size, 3))
    image = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 5))):  # distractor strokes
        points = [tuple(rng.uniform(0, size, 2)) for _ in range(2)]
        draw.line(points, fill=tuple(int(c) for c in rng.integers(0, 255, 3)), width=int(rng.integers(1, 3)))
    r = rng.uniform(0.2, 0.38) * size
    cx, cy = rng.uniform(r, size - r, 2)
    colour = tuple(int(np.clip(c + rng.normal(0, 25), 0, 255)) for c in PALETTE[int(rng.integers(len(PALETTE)))])
    _draw_shape(draw, label, (cx - r, cy - r, cx + r, cy + r), colour, rng)
    image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.0, 0.8))))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=int(rng.integers(80, 95)))
    return out.getvalue(), label


def _generate_chunk(args: tuple[int, int, int, int, int]) -> tuple[list[bytes], list[int]]:
    start, stop, size, classes, seed = args
    pairs = [generated_image(index, size, classes, seed) for index in range(start, stop)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


class Raw:
    """A dataset's raw samples: encoded images (``bytes``) or uint8 arrays, labels, and the train/test split."""

    def __init__(self, samples: list[Any], labels: np.ndarray, train: np.ndarray, test: np.ndarray, classes: int):
        self.samples, self.labels, self.train, self.test, self.classes = samples, labels, train, test, classes


def pack_raw(samples: list[bytes]) -> dict[str, np.ndarray]:
    lengths = np.array([len(s) for s in samples], dtype=np.int64)
    return {"blob": np.frombuffer(b"".join(samples), dtype=np.uint8).copy(), "lengths": lengths}


def unpack_raw(arrays: dict[str, np.ndarray]) -> list[bytes]:
    blob = arrays["blob"].tobytes()
    ends = np.cumsum(arrays["lengths"])
    starts = ends - arrays["lengths"]
    return [blob[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]


def generate_raw(definition: dict[str, Any], pool: ProcessPoolExecutor | None = None) -> dict[str, np.ndarray]:
    """The generated JPEG set of a ``generated-jpeg`` definition, packed as arrays (cacheable)."""
    count = int(definition["train"]) + int(definition["test"])
    size, classes = int(definition["raw_size"]), int(definition["classes"])
    step = 250
    jobs = [(s, min(s + step, count), size, classes, 0) for s in range(0, count, step)]
    results = list(pool.map(_generate_chunk, jobs)) if pool is not None else [_generate_chunk(j) for j in jobs]
    samples = [s for chunk in results for s in chunk[0]]
    labels = np.array([label for chunk in results for label in chunk[1]], dtype=np.int64)
    return {**pack_raw(samples), "labels": labels}


def load_raw(definition: dict[str, Any], cached: Callable[[str, Callable[[], dict]], dict] | None = None,
             pool: ProcessPoolExecutor | None = None) -> Raw:
    """The raw samples of a dataset definition. ``cached(part, build)`` keeps generated sets in the cache."""
    fmt = definition["format"]
    if fmt == "generated-jpeg":
        def build():
            return generate_raw(definition, pool)

        arrays = cached("raw", build) if cached is not None else build()
        samples = unpack_raw(arrays)
        labels = np.asarray(arrays["labels"], dtype=np.int64)
        train_count = int(definition["train"])
        order = np.arange(len(samples))
        return Raw(samples, labels, order[:train_count], order[train_count:], int(definition["classes"]))
    if fmt == "sklearn-digits":
        from sklearn.datasets import load_digits  # bundled with scikit-learn: no download

        digits = load_digits()
        images = (digits.images * (255.0 / 16.0)).round().astype(np.uint8)  # [n, 8, 8]
        labels = digits.target.astype(np.int64)
        rows = np.random.default_rng(seed_of("digits-split")).permutation(len(labels))
        test_count = int(definition["test"])
        return Raw(list(images), labels, np.sort(rows[test_count:]), np.sort(rows[:test_count]), 10)
    path = source_path(definition)  # a path on the node, or the uploaded data set the node fetched
    fraction = float(definition.get("test_fraction", 0.2))
    if fmt == "npz":
        if not path.is_file():
            raise FileNotFoundError(f"dataset {definition['dataset']!r}: no file {path} on this node")
        with np.load(path) as arrays:
            if "x" not in arrays or "y" not in arrays:
                raise ValueError(f"dataset {definition['dataset']!r}: {path} must hold arrays x and y")
            x, y = np.asarray(arrays["x"]), np.asarray(arrays["y"]).astype(np.int64).reshape(-1)
        if x.dtype != np.uint8:
            x = np.clip(x.astype(np.float64) * (255.0 if x.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
        if x.ndim == 4 and x.shape[1] in (1, 3) and x.shape[-1] not in (1, 3):
            x = x.transpose(0, 2, 3, 1)  # channels first -> last, as PIL wants
        samples, labels, classes = list(x), y, int(y.max()) + 1
    elif fmt == "image-folder":
        if not path.is_dir():
            raise FileNotFoundError(f"dataset {definition['dataset']!r}: no directory {path} on this node")
        names = sorted(p.name for p in path.iterdir() if p.is_dir())
        if len(names) < 2:
            raise ValueError(f"dataset {definition['dataset']!r}: {path} needs a sub-directory per class (2 or more)")
        samples, found = [], []
        for label, name in enumerate(names):
            for file in sorted((path / name).iterdir()):
                if file.suffix.lower() in IMAGE_SUFFIXES:
                    samples.append(file.read_bytes())
                    found.append(label)
        labels, classes = np.array(found, dtype=np.int64), len(names)
    else:
        raise ValueError(f"unknown dataset format {fmt!r}")
    if len(samples) < 4:
        raise ValueError(f"dataset {definition['dataset']!r} has {len(samples)} samples: too few to train on")
    rows = np.random.default_rng(seed_of("split", definition["dataset"])).permutation(len(samples))
    test_count = max(1, int(round(len(samples) * fraction)))
    return Raw(samples, labels, np.sort(rows[test_count:]), np.sort(rows[:test_count]), classes)


# -- one sample -------------------------------------------------------------------------------------------------
def decode(sample: Any, channels: int) -> Image.Image:
    if isinstance(sample, bytes | bytearray | memoryview):
        image = Image.open(io.BytesIO(bytes(sample)))
        image.load()
    else:
        array = np.asarray(sample)
        image = Image.fromarray(array.squeeze(-1) if array.ndim == 3 and array.shape[-1] == 1 else array)
    return image.convert("RGB" if channels == 3 else "L")


def augment(image: Image.Image, size: int, params: dict[str, Any] | None, rng: np.random.Generator) -> Image.Image:
    """Random resized crop, flip, rotation, colour jitter and blur, drawn from ``rng``; ``size`` x ``size`` out.

    As in the usual ImageNet-style recipe, the crop is resized to a working resolution (three times ``size``, at most
    the raw image's) where the photometric and geometric operations run, then brought down to ``size`` with an
    antialiasing filter."""
    if params is None:
        return image.resize((size, size), Image.BILINEAR)
    width, height = image.size
    work = max(size, min(3 * size, width, height))
    low, high = params["crop"]
    area = width * height * rng.uniform(low, high)
    ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    w = int(round(min(width, math.sqrt(area * ratio))))
    h = int(round(min(height, math.sqrt(area / ratio))))
    x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
    image = image.resize((work, work), Image.BICUBIC, box=(x, y, x + w, y + h))
    if params["flip"] and rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    if params["rotate"] > 0:
        image = image.rotate(float(rng.uniform(-params["rotate"], params["rotate"])), Image.BICUBIC)
    jitter = params["jitter"]
    if jitter > 0:
        for enhancer in (ImageEnhance.Brightness, ImageEnhance.Contrast) + (
                (ImageEnhance.Color, ImageEnhance.Sharpness) if image.mode == "RGB" else ()):
            image = enhancer(image).enhance(float(rng.uniform(1 - jitter, 1 + jitter)))
    if params["blur"] > 0 and rng.random() < params["blur"]:
        image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.3, 1.5))))
    return image.resize((size, size), Image.LANCZOS) if work != size else image


def preprocess(sample: Any, definition: dict[str, Any], variant: int, index: int) -> np.ndarray:
    """Sample ``index`` of ``variant`` (TEST_VARIANT: no augmentation) as uint8 ``[channels, size, size]``."""
    channels, size = int(definition["channels"]), int(definition["size"])
    image = decode(sample, channels)
    params = None if variant == TEST_VARIANT else definition.get("augment")
    rng = np.random.default_rng(seed_of(pipeline_id(definition), variant, index))
    array = np.asarray(augment(image, size, params, rng), dtype=np.uint8)
    return array.reshape(size, size, channels).transpose(2, 0, 1)


def _chunk(args: tuple[list[Any], list[int], dict[str, Any], int]) -> tuple[np.ndarray, float]:
    samples, indexes, definition, variant = args
    began = time.process_time()
    out = np.stack([preprocess(s, definition, variant, i) for s, i in zip(samples, indexes, strict=True)])
    return out, time.process_time() - began


class Progress:
    """How far a running build is: chunks done of all, CPU seconds the workers spent so far."""

    def __init__(self, chunks: int):
        self.chunks, self.done, self.cpu_seconds, self.started = chunks, 0, 0.0, time.perf_counter()

    @property
    def fraction(self) -> float:
        return self.done / max(self.chunks, 1)


def build_variant(raw: Raw, definition: dict[str, Any], variant: int, pool: ProcessPoolExecutor | None,
                  workers: int, progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Preprocess every training sample (or, for TEST_VARIANT, every held-out one) for ``variant``.

    Returns ``{"x", "y", "cpu"}``: the tensors and the CPU seconds the workers spent (a 1-element float64
    array, so it is cached with the entry)."""
    rows = raw.test if variant == TEST_VARIANT else raw.train
    chunks = max(1, min(len(rows), max(workers, 1) * CHUNKS_PER_WORKER))
    bounds = np.linspace(0, len(rows), chunks + 1).astype(int)
    jobs = [([raw.samples[i] for i in rows[a:b].tolist()], rows[a:b].tolist(), definition, variant)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
    progress = progress or Progress(len(jobs))
    progress.chunks = len(jobs)
    parts = []
    results = pool.map(_chunk, jobs) if pool is not None else map(_chunk, jobs)
    for array, cpu in results:
        parts.append(array)
        progress.done += 1
        progress.cpu_seconds += cpu
    return {"x": np.concatenate(parts), "y": raw.labels[rows].astype(np.int64),
            "cpu": np.array([progress.cpu_seconds], dtype=np.float64)}


def worker_pool(workers: int) -> ProcessPoolExecutor | None:
    """``workers`` loader processes (spawned: safe beside torch's threads), or None for 0 (work in-process)."""
    if workers <= 0:
        return None
    import multiprocessing

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from components.runtime.contract.services import set_parent_death_signal

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=set_parent_death_signal)
