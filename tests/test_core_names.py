"""The core names no plugin: the check docs/architecture.md and docs/plugins.md state.

In every .py, .html, .js and .css file under platform/, dashboard/ and components/runtime/, except database
migrations (history) and the BUILTIN_PLUGINS tuple of components/runtime/contract/registry.py, the case-sensitive regular
expression ``\\b(NAMES)\\b`` matches nothing, where NAMES are the built-in plugins' names and job kinds (today
``train|serve|serving|gpushare|tune|tuning``): a new built-in plugin is covered by the check as soon as it is
listed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ("platform", "dashboard", "components/runtime")
SUFFIXES = {".py", ".html", ".js", ".css"}


def _builtin_names() -> list[str]:
    from components.runtime.contract import registry

    names = set()
    for loaded in registry.plugins().values():
        if loaded.source in registry.BUILTIN_PLUGINS:
            names.add(loaded.name)
            names.update(loaded.kinds)
    return sorted(names)


NAMES = re.compile(r"\b(" + "|".join(map(re.escape, _builtin_names())) + r")\b")
BUILTINS = re.compile(r"^BUILTIN_PLUGINS\b.*?^\)", re.S | re.M)


def core_files():
    for top in CORE:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in SUFFIXES and "migrations" not in path.parts and path.is_file():
                yield path


def test_the_core_names_no_plugin():
    found = []
    for path in core_files():
        text = path.read_text(errors="replace")
        if path == ROOT / "components" / "runtime" / "contract" / "registry.py":
            text = BUILTINS.sub(lambda match: "\n" * match.group(0).count("\n"), text)
        for number, line in enumerate(text.splitlines(), 1):
            if NAMES.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "the core names a plugin:\n" + "\n".join(found)


def test_the_check_sees_the_core_and_the_builtin_list():
    assert {"train", "serve", "serving", "gpushare", "tune", "tuning"} <= set(_builtin_names())
    files = list(core_files())
    assert ROOT / "components" / "runtime" / "node" / "agent.py" in files
    assert any(path.suffix == ".html" for path in files) and any(path.suffix == ".js" for path in files)
    registry = (ROOT / "components" / "runtime" / "contract" / "registry.py").read_text()
    assert NAMES.search(BUILTINS.search(registry).group(0))  # the one place that names them, and only there
