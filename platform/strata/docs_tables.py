"""The docs' generated tables: lists the code holds, written into the pages between marker comments.

A page holds a table between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``; :func:`rewrite`
replaces what lies between them with :data:`TABLES` ``[NAME]()``, rendered from the code at run time:

- ``seams``: the plugin manifest's seams (the metadata of :class:`components.runtime.contract.plugins.Plugin`'s fields);
- ``plugins``: the built-in plugins the registry loaded and what each contributes;
- ``routes``: the API's routes, from Django's URL resolver (path, name, methods, the view's docstring);
- ``settings``: every ``STRATA_*`` variable ``settings.py`` (and ``conf.py``) reads, with its reader, default and
  the comment beside it;
- ``cli``: the ``strata`` verbs, from the CLI's argparse parser.

Nothing here names a plugin: the tables list whatever the registry holds. Plugins from outside packages are
left out of the pages (they differ per installation); only the built-in list's are written.

``python -m strata.docs_tables`` (``make docs``) rewrites the pages; ``--check`` only says which are stale
(exit 1). ``tests/test_docs_tables.py`` does the same check.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(__file__).resolve().parent
PAGES = ("README.md", "docs")
REGENERATE = "make docs (or: .venv/bin/python -m strata.docs_tables)"
MARKER = re.compile(r"(<!-- generated:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def _cell(text: object) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _first_line(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    if not doc or not doc.strip():
        return ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s+[A-Z(`]|$)", paragraph)
    return match.group(1) if match else paragraph


# --- plugins -------------------------------------------------------------------------------------------------


def seams_table() -> str:
    from components.runtime.contract.plugins import SEAMS

    shapes = {"paths": "paths", "mapping": "`{name: path}`", "path": "one path"}
    rows = []
    for row in SEAMS:
        light = row.light if isinstance(row.light, str) else ("yes" if row.light else "no")
        joined = row.combine + (f" (names: {row.named})" if row.named else "")
        suite = f"`{row.suite.rpartition('.')[2]}`" if row.suite else "—"
        rows.append((f"`{row.name}`", shapes[row.shape], row.points_at, light, row.read_by, joined, suite))
    return _table(("seam", "shape", "the path points at", "light?", "who imports it", "joined", "conformance suite"),
                  rows)


def _builtin_plugins():
    from components.runtime.contract import registry

    return [loaded for loaded in registry.plugins().values() if loaded.source in registry.BUILTIN_PLUGINS]


def plugins_table() -> str:
    from components.runtime.contract.plugins import seams

    rows = []
    for loaded in _builtin_plugins():
        plugin = loaded.plugin
        uses = []
        for seam, _ in seams():
            value = getattr(plugin, seam)
            if not value or seam == "kinds":
                continue
            if isinstance(value, str):
                uses.append(f"`{seam}`")
            elif seam == "commands":
                uses.append("`commands`: " + ", ".join(f"`strata {name}`" for name in loaded.commands))
            elif seam == "strategies":
                uses.append("`strategies`: " + ", ".join(f"`{name}`" for name in loaded.strategies))
            elif isinstance(value, tuple | list):
                uses.append(f"`{seam}` ({len(value)})")
            else:
                uses.append(f"`{seam}`: " + ", ".join(f"`{name}`" for name in value))
        kinds = ", ".join(f"`{kind}`" for kind in loaded.kinds) or "—"
        requires = ", ".join(f"`{requirement}`" for requirement in plugin.requires) or "—"
        rows.append((f"`{plugin.name}`", plugin.version, requires, kinds, "; ".join(uses), plugin.description))
    return _table(("plugin", "version", "requires", "job kinds", "other seams it uses", "what it is"), rows)


# --- routes --------------------------------------------------------------------------------------------------

_METHODS = ("get", "post", "put", "patch", "delete")


def _django():
    import django
    from django.conf import settings

    if not settings.configured:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
        django.setup()


def _walk(patterns, prefix: str = ""):
    from django.urls import URLResolver

    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern


def _route_path(raw: str) -> str:
    text = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", raw)
    text = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", text)
    return "/" + text.replace("^", "").replace("$", "")


def _function_methods(function) -> list[str]:
    """A function view's methods where a decorator (require_http_methods, require_safe, ...) keeps them."""
    for cell in getattr(function, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, list | tuple) and value and all(isinstance(item, str) and item.isupper()
                                                             for item in value):
            return [item for item in value if item != "HEAD"]
    return []


def _view_facts(callback) -> tuple[list[str], str]:
    actions = getattr(callback, "actions", None)
    view = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if actions and view is not None:
        methods = [method.upper() for method in actions]
        docs = [_first_line(getattr(view, action).__doc__) for action in actions.values()]
        return methods, next((doc for doc in docs if doc), "") or _first_line(view.__doc__)
    if view is not None:
        methods = [method.upper() for method in _METHODS if hasattr(view, method)]
        return methods, _first_line(view.__doc__)
    function = getattr(callback, "__wrapped__", callback)
    return _function_methods(callback) or ["any"], _first_line(function.__doc__)


def routes_table() -> str:
    """The API's routes (under /api/v1/) and the probes at the root, as Django resolves them."""
    _django()
    from django.urls import get_resolver

    rows, seen = [], set()
    for raw, pattern in _walk(get_resolver().url_patterns):
        if "(?P<format>" in raw or not (raw.startswith("api/v1/") or ("/" not in raw and raw)):
            continue
        path = _route_path(raw)
        if path in seen or "{format}" in path:
            continue
        seen.add(path)
        methods, doc = _view_facts(pattern.callback)
        rows.append((f"`{path}`", pattern.name or "", " ".join(methods), doc))
    return _table(("path", "name", "methods", "what (the view's docstring)"), rows)


# --- settings ------------------------------------------------------------------------------------------------

_READERS = {"env_str": "text", "env_bool": "boolean", "env_int": "integer", "env_float": "number",
            "env_list": "comma-separated list"}
SETTINGS_FILES = ("settings.py", "conf.py")


def _comments(source: str) -> dict[int, str]:
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def _comment_above(lines: list[str], line: int) -> str:
    """The comment lines right above ``line`` (a section header ``# --- ...`` ends them)."""
    block, number = [], line - 1
    while number >= 1 and lines[number - 1].lstrip().startswith("#"):
        text = lines[number - 1].strip().lstrip("#").strip()
        if text.startswith("---"):
            break
        block.insert(0, text)
        number -= 1
    return " ".join(block)


def settings_rows(path: Path) -> list[tuple[str, str, str, str]]:
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    inline = _comments(source)
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]
    rows = []
    for call in sorted((node for node in ast.walk(tree) if isinstance(node, ast.Call)),
                       key=lambda node: (node.lineno, node.col_offset)):
        if not (isinstance(call.func, ast.Name) and call.func.id in _READERS and call.args
                and isinstance(call.args[0], ast.Constant) and str(call.args[0].value).startswith("STRATA_")):
            continue
        reader = _READERS[call.func.id]
        keywords = {keyword.arg: keyword.value for keyword in call.keywords}
        minimum = keywords.get("minimum")
        if minimum is not None:
            reader += f", ≥ {ast.get_source_segment(source, minimum)}"
        default = call.args[1] if len(call.args) > 1 else keywords.get("default")
        default_text = "unset" if default is None else ast.get_source_segment(source, default)
        statement = min((node for node in statements
                         if node.lineno <= call.lineno <= node.end_lineno and not isinstance(
                             node, ast.FunctionDef | ast.If | ast.ClassDef)),
                        key=lambda node: node.end_lineno - node.lineno, default=None)
        about = _comment_above(lines, call.lineno)
        if not about and statement is not None:
            about = _comment_above(lines, statement.lineno)
        trailing = [inline[number] for number in range(call.lineno, call.end_lineno + 1)
                    if number in inline and not lines[number - 1].lstrip().startswith("#")]
        about = " ".join([about, *trailing]).strip()
        rows.append((call.args[0].value, reader, default_text, about))
    return rows


def settings_table() -> str:
    rows, seen = [], set()
    for name in SETTINGS_FILES:
        for variable, reader, default, about in settings_rows(PACKAGE / name):
            if variable in seen:
                continue
            seen.add(variable)
            rows.append((f"`{variable}`", reader, f"`{default}`" if default != "unset" else default, about))
    return _table(("variable", "type", "default", "about (the comment in settings.py)"), rows)


# --- CLI -----------------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                yield name, helps.get(name, ""), subparser


def cli_table() -> str:
    from components.runtime.contract import registry
    from strata.cli.main import build_parser

    owners = {name: loaded.name for loaded in registry.plugins().values() for name in loaded.commands}
    builtin = {loaded.name for loaded in _builtin_plugins()}
    rows = []
    for name, about, subparser in _subcommands(build_parser()):
        owner = owners.get(name)
        if owner is not None and owner not in builtin:
            continue
        rows.append((f"`strata {name}`", about, f"plugin `{owner}`" if owner else "core"))
        for child, child_about, _ in _subcommands(subparser):
            rows.append((f"`strata {name} {child}`", child_about, f"plugin `{owner}`" if owner else "core"))
    return _table(("verb", "what (its help)", "from"), rows)


TABLES: dict[str, Callable[[], str]] = {
    "seams": seams_table,
    "plugins": plugins_table,
    "routes": routes_table,
    "settings": settings_table,
    "cli": cli_table,
}


# --- the pages -----------------------------------------------------------------------------------------------


def pages(root: Path = ROOT) -> list[Path]:
    found = []
    for name in PAGES:
        path = root / name
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return [path for path in found if path.is_file()]


def rewrite(text: str, tables: dict[str, str]) -> str:
    """``text`` with every marked table replaced by its rendering; an unknown name is an error."""

    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in tables:
            raise KeyError(f"no generated table named {name!r} (known: {', '.join(sorted(tables))})")
        return match.group(1) + "\n" + tables[name] + "\n" + match.group(4)

    return MARKER.sub(replace, text)


def render_all() -> dict[str, str]:
    return {name: render() for name, render in TABLES.items()}


def stale_pages(root: Path = ROOT) -> list[Path]:
    """The pages whose generated tables differ from the code's."""
    tables = render_all()
    return [path for path in pages(root) if rewrite(text := path.read_text(), tables) != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata.docs_tables", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    tables = render_all()
    stale = []
    for path in pages():
        text = path.read_text()
        new = rewrite(text, tables)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    verb = "stale" if args.check else "rewrote"
    for path in stale:
        print(f"{verb}: {path.relative_to(ROOT)}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
