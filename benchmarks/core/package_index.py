"""A PEP 503 package index on loopback that offers pure-Python wheels built on the spot: what a project's
``requirements.txt`` installs from in ``strata bench byo`` and the tests, so neither reaches past 127.0.0.1.
Standard library only."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def build_wheel(directory: Path, name: str, version: str, modules: dict[str, str]) -> Path:
    """A pure-Python wheel of distribution ``name`` holding ``modules`` ({"pkg/__init__.py": source})."""
    import base64
    import hashlib
    import zipfile

    project = name.replace("-", "_")
    info = f"{project}-{version}.dist-info"
    files = dict(modules)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: strata-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = Path(directory) / f"{project}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@contextlib.contextmanager
def package_index(root: Path, packages: dict[str, dict[str, str]]) -> Iterator[str]:
    """A PEP 503 simple index on 127.0.0.1 with one wheel per package ({name: modules}); yields its URL.
    Version 1.0.0 of each."""
    import functools
    import http.server
    import threading

    simple = Path(root) / "simple"
    links = []
    for name, modules in packages.items():
        folder = simple / name
        folder.mkdir(parents=True, exist_ok=True)
        wheel = build_wheel(folder, name, "1.0.0", modules)
        (folder / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
        links.append(f'<a href="{name}/">{name}</a>')
    (simple / "index.html").write_text("\n".join(links) + "\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def index_environment(url: str) -> dict[str, str]:
    """What makes pip (and uv) install from ``url`` only: no other index, no links, no constraints file."""
    return {"PIP_INDEX_URL": url, "UV_INDEX_URL": url, "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
            "PIP_CONSTRAINT": "", "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_CACHE_DIR": "1"}
