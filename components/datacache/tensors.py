"""Whole prepared tensors in the node cache: what ``prepare(recipe, build, data)`` gives the workloads that do
not stream epochs (mlp-digits, cnn-synthetic, tiny-gpt...) when their job asks for ``data: {cache: true}``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from components.datacache.store import CacheStore

log = logging.getLogger("strata.datacache")
STRUCTURE = "__structure__"


def _flatten(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, torch.Tensor):
        name = str(len(arrays))
        arrays[name] = value.detach().cpu().contiguous().numpy()
        return {"tensor": name}
    if isinstance(value, tuple | list):
        return {"tuple" if isinstance(value, tuple) else "list": [_flatten(item, arrays) for item in value]}
    raise TypeError(f"cannot cache a {type(value).__name__}: only tensors, tuples and lists of them")


def _rebuild(shape: Any, arrays: dict[str, np.ndarray]) -> Any:
    if "tensor" in shape:
        return torch.from_numpy(np.asarray(arrays[shape["tensor"]]))
    items = [_rebuild(item, arrays) for item in shape.get("tuple", shape.get("list", []))]
    return tuple(items) if "tuple" in shape else items


def cached_prepare(key: str, recipe: dict[str, Any], build: Callable[[], Any], store: CacheStore | None = None) -> Any:
    """The prepared data of ``recipe`` from the node cache (built once node-wide), or None when it cannot be
    cached (then the caller builds it the usual way)."""
    store = store or CacheStore()
    built: dict[str, Any] = {}

    def arrays() -> dict[str, np.ndarray]:
        value = build()
        built["value"] = value
        found: dict[str, np.ndarray] = {}
        shape = _flatten(value, found)
        found[STRUCTURE] = np.frombuffer(json.dumps(shape).encode(), dtype=np.uint8).copy()
        return found

    try:
        stored, _ = store.get(key, arrays, {"dataset": str(recipe.get("dataset", "")), "pipeline": key[:16],
                                            "part": "prepared"})
    except TypeError as error:
        log.info("not caching %s: %s", key[:12], error)
        return built.get("value")
    if "value" in built:
        return built["value"]
    return _rebuild(json.loads(np.asarray(stored[STRUCTURE]).tobytes()), stored)
