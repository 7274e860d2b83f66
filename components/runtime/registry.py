"""The lazy, frozen registry of job kinds.

Built-in kinds are listed here; outside packages add kinds through the ``strata.components`` entry-point
group, whose values point at :class:`~components.runtime.spec.KindSpec` subclasses. The registry is read once,
checked (unique kinds, well-formed component paths) and then frozen.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points

from components.runtime.spec import KindSpec

BUILTIN_KINDS: dict[str, str] = {
    "train": "components.train.spec:TrainSpec",
    "serve": "components.serving.spec:ServeSpec",
}

_lock = threading.Lock()
_kinds: dict[str, KindSpec] | None = None


class UnknownKind(LookupError):
    def __init__(self, kind: str, known: list[str]):
        self.kind = kind
        self.known = known
        super().__init__(f"unknown job kind {kind!r}; known kinds: {', '.join(known)}")


def import_path(path: str):
    """Import ``"package.module:attribute"``."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ImportError(f"{path!r} is not of the form 'package.module:attribute'")
    return getattr(importlib.import_module(module_name), attribute)


def _load() -> dict[str, KindSpec]:
    paths = dict(BUILTIN_KINDS)
    for entry in entry_points(group="strata.components"):
        if entry.name in paths:
            raise RuntimeError(f"job kind {entry.name!r} is registered twice")
        paths[entry.name] = entry.value
    kinds: dict[str, KindSpec] = {}
    for kind, path in paths.items():
        spec_class = import_path(path)
        if not (isinstance(spec_class, type) and issubclass(spec_class, KindSpec)):
            raise TypeError(f"{path} is not a KindSpec subclass")
        if spec_class.kind != kind:
            raise RuntimeError(f"{path} declares kind {spec_class.kind!r} but is registered as {kind!r}")
        if ":" not in spec_class.component:
            raise RuntimeError(f"{path}.component must be 'module:Class', got {spec_class.component!r}")
        kinds[kind] = spec_class()
    return kinds


def kinds() -> dict[str, KindSpec]:
    """All registered kinds; loaded on first call, then frozen."""
    global _kinds
    if _kinds is None:
        with _lock:
            if _kinds is None:
                _kinds = _load()
    return _kinds


def get_kind(kind: str) -> KindSpec:
    registered = kinds()
    if kind not in registered:
        raise UnknownKind(kind, sorted(registered))
    return registered[kind]


def panels(placement: str) -> list[tuple[str, str, type | None, str | None]]:
    """``(kind, path, Panel class, None)`` for every panel the registered kinds contribute to ``placement``
    ("job" or "cluster"), and ``(kind, path, None, error)`` for a panel that could not be loaded, whatever its
    placement: one broken component must cost its own panel, never the page."""
    from components.runtime.panels import Panel

    found = []
    for kind, spec in kinds().items():
        for path in spec.panels:
            try:
                panel_class = import_path(path)
                if not (isinstance(panel_class, type) and issubclass(panel_class, Panel)):
                    raise TypeError(f"{path} is not a Panel subclass")
            except Exception as error:  # noqa: BLE001 - any import-time failure of third-party code
                found.append((kind, path, None, f"{type(error).__name__}: {error}"))
                continue
            if panel_class.placement == placement:
                found.append((kind, path, panel_class, None))
    return found


def load_component(kind: str):
    """Import and instantiate the heavy component class of ``kind`` (on a node only)."""
    return import_path(get_kind(kind).component)()
