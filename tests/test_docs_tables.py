"""The docs' generated tables (strata.docs_tables) match the code: seams, built-in plugins, routes, settings, verbs."""

from __future__ import annotations

import pytest

from strata import docs_tables

REGENERATE = f"the docs' generated tables are stale: run {docs_tables.REGENERATE}"


@pytest.fixture(scope="module")
def tables():
    """The tables as ``make docs`` renders them: in a fresh interpreter, so what earlier tests of this process did
    to the URL resolver or the plugin registry cannot show in them."""
    import json
    import subprocess
    import sys

    rendered = subprocess.run([sys.executable, "-c", "import json; from strata import docs_tables; "
                               "print(json.dumps(docs_tables.render_all()))"],
                              capture_output=True, text=True, timeout=300, cwd=docs_tables.ROOT)
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    return json.loads(rendered.stdout.strip().splitlines()[-1])


def test_every_page_matches_the_code(tables):
    stale = [str(path.relative_to(docs_tables.ROOT)) for path in docs_tables.pages()
             if docs_tables.rewrite(text := path.read_text(), tables) != text]
    assert not stale, f"{REGENERATE} (stale: {', '.join(stale)})"


def test_every_table_is_on_a_page():
    text = "".join(path.read_text() for path in docs_tables.pages())
    missing = [name for name in docs_tables.TABLES if f"<!-- generated:{name} -->" not in text]
    assert not missing, f"no page holds the generated tables {missing}"


def test_the_tables_list_what_the_code_holds(tables):
    from components.runtime.contract import registry
    from components.runtime.contract.plugins import seams

    assert all(f"`{seam}`" in tables["seams"] for seam, _ in seams())
    builtin = [loaded.name for loaded in registry.plugins().values() if loaded.source in registry.BUILTIN_PLUGINS]
    assert builtin and all(f"| `{name}` |" in tables["plugins"] for name in builtin)
    assert "| `/api/v1/jobs/` | job-list | GET POST |" in tables["routes"]
    assert "| `STRATA_DATABASE_URL` | text | unset |" in tables["settings"]
    assert "| `strata submit` |" in tables["cli"] and "| `strata token create` |" in tables["cli"]


def test_a_stale_table_is_rewritten_and_an_unknown_one_refused():
    page = "before\n<!-- generated:cli -->\nold\n<!-- /generated:cli -->\nafter\n"
    new = docs_tables.rewrite(page, {"cli": "| new |\n"})
    assert new == "before\n<!-- generated:cli -->\n\n| new |\n\n<!-- /generated:cli -->\nafter\n"
    assert docs_tables.rewrite(new, {"cli": "| new |\n"}) == new
    with pytest.raises(KeyError, match="nope"):
        docs_tables.rewrite("<!-- generated:nope -->\n<!-- /generated:nope -->", {})


def _api_routes() -> dict[str, set[str]]:
    """``{path with {} for each parameter, relative to /api/v1: methods}`` from the URL resolver."""
    import re

    from django.urls import get_resolver

    routes: dict[str, set[str]] = {}
    for raw, pattern in docs_tables._walk(get_resolver().url_patterns):
        path = docs_tables._route_path(raw)
        if path.startswith("/api/v1/"):
            key = re.sub(r"\{[^}]*\}", "{}", path[len("/api/v1"):])
            routes.setdefault(key, set()).update(docs_tables._view_facts(pattern.callback)[0])
    return routes


def _documented_operations() -> list[tuple[str, list[str], str]]:
    """Every ``METHOD /path/`` the hand-written tables of docs/api.md name: ``(as written, methods, key)``."""
    import re

    text = (docs_tables.ROOT / "docs" / "api.md").read_text().split("## Route index")[0]
    found = []
    for row in re.finditer(r"^\| `([^|]*?)` \|", text, re.M):
        for part in re.split(r"`(?:,| and) `", row.group(1)):
            match = re.match(r"((?:GET|POST|PUT|PATCH|DELETE)(?:/(?:GET|POST|PUT|PATCH|DELETE))*) (/\S*)", part)
            if match:
                key = re.sub(r"\{[^}]*\}", "{}", match.group(2).split("?")[0])
                found.append((part, match.group(1).split("/"), key))
    return found


def test_every_operation_api_md_documents_is_served():
    routes = _api_routes()
    operations = _documented_operations()
    wrong = []
    for written, methods, key in operations:
        # A plugin's collection (/datasets/...) is served by the generic /{collection}/ routes.
        served = routes.get(key) or routes.get("/{}/" + key.split("/", 2)[2] if key.count("/") > 1 else key)
        if not served:
            wrong.append(f"{written}: no such route")
        elif set(methods) - served:
            wrong.append(f"{written}: the route answers {' '.join(sorted(served))}")
    assert len(operations) > 50 and not wrong, "docs/api.md names operations the API does not serve:\n" + "\n".join(
        wrong)
