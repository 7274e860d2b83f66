"""Artifact storage: a small interface, with local disk as the default implementation."""

from __future__ import annotations

import abc
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.utils.module_loading import import_string


class ArtifactStorage(abc.ABC):
    """Stores artifact bytes under opaque keys. Implementations must make ``save`` atomic per key."""

    @abc.abstractmethod
    def save(self, key: str, source: BinaryIO, max_bytes: int) -> tuple[int, str]:
        """Store ``source`` under ``key``; return (size, sha256). Raise ``ValueError`` past ``max_bytes``."""

    @abc.abstractmethod
    def open(self, key: str) -> BinaryIO: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...


class LocalArtifactStorage(ArtifactStorage):
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root or settings.STRATA_ARTIFACT_ROOT)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"artifact key {key!r} escapes the storage root")
        return path

    def save(self, key: str, source: BinaryIO, max_bytes: int) -> tuple[int, str]:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as target:
            try:
                while chunk := source.read(1 << 20):
                    size += len(chunk)
                    if size > max_bytes:
                        raise ValueError(f"artifact is larger than the {max_bytes} byte limit")
                    digest.update(chunk)
                    target.write(chunk)
            except BaseException:
                os.unlink(target.name)
                raise
        os.replace(target.name, path)
        return size, digest.hexdigest()

    def open(self, key: str) -> BinaryIO:
        return self._path(key).open("rb")

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def get_storage() -> ArtifactStorage:
    return import_string(settings.STRATA_ARTIFACT_STORAGE)()
