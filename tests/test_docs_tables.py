"""The docs' generated tables (strata.docs_tables) match the code: seams, built-in plugins, routes, settings, verbs."""

from __future__ import annotations

import pytest

from strata import docs_tables

REGENERATE = f"the docs' generated tables are stale: run {docs_tables.REGENERATE}"


@pytest.fixture(scope="module")
def tables():
    return docs_tables.render_all()


def test_every_page_matches_the_code(tables):
    stale = [str(path.relative_to(docs_tables.ROOT)) for path in docs_tables.pages()
             if docs_tables.rewrite(text := path.read_text(), tables) != text]
    assert not stale, f"{REGENERATE} (stale: {', '.join(stale)})"


def test_every_table_is_on_a_page():
    text = "".join(path.read_text() for path in docs_tables.pages())
    missing = [name for name in docs_tables.TABLES if f"<!-- generated:{name} -->" not in text]
    assert not missing, f"no page holds the generated tables {missing}"


def test_the_tables_list_what_the_code_holds(tables):
    from components.runtime import registry
    from components.runtime.plugins import seams

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
